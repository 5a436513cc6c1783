//! `kiln train`: a built-in model on built-in synthetic data, through any strategy.

mod report;

use std::path::PathBuf;

use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_core::checkpoint::{Checkpoint, RunInfo, Saver};
use kiln_core::data::DataSource;
use kiln_core::fit::FitModel;
use kiln_core::fit::{Resume, SaveHooks, Training, fit};
use kiln_core::params::checksum;
use kiln_core::plan::Plan;
use kiln_core::strategy::{PerformanceSpec, StepOutput};
use kiln_nn::tensor_parallel::ShardedBackend;

use report::TrainReport;

use crate::backend::{Job, dispatch};
use crate::checkpoint_args::{CheckpointArgs, RunCheckpoints};
use crate::launched::Launched;
use crate::run_config::{AutoPlan, ModelJob, ModelKind, RunArgs, TrainConfig, with_builtin};
use crate::signals::{Interrupted, Saved, Signals};

/// Flags of `kiln train`; each overrides the same field of `--config`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// TOML config to start from (fields as in the flags; `[parallel.single]`,
    /// `[parallel.data_parallel]`, `[parallel.ddp]`, `[parallel.pipeline]`, `[parallel.tensor]`
    /// tables).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Built-in model [default: mlp].
    #[arg(long, value_enum)]
    model: Option<ModelKind>,
    /// Blocks of the built-in model (the transformer's, or the MLP's hidden layers), which
    /// pipeline stages split [default: 2].
    #[arg(long)]
    layers: Option<usize>,
    #[command(flatten)]
    run: RunArgs,
    /// Samples in the synthetic data set [default: 8192].
    #[arg(long)]
    samples: Option<usize>,
    /// Write a JSON summary here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Save checkpoints (model, optimizer state, step) into this folder: at the end, every
    /// --save-every steps, and on SIGINT / SIGTERM. Each save is a complete, verified
    /// `step-<N>` folder.
    #[arg(long, value_name = "DIR")]
    save: Option<PathBuf>,
    #[command(flatten)]
    checkpoint: CheckpointArgs,
}

/// Where `kiln train` saves to and resumes from, as the flags name them.
#[derive(Debug, Clone, Default)]
struct Checkpoints {
    save: Option<PathBuf>,
    args: CheckpointArgs,
    /// `--resume`'s checkpoint, verified.
    opened: Option<Checkpoint>,
}

/// A run's config, plan, `--json` file (for the first process) and checkpoints, as the flags
/// and the config file make them.
type Parsed = (TrainConfig, Plan, Option<PathBuf>, Checkpoints);

impl TrainArgs {
    /// The config the flags and the file make, and the run's plan.
    fn into_config(self, launched: &Launched) -> Result<Parsed, Box<dyn std::error::Error>> {
        let mut c = match &self.config {
            Some(path) => TrainConfig::load(path)?,
            None => TrainConfig::default(),
        };
        if let Some(model) = self.model {
            c.model = model;
        }
        if let Some(layers) = self.layers {
            c.layers = Some(layers);
        }
        if let Some(samples) = self.samples {
            c.samples = samples;
        }
        let dp = self.run.apply(&mut c)?;
        c.validate()?;
        self.checkpoint.apply(&mut c.checkpoint);
        let resume = self.checkpoint.resume.as_deref();
        // The checkpoint is read and verified before `auto` measures the machine (seconds):
        // a damaged or foreign one is reported at once.
        let opened = resume.map(Checkpoint::open).transpose()?;
        if let Some(checkpoint) = &opened {
            c.check_resumed(checkpoint)?;
        }
        let plan = crate::planning::plan(&c, dp, launched, AutoPlan::Measured { resume })?;
        c.placement(&plan)?;
        // What the run writes, the first process writes alone.
        let main = launched.is_main();
        let checkpoints = Checkpoints {
            save: self.save,
            args: self.checkpoint,
            opened,
        };
        Ok((c, plan, self.json.filter(|_| main), checkpoints))
    }
}

/// Runs `kiln train`.
///
/// # Errors
/// Invalid flags or config, or a failure while training.
pub fn run(args: TrainArgs) -> Result<(), Box<dyn std::error::Error>> {
    let launched = Launched::from_env()?;
    let (config, plan, json, checkpoints) = args.into_config(&launched)?;
    let placement = config.placement(&plan)?;
    config.backend.check_precision(config.optimizer.precision)?;
    // Everything the run writes is checked before it trains a step.
    let _claim = crate::outputs::check_files(&[("--json", json.as_deref())])?;
    // Installed before anything is written, so a signal from then on stops the run cleanly.
    let signals = Signals::install()?;
    let prepared = RunCheckpoints::prepare(
        &checkpoints.args,
        checkpoints.opened,
        checkpoints.save.as_deref().map(|dir| ("--save", dir)),
        &config.checkpoint,
        Some(&plan),
        config.steps,
        launched.is_main(),
    )?;
    let job = TrainJob {
        config: &config,
        plan: &plan,
        checkpoints: prepared,
        signals: &signals,
        main: launched.is_main(),
    };
    let report = dispatch(config.backend, &placement, job)?;
    if !launched.is_main() {
        return Ok(());
    }
    let resumed = report
        .resumed_from
        .map(|step| format!(" (resumed at step {step})"))
        .unwrap_or_default();
    println!(
        "trained {} with {} on {} rank(s): {} steps of {} samples{resumed}, loss {} -> {}, \
         {:.0} samples/s",
        report.model,
        report.strategy,
        report.world,
        report.steps,
        report.global_batch,
        fmt_loss(report.first_loss),
        fmt_loss(report.final_loss),
        report.samples_per_s
    );
    if let Some(dir) = &report.saved {
        println!("saved {dir}");
    }
    if let Some(path) = json {
        crate::outputs::write(
            "--json",
            &path,
            serde_json::to_string_pretty(&report)?.as_bytes(),
        )?;
    }
    Ok(())
}

fn fmt_loss(loss: Option<f64>) -> String {
    loss.map_or_else(|| "-".into(), |l| format!("{l:.4}"))
}

/// `kiln train` on whichever backend was chosen.
struct TrainJob<'a> {
    config: &'a TrainConfig,
    plan: &'a Plan,
    checkpoints: RunCheckpoints,
    signals: &'a Signals,
    /// Whether this process shows progress (the first of the run's processes).
    main: bool,
}

impl Job for TrainJob<'_> {
    type Output = TrainReport;

    fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<TrainReport, Box<dyn std::error::Error>> {
        train_on_devices::<B>(self, devices)
    }
}

fn train_on_devices<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
    job: TrainJob<'_>,
    devices: Vec<B::Device>,
) -> Result<TrainReport, Box<dyn std::error::Error>> {
    let config = job.config;
    let device = devices[0].clone();
    with_builtin::<B, _>(config, &device, Train { job, devices })
}

/// Training, as a job on whichever built-in model the config names.
struct Train<'a, B: AutodiffBackend> {
    job: TrainJob<'a>,
    devices: Vec<B::Device>,
}

impl<B> ModelJob<B> for Train<'_, B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Output = Result<TrainReport, Box<dyn std::error::Error>>;

    fn run<M, I>(self, model: M, data: DataSource<B, I, M::Input>) -> Self::Output
    where
        M: FitModel<B>,
        I: Send + Sync + Clone + 'static,
    {
        train_model(self.job, self.devices, model, data)
    }
}

fn train_model<B, M, I>(
    job: TrainJob<'_>,
    devices: Vec<B::Device>,
    model: M,
    data: DataSource<B, I, M::Input>,
) -> Result<TrainReport, Box<dyn std::error::Error>>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
    M: FitModel<B>,
    I: Send + 'static,
{
    let TrainJob {
        config,
        plan,
        checkpoints,
        signals,
        main,
    } = job;
    let kind = config.model.name();
    let (model, resume) = match &checkpoints.resume {
        Some(checkpoint) => {
            let model = checkpoint.model(kind, model, &devices[0])?;
            let resume = Resume {
                step: checkpoint.step(),
                optimizer: checkpoint.optimizer(plan)?,
            };
            tracing::info!("resuming from {}", checkpoint.dir().display());
            (model, Some(resume))
        }
        None => (model, None),
    };
    let mut saver = match checkpoints.save {
        Some(folder) => {
            let run = RunInfo::of(plan, "adamw", config.optimizer.precision);
            let text = toml::to_string_pretty(config)?;
            Some(
                Saver::new(folder, kind, run)
                    .with_file(crate::run_config::CONFIG_FILE, text.into_bytes()),
            )
        }
        None => None,
    };
    let stop = || signals.stop_requested();
    let training = Training {
        steps: config.steps,
        seed: config.seed,
        lr: &|step| config.lr_at(step),
        resume: resume.as_ref(),
        keep_optimizer_state: saver.is_some(),
        save_every: checkpoints.every,
        eval_every: None,
        lengths: None,
        stop: Some(&stop),
    };
    let bar = if main {
        ProgressBar::new(config.steps as u64)
    } else {
        ProgressBar::hidden()
    }
    .with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} steps  {msg}  [{elapsed}<{eta}]")
            .expect("valid template"),
    );
    let spec = PerformanceSpec::new(config.adamw(), config.optimizer.clone())?;
    bar.set_position(training.first_step() as u64);
    let on_step = |_, out: &StepOutput| {
        bar.set_message(format!("loss {:.4}", out.loss));
        bar.inc(1);
    };
    let mut hooks = SaveHooks::<B, _>::new(on_step, saver.as_mut());
    let (trained, record) = fit(plan, &training, devices, model, &spec, data, &mut hooks)?;
    bar.finish_and_clear();
    let saved = match saver.as_mut() {
        Some(saver) => record.save_end::<B, M>(saver, trained.clone())?,
        None => None,
    };
    if record.stopped {
        return Err(Box::new(Interrupted {
            signal: signals.signal().unwrap_or(signal_hook::consts::SIGINT),
            step: record.last_step,
            steps: config.steps,
            saved: match main {
                true => saved
                    .zip(saver.as_ref().map(|s| s.folder().root().to_path_buf()))
                    .map(|(dir, root)| Saved::Checkpoint(dir, root)),
                false => Some(Saved::ByFirstProcess),
            },
        }));
    }

    let checksum = checksum(&trained);
    Ok(TrainReport {
        strategy: plan.strategy().to_string(),
        strategy_reason: plan.reason().to_string(),
        mesh: plan.mesh().to_string(),
        model: kind.to_string(),
        backend: config.backend.to_string(),
        world: plan.world_size(),
        steps: record.losses.len(),
        resumed_from: resume.as_ref().map(|r| r.step),
        last_step: record.last_step,
        saved: saved.as_deref().map(|dir| dir.display().to_string()),
        global_batch: config.batch,
        grad_accumulation: plan.grad_accumulation(),
        seed: config.seed,
        first_loss: record.losses.first().copied(),
        final_loss: record.losses.last().copied(),
        skipped_steps: record.skipped_steps,
        param_sum: checksum.sum,
        param_sq_sum: checksum.sq_sum,
        param_count: checksum.count,
        wall_s: record.wall_s,
        samples_per_s: (record.losses.len() * config.batch) as f64
            / record.wall_s.max(f64::MIN_POSITIVE),
        ranks: record.ranks,
        peak_resident_bytes: kiln_core::memory::peak_resident_bytes(),
    })
}
