//! Data generation and training: learning histories on the training goals, then the
//! transformer trained on their windows through any Kiln strategy.

use std::sync::Arc;
use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use kiln_core::checkpoint::{Checkpoint, CheckpointFolder};
use kiln_core::data::DataSource;
use kiln_core::fit::{SaveHooks, Training, fit};
use kiln_core::plan::Plan;
use kiln_core::strategy::{ConfigError, PerformanceSpec, RankReport, StepOutput};
use kiln_kernels::FusedAdamWConfig;
use kiln_nn::tensor_parallel::ShardedBackend;
use serde::{Deserialize, Serialize};

use crate::config::AdConfig;
use crate::dataset::{AdBatch, WindowBatcher, WindowDataset, WindowRef};
use crate::error::AdError;
use crate::goals::GoalSplit;
use crate::history::Histories;
use crate::model::AdTransformer;
use crate::source::learning_histories;

/// The goal split and the source's learning histories on the training goals.
#[derive(Debug, Clone)]
pub struct Data {
    /// Training and held-out goals.
    pub goals: GoalSplit,
    /// Histories on the training goals only.
    pub histories: Arc<Histories>,
    /// Seconds spent generating them.
    pub seconds: f64,
}

impl Data {
    /// One line: how many histories of how many steps, on how many goals, in how long.
    pub fn summary(&self) -> String {
        format!(
            "{} learning histories of {} steps on {} training goals in {:.2} s; {} goals held out",
            self.histories.count(),
            self.histories.len(),
            self.goals.train.len(),
            self.seconds,
            self.goals.held_out.len()
        )
    }
}

/// Generates the data of `config` (deterministic in `config.seed` and `config.goals.seed`).
///
/// # Errors
/// An invalid config.
pub fn generate(config: &AdConfig) -> Result<Data, AdError> {
    config.validate()?;
    let start = Instant::now();
    let goals = GoalSplit::new(&config.env, &config.goals)?;
    let histories = learning_histories(config.env, &goals.train, &config.source, config.seed);
    Ok(Data {
        goals,
        histories: Arc::new(histories),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// What training did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSummary {
    /// The strategy that ran.
    pub strategy: String,
    /// Why it was chosen.
    pub strategy_reason: String,
    /// The ranks' mesh (`dp=2 × tp=2`).
    #[serde(default)]
    pub mesh: String,
    /// Ranks.
    pub world: usize,
    /// Optimizer steps this run trained.
    pub steps: usize,
    /// The checkpoint step this run resumed from; absent for a fresh run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<usize>,
    /// The step the run ended at (`resumed_from + steps`).
    #[serde(default)]
    pub last_step: usize,
    /// Whether a stop request (SIGINT, SIGTERM) ended the run before its last step.
    #[serde(default)]
    pub stopped: bool,
    /// The checkpoint saved at the end, when the run saves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved: Option<String>,
    /// Windows per step.
    pub batch: usize,
    /// Windows in the data set.
    pub windows: usize,
    /// Loss of the first step.
    pub first_loss: f64,
    /// Mean loss over the last 50 steps (fewer when shorter).
    pub final_loss: f64,
    /// Steps the NaN guard skipped.
    pub skipped_steps: usize,
    /// Loss every `steps / 100` steps (at least every step), for curves.
    pub loss_curve: Vec<(usize, f64)>,
    /// Wall-clock seconds of the training loop.
    pub wall_s: f64,
    /// Milliseconds per optimizer step.
    pub ms_per_step: f64,
    /// Each rank's totals: compute, communication, pipeline idle time and activations held.
    #[serde(default)]
    pub ranks: Vec<RankReport>,
}

/// How a training run resumes, saves and stops.
#[derive(Default)]
pub struct Session<'a> {
    /// The verified checkpoint to resume from (of this config and plan).
    pub resume: Option<&'a Checkpoint>,
    /// The checkpoint folder to save into: every `checkpoint.every` steps, at the end, and
    /// when stopped.
    pub save_to: Option<CheckpointFolder>,
    /// Asked after every step; `true` ends training there (it is saved, and the summary says
    /// [`TrainSummary::stopped`]).
    pub stop: Option<&'a (dyn Fn() -> bool + Sync)>,
}

/// The windows of `data`'s histories the model trains on, `config.model.context` steps each.
pub(crate) fn window_source<B: AutodiffBackend>(
    config: &AdConfig,
    data: &Data,
) -> Result<DataSource<B, WindowRef, AdBatch<B>>, AdError> {
    let context = config.model.context;
    Ok(DataSource::new(
        WindowDataset::new(data.histories.clone(), context)?,
        WindowBatcher::new(data.histories.clone(), context)
            .with_features_dtype(config.optimizer.precision.dtype()),
    ))
}

/// The optimizer the model trains with: the fused AdamW under `config.optimizer`'s guards and
/// precision.
pub(crate) fn optimizer(config: &AdConfig) -> Result<PerformanceSpec<FusedAdamWConfig>, AdError> {
    Ok(PerformanceSpec::new(
        FusedAdamWConfig::new().with_weight_decay(config.train.weight_decay as f32),
        config.optimizer.clone(),
    )?)
}

/// Trains an [`AdTransformer`] on `data` as `plan` says, over `devices` (one per rank of the
/// plan): a fresh one, or the one `session` resumes. Calls `on_step(step, loss)` after every
/// step, and saves as `session` says.
///
/// # Errors
/// An invalid config, a checkpoint of another run, a strategy failure, or a save that failed.
pub fn train<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
    config: &AdConfig,
    plan: &Plan,
    data: &Data,
    devices: Vec<B::Device>,
    session: Session<'_>,
    on_step: &mut dyn FnMut(usize, f64),
) -> Result<(AdTransformer<B>, TrainSummary), AdError> {
    config.validate()?;
    plan.check_precision(config.optimizer.precision)
        .map_err(kiln_core::StrategyError::from)?;
    let t = &config.train;
    let device = devices
        .first()
        .ok_or(kiln_core::StrategyError::from(ConfigError::NoDevices))?;
    B::seed(device, config.seed);
    let model = config.model.init::<B>(&config.env, device);
    let (model, resume) = match session.resume {
        Some(checkpoint) => {
            let (model, resume) =
                crate::checkpoint::resume(checkpoint, config, plan, model, device)?;
            (model, Some(resume))
        }
        None => (model, None),
    };
    let mut saver = session
        .save_to
        .map(|folder| crate::checkpoint::saver(folder, config, plan))
        .transpose()?;
    let source = window_source(config, data)?;
    let windows = source.len();
    let training = Training {
        steps: t.steps,
        seed: config.seed,
        lr: &|step| t.lr_at(step),
        resume: resume.as_ref(),
        keep_optimizer_state: saver.is_some(),
        save_every: config.checkpoint.every,
        eval_every: None,
        lengths: None,
        stop: session.stop,
    };
    let optim = optimizer(config)?;
    let on_step = |step, out: &StepOutput| on_step(step, out.loss);
    let mut hooks = SaveHooks::<B, _>::new(on_step, saver.as_mut());
    let (model, record) = fit(plan, &training, devices, model, &optim, source, &mut hooks)?;
    let saved = match saver.as_mut() {
        Some(saver) => record.save_end::<B, _>(saver, model.clone())?,
        None => None,
    };
    let every = (t.steps / 100).max(1);
    let loss_curve = record
        .losses
        .iter()
        .enumerate()
        .filter(|(step, _)| step % every == 0 || step + 1 == record.losses.len())
        .map(|(step, &loss)| (record.first_step + step, loss))
        .collect();
    let summary = TrainSummary {
        strategy: record.plan.strategy().to_string(),
        strategy_reason: record.plan.reason().to_string(),
        mesh: record.plan.mesh().to_string(),
        world: record.plan.world_size(),
        steps: record.losses.len(),
        resumed_from: resume.as_ref().map(|r| r.step),
        last_step: record.last_step,
        stopped: record.stopped,
        saved: saved.map(|dir| dir.display().to_string()),
        batch: t.batch,
        windows,
        first_loss: record.losses.first().copied().unwrap_or(f64::NAN),
        final_loss: record.tail_loss(50),
        skipped_steps: record.skipped_steps,
        loss_curve,
        wall_s: record.wall_s,
        ms_per_step: record.ms_per_step(),
        ranks: record.ranks,
    };
    Ok((model, summary))
}
