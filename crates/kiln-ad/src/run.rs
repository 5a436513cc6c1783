//! The whole job in one call: data → training through a strategy → checkpoint → evaluation.
//!
//! `kiln ad train`, the example and the acceptance test all run this one sequence; an
//! [`Observer`] shows its progress (log lines, or the CLI's progress bars).

use kiln_kernels::KernelBackend;
use std::path::Path;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::Serialize;

use kiln_core::checkpoint::{Checkpoint, CheckpointFolder};
use kiln_core::plan::{Plan, Planner};
use kiln_core::strategy::ConfigError;
use kiln_nn::tensor_parallel::ShardedBackend;

use crate::checkpoint;
use crate::config::AdConfig;
use crate::error::AdError;
use crate::goals::GoalSplit;
use crate::model::AdTransformer;
use crate::report::{EvalReport, evaluate};
use crate::train::{Data, Session, TrainSummary, generate, train};

/// What a caller shows while a run goes. Every hook does nothing unless overridden.
pub trait Observer {
    /// The learning histories are ready.
    fn data(&mut self, _data: &Data) {}
    /// Training step `step` (1-based) ended with `loss`.
    fn step(&mut self, _step: usize, _loss: f64) {}
    /// Training is done.
    fn trained(&mut self, _summary: &TrainSummary) {}
    /// `done` of `total` evaluation steps are done.
    fn eval_step(&mut self, _done: usize, _total: usize) {}
    /// The evaluation is done.
    fn evaluated(&mut self, _report: &EvalReport) {}
}

/// Logs a run with `tracing`: the data, every tenth of training, and the evaluation summary.
#[derive(Debug)]
pub struct LogProgress {
    steps: usize,
}

impl LogProgress {
    /// Logs a run of `steps` training steps.
    pub fn new(steps: usize) -> Self {
        Self { steps }
    }
}

impl Observer for LogProgress {
    fn data(&mut self, data: &Data) {
        tracing::info!("{}", data.summary());
    }

    fn step(&mut self, step: usize, loss: f64) {
        if step.is_multiple_of((self.steps / 10).max(1)) {
            tracing::info!("step {step}/{}: loss {loss:.4}", self.steps);
        }
    }

    fn evaluated(&mut self, report: &EvalReport) {
        tracing::info!("{}", report.summary());
    }
}

/// What the run does besides training.
#[derive(Clone, Copy, Default)]
pub struct RunOptions<'a> {
    /// The run folder: checkpoints go to `<dir>/checkpoints` (every `checkpoint.every` steps,
    /// and at the end of training, before the evaluation), the config to `<dir>/config.toml`.
    pub save_to: Option<&'a Path>,
    /// The verified checkpoint to resume from ([`checkpoint::open`]).
    pub resume: Option<&'a Checkpoint>,
    /// Asked after every training step: `true` stops training there, saves, and skips the
    /// evaluation ([`TrainSummary::stopped`]).
    pub stop: Option<&'a (dyn Fn() -> bool + Sync)>,
    /// Remove the checkpoints of `save_to` after the step this run starts from, once its
    /// first save is in place (refused otherwise).
    pub overwrite: bool,
    /// Skip the evaluation.
    pub no_eval: bool,
    /// Plan the run with the model measured on this machine once its data exists: `auto`'s
    /// choice ([`Auto`]). Without it, the run trains as the plan it is given says.
    pub auto: Option<Auto<'a>>,
}

/// How `auto` plans a run once the model can be measured: on this machine's `cores`, with the
/// measurement handed to `resolve`, which returns the plan the run trains with.
#[derive(Clone, Copy)]
pub struct Auto<'a> {
    /// The machine's cores: the planner's devices, and the copies beside a timed step.
    pub cores: usize,
    /// The run's plan, resolved with the planner the measurement it is given returns (a
    /// launched run's processes plan with the first one's: the others do not call it).
    pub resolve: &'a dyn Fn(&Measure<'_>) -> Result<Plan, AdError>,
}

/// Measures this machine with the run's model: the planner `auto` plans with.
pub type Measure<'a> = dyn Fn() -> Result<Planner, AdError> + 'a;

/// Wall-clock seconds per stage of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Seconds {
    /// Generating the learning histories.
    pub data: f64,
    /// The training loop.
    pub train: f64,
    /// Evaluation (AD, control, source and random).
    pub eval: f64,
    /// The whole run.
    pub total: f64,
}

/// What a whole run produced.
#[derive(Debug)]
pub struct Run<B: Backend> {
    /// The data it trained on.
    pub data: Data,
    /// The trained model, frozen.
    pub model: AdTransformer<B>,
    /// How training went.
    pub train: TrainSummary,
    /// The evaluation on the held-out goals, unless skipped.
    pub eval: Option<EvalReport>,
    /// Seconds per stage.
    pub seconds: Seconds,
}

/// Runs `config` end to end as `plan` says, on `devices` (one per rank of the plan).
///
/// # Errors
/// An invalid config, a failure while training, or a checkpoint that cannot be written.
pub fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
    config: &AdConfig,
    plan: &Plan,
    devices: Vec<B::Device>,
    options: RunOptions<'_>,
    observer: &mut dyn Observer,
) -> Result<Run<B::InnerBackend>, AdError> {
    let start = Instant::now();
    let device = devices
        .first()
        .cloned()
        .ok_or(kiln_core::StrategyError::from(ConfigError::NoDevices))?;
    let save_to = match options.save_to {
        Some(dir) => {
            let mut folder =
                CheckpointFolder::new(checkpoint::checkpoints(dir), config.checkpoint.keep);
            folder.prepare(
                options.resume.map_or(0, Checkpoint::step),
                options.overwrite,
            )?;
            write_config(dir, config)?;
            Some(folder)
        }
        None => None,
    };
    let data = generate(config)?;
    observer.data(&data);
    let planned;
    let plan = match options.auto {
        Some(auto) if plan.world_size() > 1 => {
            // The ranks' devices the calibration times over: a launched process may hold one
            // (`auto` measures CPU backends, whose ranks share the one device).
            let ranks = vec![devices[0].clone(); kiln_planner::TIMED_RANKS];
            let measure = || crate::plan::planner::<B>(config, &data, &ranks, auto.cores);
            planned = (auto.resolve)(&measure)?;
            &planned
        }
        _ => plan,
    };
    let session = Session {
        resume: options.resume,
        save_to,
        stop: options.stop,
    };
    let (model, summary) = train::<B>(config, plan, &data, devices, session, &mut |step, loss| {
        observer.step(step, loss)
    })?;
    observer.trained(&summary);
    let model = model.valid();
    let (eval, eval_s) = if options.no_eval || summary.stopped {
        (None, 0.0)
    } else {
        let (report, seconds) = evaluate_held_out(&model, config, &data.goals, &device, observer);
        (Some(report), seconds)
    };
    let seconds = Seconds {
        data: data.seconds,
        train: summary.wall_s,
        eval: eval_s,
        total: start.elapsed().as_secs_f64(),
    };
    Ok(Run {
        data,
        model,
        train: summary,
        eval,
        seconds,
    })
}

/// Evaluates `model` on the held-out goals of `goals`; returns the report and its seconds.
pub fn evaluate_held_out<B: KernelBackend>(
    model: &AdTransformer<B>,
    config: &AdConfig,
    goals: &GoalSplit,
    device: &B::Device,
    observer: &mut dyn Observer,
) -> (EvalReport, f64) {
    let start = Instant::now();
    let report = evaluate(
        model,
        config,
        &goals.held_out,
        device,
        &mut |done, total| observer.eval_step(done, total),
    );
    observer.evaluated(&report);
    (report, start.elapsed().as_secs_f64())
}

/// Writes `config` to `<dir>/config.toml`, whole or not at all (a temporary file renamed into
/// place).
fn write_config(dir: &Path, config: &AdConfig) -> Result<(), AdError> {
    let io = |path: &Path, e: std::io::Error| {
        AdError::Checkpoint(kiln_core::checkpoint::CheckpointError::Io {
            action: "write",
            path: path.display().to_string(),
            reason: e.to_string(),
        })
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let path = dir.join(checkpoint::CONFIG);
    let partial = dir.join(format!(
        ".{}.partial-{}",
        checkpoint::CONFIG,
        std::process::id()
    ));
    std::fs::write(&partial, checkpoint::config_text(config)?).map_err(|e| io(&partial, e))?;
    std::fs::rename(&partial, &path).map_err(|e| io(&path, e))
}
