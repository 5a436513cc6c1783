//! `kiln ad train` and `kiln ad eval`: Algorithm Distillation on Dark Room.

mod metrics;
mod progress;

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use kiln_ad::AdError;
use kiln_ad::checkpoint;
use kiln_ad::config::AdConfig;
use kiln_ad::goals::GoalSplit;
use kiln_ad::run::{Auto, Measure, RunOptions, Seconds, evaluate_held_out};
use kiln_core::checkpoint::Checkpoint;
use kiln_core::plan::{Plan, PlanRequest};
use kiln_core::strategy::{StrategyError, StrategyKind};
use kiln_nn::tensor_parallel::ShardedBackend;

use crate::backend::{BackendKind, DeviceList, Job, Placement, dispatch, parse_devices};
use crate::checkpoint_args::{CheckpointArgs, RunCheckpoints};
use crate::config_file;
use crate::launched::Launched;
use crate::names::strategy_parser;
use crate::optimizer_args::OptimizerArgs;
use crate::outputs;
use crate::parallel_args::ParallelArgs;
use crate::signals::{Interrupted, Saved, Signals};
use metrics::{DataSummary, Metrics, write_outputs};
use progress::Bars;

/// The `kiln ad` commands.
#[derive(clap::Subcommand, Debug)]
pub enum AdCommand {
    /// Generate learning histories, train the AD transformer, save it, and evaluate it.
    Train(Box<TrainArgs>),
    /// Evaluate a saved run on its held-out goals.
    Eval(EvalArgs),
}

/// Flags of `kiln ad train`; each overrides the same field of `--config`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// TOML config to start from (tables: env, goals, source, model, train, parallel,
    /// optimizer, eval).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Parallelism strategy [default: auto].
    #[arg(long, value_parser = strategy_parser())]
    strategy: Option<StrategyKind>,
    #[command(flatten)]
    parallel: ParallelArgs,
    #[command(flatten)]
    optimizer: OptimizerArgs,
    /// Ranks (devices; CPU ranks share the CPU) [default: the length of --devices, or the
    /// product of --dp, --stages and --tp; for auto on the CPU its cores].
    #[arg(long)]
    world: Option<usize>,
    /// Device of each rank, e.g. `0,0` for two ranks on GPU 0 or `0,1` for two GPUs
    /// [default: CPU ranks share the CPU, CUDA ranks take GPUs 0..world].
    #[arg(long, value_parser = parse_devices)]
    devices: Option<DeviceList>,
    /// Backend [default: flex].
    #[arg(long, value_enum, default_value_t)]
    backend: BackendKind,
    /// Optimizer steps [default: 5000].
    #[arg(long)]
    steps: Option<usize>,
    /// Windows per step, all ranks together [default: 32].
    #[arg(long)]
    batch: Option<usize>,
    /// Peak learning rate [default: 0.001].
    #[arg(long, allow_negative_numbers = true)]
    lr: Option<f64>,
    /// Seed of data, model, sample order and evaluation [default: 42].
    #[arg(long)]
    seed: Option<u64>,
    /// Intra-op threads per rank (default: cores shared evenly).
    #[arg(long)]
    threads_per_rank: Option<usize>,
    /// Folder for the run: config.toml, checkpoints/step-<N>/ (model, optimizer state and
    /// config of each save), metrics.json, returns.svg.
    #[arg(long, visible_alias = "output", default_value = "runs/ad")]
    out: PathBuf,
    #[command(flatten)]
    checkpoint: CheckpointArgs,
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
            let args = *args;
            let launched = Launched::from_env()?;
            let (config, plan, request) = args.config(&launched)?;
            let devices = args.devices.as_ref().map(|DeviceList(d)| d.as_slice());
            let placement = Placement::new(plan.local_ranks(), devices)?
                .for_local_process(plan.process().local_rank);
            args.backend.check_precision(config.optimizer.precision)?;
            // Everything the run writes is checked before the data is even generated.
            // Held until the run ends: a second run given the same paths is refused now. The
            // first process writes the run and claims its outputs; the others write nothing.
            let mut _claims = Vec::new();
            if launched.is_main() {
                _claims.push(outputs::check_folder("--out", &args.out)?);
                _claims.extend(outputs::check_files(&[
                    ("--json", args.json.as_deref()),
                    ("--svg", args.svg.as_deref()),
                ])?);
            }
            let resume = args.resume_path();
            let signals = Signals::install()?;
            // `auto` plans with the model measured once the data exists, within the layout
            // of the checkpoint it resumes from; the checkpoint is checked against that plan
            // then (`kiln_ad::checkpoint::resume`), not against this provisional one.
            let replans = config.train.strategy == StrategyKind::Auto
                && plan.world_size() > 1
                && (launched.processes() == 1 || cfg!(feature = "mpi"))
                && args.backend.is_cpu();
            let mut checkpoints = RunCheckpoints::prepare(
                &args.checkpoint,
                resume.as_deref().map(Checkpoint::open).transpose()?,
                Some(("--out", &checkpoint::checkpoints(&args.out))),
                &config.checkpoint,
                (!replans).then_some(&plan),
                config.train.steps,
                launched.is_main(),
            )?;
            if let Some(resumed) = &checkpoints.resume {
                checkpoint::check_config(resumed, &config)?;
            }
            // The run readies (and locks) its folder itself: this handle lets go of it first.
            checkpoints.save = None;
            // `auto` plans with the model measured here, once its data exists, as `kiln
            // train` does: with more than one rank, on the CPU (the processes of a launched
            // run with the first one's measurement); a run that resumes keeps the layout it
            // saved (in `request`).
            let auto = replans.then(|| Planning {
                cores: args.backend.cpu_cores().unwrap_or(1),
                request,
                launched: launched.clone(),
            });
            let job = TrainJob {
                args,
                config,
                plan,
                auto,
                checkpoints,
                signals,
                main: launched.is_main(),
            };
            dispatch(job.args.backend, &placement, job)
        }
        AdCommand::Eval(args) => {
            // Claimed before the evaluation runs, as kiln ad train's: a typo or a second run
            // is refused now, not after minutes of evaluating.
            let _claims = outputs::check_files(&[
                ("--json", args.json.as_deref()),
                ("--svg", args.svg.as_deref()),
            ])?;
            dispatch(args.backend, &Placement::Ranks(1), EvalJob(args))
        }
    }
}

impl TrainArgs {
    /// The checkpoint `--resume` names: a run's folder stands for its checkpoints.
    fn resume_path(&self) -> Option<PathBuf> {
        self.checkpoint.resume.as_deref().map(|path| {
            let inner = checkpoint::checkpoints(path);
            if inner.is_dir() {
                inner
            } else {
                path.to_path_buf()
            }
        })
    }

    /// The config the flags and the file make, and the run's plan over `launched`'s processes.
    fn config(
        &self,
        launched: &Launched,
    ) -> Result<(AdConfig, Plan, PlanRequest), Box<dyn std::error::Error>> {
        let mut c: AdConfig = match &self.config {
            Some(path) => config_file::load(path)?,
            None => AdConfig::default(),
        };
        macro_rules! set {
            ($($flag:ident => $($field:ident).+),* $(,)?) => {$(
                if let Some(v) = self.$flag { c.$($field).+ = v; }
            )*};
        }
        set!(strategy => train.strategy, steps => train.steps,
             batch => train.batch, lr => train.lr, seed => seed);
        // The list names this process's ranks; an explicit --world (all processes' ranks)
        // must agree (checked by Placement).
        let devices = self.devices.as_ref().map(|DeviceList(d)| d.len());
        // --world, else --devices (this process's) × the processes, else the config's, else
        // one rank per process under a launcher.
        let named = self
            .world
            .or_else(|| devices.map(|d| d * launched.processes()));
        if let Some(world) = launched.world(named.or(c.train.world), None) {
            c.train.world = Some(world);
        }
        self.optimizer.apply(&mut c.optimizer);
        self.checkpoint.apply(&mut c.checkpoint);
        if let Some(t) = self.threads_per_rank {
            c.parallel.set_threads_per_rank(t);
        }
        let dp = self.parallel.apply(&mut c.parallel, c.train.strategy)?;
        c.validate()?;
        if c.train.world == Some(0) {
            return Err(AdError::Zero("train.world").into());
        }
        launched.check(c.train.strategy)?;
        // A run resumes on the layout it saved; a precision may rule stages out.
        let resume = self.resume_path();
        let fixed = crate::planning::auto_fixed(
            c.train.strategy,
            resume.as_deref(),
            c.optimizer.precision,
        )?;
        let request = PlanRequest {
            dp,
            cpu_cores: launched.cores(self.backend.cpu_cores()),
            fixed,
            ..c.plan_request()
        };
        let plan = Plan::resolve(request.clone())?;
        plan.check_precision(c.optimizer.precision)?;
        let plan = launched.plan(plan, &c)?;
        Ok((c, plan, request))
    }
}

/// What `auto` needs to plan a run once its model can be measured: the machine's cores, the
/// request the run's plan was resolved from, and the run's processes.
struct Planning {
    cores: usize,
    request: PlanRequest,
    launched: Launched,
}

impl Planning {
    /// The run's plan, resolved again with the planner `measure` returns (the first process's,
    /// for every process of a launched run), checked as the first one was.
    fn resolve(&self, measure: &Measure<'_>, config: &AdConfig) -> Result<Plan, AdError> {
        let planner = match self.launched.processes() {
            1 => measure()?,
            #[cfg(feature = "mpi")]
            _ => crate::planning::plan_together(
                &self.launched,
                config.parallel.ddp.collective_timeout_s,
                // The measurement's own error, without the advice the others add.
                || {
                    measure().map_err(|e| match e {
                        AdError::Measure(inner) => inner.to_string(),
                        other => other.to_string(),
                    })
                },
            )
            .map_err(|e| AdError::Planning(e.to_string()))?,
            #[cfg(not(feature = "mpi"))]
            _ => unreachable!("a launched run is planned with MPI only"),
        };
        let plan = Plan::resolve(PlanRequest {
            planner: Some(planner),
            ..self.request.clone()
        })
        .map_err(StrategyError::from)?;
        plan.check_precision(config.optimizer.precision)
            .map_err(StrategyError::from)?;
        Ok(self
            .launched
            .plan(plan, config)
            .map_err(StrategyError::from)?)
    }
}

struct TrainJob {
    args: TrainArgs,
    config: AdConfig,
    plan: Plan,
    /// Set when `auto` plans the run with the model measured.
    auto: Option<Planning>,
    checkpoints: RunCheckpoints,
    signals: Signals,
    /// Whether this process writes the run (the first of its processes).
    main: bool,
}

impl Job for TrainJob {
    type Output = ();

    fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (args, config, plan) = (self.args, self.config, self.plan);
        let signals = self.signals;
        let stop = || signals.stop_requested();
        // The run's other processes train alongside the first, which alone writes the run
        // folder and evaluates (on one device, as `kiln ad eval` does).
        let main = self.main;
        let resolve = |measure: &Measure<'_>| match &self.auto {
            Some(planning) => planning.resolve(measure, &config),
            None => Ok(plan.clone()),
        };
        let options = RunOptions {
            auto: self.auto.as_ref().map(|planning| Auto {
                cores: planning.cores,
                resolve: &resolve,
            }),
            save_to: main.then_some(args.out.as_path()),
            resume: self.checkpoints.resume.as_ref(),
            stop: Some(&stop),
            overwrite: args.checkpoint.overwrite,
            no_eval: args.no_eval || !main,
        };
        let first = self.checkpoints.resume.as_ref().map_or(0, |c| c.step());
        let mut bars = if main {
            Bars::new(config.train.steps)
        } else {
            Bars::quiet()
        };
        bars.start_at(first);
        let done = kiln_ad::run::run::<B>(&config, &plan, devices, options, &mut bars)?;
        if done.train.stopped {
            drop(bars);
            return Err(Box::new(Interrupted {
                signal: signals.signal().unwrap_or(signal_hook::consts::SIGINT),
                step: done.train.last_step,
                steps: config.train.steps,
                saved: match main {
                    true => done
                        .train
                        .saved
                        .map(|dir| Saved::Checkpoint(dir.into(), args.out.clone())),
                    false => Some(Saved::ByFirstProcess),
                },
            }));
        }
        if !main {
            return Ok(());
        }
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

    fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let args = self.0;
        let start = Instant::now();
        let device = devices[0].clone();
        let (config, model) =
            checkpoint::load_with::<B::InnerBackend>(&args.run, &device, |eval| {
                eval.episodes = args.episodes.unwrap_or(eval.episodes);
                eval.seeds = args.seeds.unwrap_or(eval.seeds);
            })?;
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
