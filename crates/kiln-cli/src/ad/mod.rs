//! `kiln ad train` and `kiln ad eval`: Algorithm Distillation on Dark Room.

mod metrics;
mod progress;

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use kiln_ad::checkpoint;
use kiln_ad::config::AdConfig;
use kiln_ad::goals::GoalSplit;
use kiln_ad::run::{RunOptions, Seconds, evaluate_held_out};
use kiln_core::strategy::StrategyKind;
use kiln_kernels::KernelBackend;

use crate::backend::{BackendKind, DeviceList, Job, Placement, dispatch, parse_devices};
use crate::config_file;
use crate::names::strategy_parser;
use crate::optimizer_args::OptimizerArgs;
use crate::pipeline_args::PipelineArgs;
use metrics::{DataSummary, Metrics, write_outputs};
use progress::Bars;

/// The `kiln ad` commands.
#[derive(clap::Subcommand, Debug)]
pub enum AdCommand {
    /// Generate learning histories, train the AD transformer, save it, and evaluate it.
    Train(TrainArgs),
    /// Evaluate a saved run on its held-out goals.
    Eval(EvalArgs),
}

/// Flags of `kiln ad train`; each overrides the same field of `--config`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// TOML config to start from (tables: env, goals, source, model, train, parallel, optimizer,
    /// eval).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Parallelism strategy [default: auto].
    #[arg(long, value_parser = strategy_parser())]
    strategy: Option<StrategyKind>,
    #[command(flatten)]
    pipeline: PipelineArgs,
    #[command(flatten)]
    optimizer: OptimizerArgs,
    /// Ranks (devices; CPU ranks share the CPU) [default: 1, or the length of --devices].
    #[arg(long)]
    world: Option<usize>,
    /// Device of each rank, e.g. `0,0` for two ranks on GPU 0 or `0,1` for two GPUs
    /// [default: CPU ranks share the CPU, CUDA ranks take GPUs 0..world].
    #[arg(long, value_parser = parse_devices)]
    devices: Option<DeviceList>,
    /// Backend [default: flex].
    #[arg(long, value_enum, default_value_t)]
    backend: BackendKind,
    /// Optimizer steps [default: 4000].
    #[arg(long)]
    steps: Option<usize>,
    /// Windows per step, all ranks together [default: 32].
    #[arg(long)]
    batch: Option<usize>,
    /// Peak learning rate [default: 0.001].
    #[arg(long)]
    lr: Option<f64>,
    /// Seed of data, model, sample order and evaluation [default: 42].
    #[arg(long)]
    seed: Option<u64>,
    /// Intra-op threads per rank (default: cores shared evenly).
    #[arg(long)]
    threads_per_rank: Option<usize>,
    /// Folder for the run: config.toml, model.mpk, metrics.json, returns.svg.
    #[arg(long, default_value = "runs/ad")]
    out: PathBuf,
    /// Also write the metrics JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the plot here instead of `<out>/returns.svg`.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Skip the evaluation (train and save only).
    #[arg(long)]
    no_eval: bool,
}

/// Flags of `kiln ad eval`.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// Folder of a run written by `kiln ad train`.
    #[arg(long, default_value = "runs/ad")]
    run: PathBuf,
    /// Consecutive episodes per goal and seed (default: the run's config).
    #[arg(long)]
    episodes: Option<usize>,
    /// Runs per held-out goal (default: the run's config).
    #[arg(long)]
    seeds: Option<usize>,
    /// Backend [default: flex].
    #[arg(long, value_enum, default_value_t)]
    backend: BackendKind,
    /// Also write the metrics JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the plot here instead of `<run>/returns.svg`.
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// Runs a `kiln ad` command.
///
/// # Errors
/// Invalid flags or config, or a failure of the run.
pub fn run(command: AdCommand) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        AdCommand::Train(args) => {
            let config = args.config()?;
            let devices = args.devices.as_ref().map(|DeviceList(d)| d.as_slice());
            let placement = Placement::new(config.train.world, devices)?;
            dispatch(args.backend, &placement, TrainJob { args, config })
        }
        AdCommand::Eval(args) => dispatch(args.backend, &Placement::Ranks(1), EvalJob(args)),
    }
}

impl TrainArgs {
    fn config(&self) -> Result<AdConfig, Box<dyn std::error::Error>> {
        let mut c: AdConfig = match &self.config {
            Some(path) => config_file::load(path)?,
            None => AdConfig::default(),
        };
        macro_rules! set {
            ($($flag:ident => $($field:ident).+),* $(,)?) => {$(
                if let Some(v) = self.$flag { c.$($field).+ = v; }
            )*};
        }
        set!(strategy => train.strategy, world => train.world, steps => train.steps,
             batch => train.batch, lr => train.lr, seed => seed);
        self.optimizer.apply(&mut c.optimizer);
        let world_given = self.world.is_some() || self.devices.is_some();
        let before = c.train.world;
        c.train.world = self.pipeline.apply(
            &mut c.parallel.pipeline,
            c.train.strategy,
            c.train.world,
            world_given,
        );
        let named = world_given
            || c.train.world != before
            || self
                .config
                .as_deref()
                .is_some_and(|path| config_file::names(path, &["train", "world"]));
        let threads = self.threads_per_rank.or(c.parallel.ddp.threads_per_rank);
        c.train.world = self.backend.default_world(
            c.train.strategy,
            c.train.world,
            named,
            c.train.batch,
            threads,
        );
        if let Some(DeviceList(devices)) = &self.devices {
            // The list names the ranks; an explicit --world must agree (checked by Placement).
            c.train.world = self.world.unwrap_or(devices.len());
        }
        if let Some(t) = self.threads_per_rank {
            c.parallel.set_threads_per_rank(t);
        }
        c.validate()?;
        Ok(c)
    }
}

struct TrainJob {
    args: TrainArgs,
    config: AdConfig,
}

impl Job for TrainJob {
    type Output = ();

    fn run<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (args, config) = (self.args, self.config);
        let options = RunOptions {
            save_to: Some(&args.out),
            no_eval: args.no_eval,
        };
        let mut bars = Bars::new(config.train.steps);
        let done = kiln_ad::run::run::<B>(&config, devices, options, &mut bars)?;
        let metrics = Metrics {
            config: &config,
            backend: args.backend.to_string(),
            data: Some(DataSummary::new(&done.data)),
            train: Some(done.train),
            eval: done.eval,
            seconds: done.seconds,
        };
        write_outputs(
            &metrics,
            &args.out,
            args.json.as_deref(),
            args.svg.as_deref(),
        )
    }
}

struct EvalJob(EvalArgs);

impl Job for EvalJob {
    type Output = ();

    fn run<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let args = self.0;
        let start = Instant::now();
        let device = devices[0].clone();
        let (mut config, model) = checkpoint::load::<B::InnerBackend>(&args.run, &device)?;
        if let Some(e) = args.episodes {
            config.eval.episodes = e;
        }
        if let Some(s) = args.seeds {
            config.eval.seeds = s;
        }
        config.validate()?;
        let goals = GoalSplit::new(&config.env, &config.goals)?;
        let mut bars = Bars::new(0);
        let (report, eval_s) = evaluate_held_out(&model, &config, &goals, &device, &mut bars);
        let metrics = Metrics {
            config: &config,
            backend: args.backend.to_string(),
            data: None,
            train: None,
            eval: Some(report),
            seconds: Seconds {
                eval: eval_s,
                total: start.elapsed().as_secs_f64(),
                ..Seconds::default()
            },
        };
        write_outputs(
            &metrics,
            &args.run,
            args.json.as_deref(),
            args.svg.as_deref(),
        )
    }
}
