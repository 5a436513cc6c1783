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

use kiln_core::plan::Plan;
use kiln_core::strategy::ConfigError;
use kiln_nn::tensor_parallel::ShardedBackend;

use crate::checkpoint;
use crate::config::AdConfig;
use crate::error::AdError;
use crate::goals::GoalSplit;
use crate::model::AdTransformer;
use crate::report::{EvalReport, evaluate};
use crate::train::{Data, TrainSummary, generate, train};

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
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions<'a> {
    /// Save the config and the trained model here as soon as training ends.
    pub save_to: Option<&'a Path>,
    /// Skip the evaluation.
    pub no_eval: bool,
}

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
    let data = generate(config)?;
    observer.data(&data);
    let (model, summary) = train::<B>(config, plan, &data, devices, &mut |step, loss| {
        observer.step(step, loss)
    })?;
    observer.trained(&summary);
    let model = model.valid();
    if let Some(dir) = options.save_to {
        checkpoint::save(dir, config, model.clone())?;
    }
    let (eval, eval_s) = if options.no_eval {
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
