//! The [`Strategy`] trait and its implementations.
//!
//! A strategy owns a model and where its parameters live. [`Strategy::step`] takes the sample
//! indices of one global batch and reads top-down in every implementation: shard the batch
//! → forward/backward per rank (micro-batches weighted by their share of the global batch) →
//! synchronise gradients → optimizer step → statistics. Because the weighting is exact, `k`
//! steps with any strategy match `k` steps of single-device training on the same global
//! batches (the equivalence tests in `tests/`).

mod build;
mod data_parallel;
mod ddp;
mod dispatch;
mod error;
mod handover;
mod kind;
mod loss;
mod micro_batch;
mod optimizer;
mod pipeline;
mod single;
mod threads;

use std::time::Duration;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

pub use build::{StrategyConfigs, build, build_replicated};
pub use data_parallel::{DataParallel, DataParallelConfig};
pub use ddp::{Ddp, DdpConfig};
pub use error::{ConfigError, RankError, RankFailure, StrategyError};
pub use kind::{AutoDecision, StrategyKind};
pub use loss::StepLoss;
pub use optimizer::{OptimizerSpec, PerformanceSpec};
pub use pipeline::{Action, Pipeline, PipelineConfig, Schedule, peak_live};
pub use single::{Single, SingleConfig};

use crate::collective::CollectiveCounters;
use crate::optim::{GuardReport, OptimizerState};

/// A model a strategy can train: any Burn [`AutodiffModule`] with a burn-train [`TrainStep`]
/// whose output reports its loss.
///
/// Contract: `TrainStep::step` returns the gradients of the **mean** loss over the samples of
/// its input; strategies rely on it to weight shards and micro-batches exactly.
pub trait TrainModel<B: AutodiffBackend>:
    AutodiffModule<B> + TrainStep<Output: StepLoss> + 'static
{
}

impl<B, M> TrainModel<B> for M
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + TrainStep<Output: StepLoss> + 'static,
{
}

/// What one optimizer step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// Mean loss over the samples of the global batch.
    pub loss: f64,
    /// Samples trained on (after the shard policy).
    pub samples: usize,
    /// Longest forward/backward time over the ranks.
    pub compute: Duration,
    /// Longest gradient-synchronisation time over the ranks, waiting for peers included.
    pub communication: Duration,
    /// What the [`PerformanceOptimizer`](crate::optim::PerformanceOptimizer)'s guard did (the
    /// global gradient norm, whether the step was skipped); `None` without one.
    pub guard: Option<GuardReport>,
}

/// Running totals of one rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankStats {
    /// The rank.
    pub rank: usize,
    /// Optimizer steps taken.
    pub steps: u64,
    /// Samples read.
    pub samples: u64,
    /// Time in forward and backward passes (micro-batches included).
    pub compute: Duration,
    /// Time synchronising gradients and parameters.
    pub communication: Duration,
    /// Collective traffic.
    pub collective: CollectiveCounters,
    /// Time waiting for another stage's activations or gradients (the pipeline bubble);
    /// zero for strategies without stages.
    pub idle: Duration,
    /// Most micro-batches whose activations this rank held at once (pipeline stages).
    pub peak_live_micro_batches: usize,
    /// Bytes of the stage-boundary activations held at that peak: a lower bound of the
    /// activation memory, which also holds each stage's internal intermediates.
    pub peak_activation_bytes: u64,
}

impl RankStats {
    /// The times spent since `earlier` (the same rank's stats at an earlier moment): how
    /// benchmarks leave out their warm-up steps. Counts and peaks stay this moment's.
    pub fn since(&self, earlier: &RankStats) -> RankStats {
        RankStats {
            compute: self.compute.saturating_sub(earlier.compute),
            communication: self.communication.saturating_sub(earlier.communication),
            idle: self.idle.saturating_sub(earlier.idle),
            ..self.clone()
        }
    }
}

/// A rank's totals as reports write them (`kiln train --json`, the AD metrics): seconds and
/// counts, serialisable.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankReport {
    /// The rank.
    pub rank: usize,
    /// Samples read (for pipeline stages: scored by the last stage).
    pub samples: u64,
    /// Seconds in forward, backward and optimizer.
    pub compute_s: f64,
    /// Seconds synchronising gradients and parameters.
    pub communication_s: f64,
    /// Seconds waiting for another pipeline stage (the bubble); 0 without stages.
    pub idle_s: f64,
    /// Most micro-batches whose activations the rank held at once (pipeline stages).
    pub peak_live_micro_batches: usize,
    /// Bytes of stage-boundary activations held at that peak (a lower bound).
    pub peak_activation_bytes: u64,
    /// Collective calls.
    pub collective_calls: u64,
}

impl From<RankStats> for RankReport {
    fn from(s: RankStats) -> Self {
        Self {
            rank: s.rank,
            samples: s.samples,
            compute_s: s.compute.as_secs_f64(),
            communication_s: s.communication.as_secs_f64(),
            idle_s: s.idle.as_secs_f64(),
            peak_live_micro_batches: s.peak_live_micro_batches,
            peak_activation_bytes: s.peak_activation_bytes,
            collective_calls: s.collective.calls,
        }
    }
}

/// A way of training one model on one or more devices.
///
/// `M` is the model and `B` its autodiff backend. Implementations: [`Single`],
/// [`DataParallel`], [`Ddp`], [`Pipeline`]; build one directly or from a [`StrategyKind`].
pub trait Strategy<B: AutodiffBackend, M: TrainModel<B>> {
    /// The strategy's name, as used in configs, the CLI and logs (`"ddp"`).
    fn name(&self) -> &'static str;

    /// Number of ranks taking part.
    fn world_size(&self) -> usize;

    /// Trains on the global batch made of the samples at `batch` (indices into the data
    /// source) with learning rate `lr`: one optimizer step.
    ///
    /// # Errors
    /// [`StrategyError`] for an invalid batch, or a failure on any rank (naming it). After a
    /// rank failure the strategy is broken and every later call returns an error.
    fn step(&mut self, batch: &[usize], lr: f64) -> Result<StepOutput, StrategyError>;

    /// [`Self::step`], also returning the training-step output item of every micro-batch of
    /// every rank, in rank order: what burn-train's metrics read (see [`crate::learner`]).
    /// Single, DataParallel and Ddp return them; the pipeline, whose stages never run the
    /// whole model's training step, returns none.
    ///
    /// # Errors
    /// As [`Self::step`].
    fn step_with_items(
        &mut self,
        batch: &[usize],
        lr: f64,
    ) -> Result<(StepOutput, Vec<<M as TrainStep>::Output>), StrategyError> {
        Ok((self.step(batch, lr)?, Vec::new()))
    }

    /// The canonical model (rank 0's, or the main device's), for evaluation and checkpoints.
    ///
    /// # Errors
    /// When the rank holding it has failed.
    fn model(&self) -> Result<M, StrategyError>;

    /// Running totals per rank.
    fn stats(&self) -> Vec<RankStats>;

    /// The optimizer's state (rank 0's, or every stage's), to checkpoint next to
    /// [`Self::model`]: a strategy built from both, with [`Self::load_optimizer_state`],
    /// continues bit for bit as if training had not stopped.
    ///
    /// # Errors
    /// When a rank holding it has failed, or its state cannot be encoded.
    fn optimizer_state(&self) -> Result<OptimizerState, StrategyError>;

    /// Replaces every rank's optimizer state with `state`, saved by a strategy of the same
    /// [`StateLayout`](crate::optim::StateLayout) over the same model.
    ///
    /// # Errors
    /// [`StrategyError::State`] for a state of another layout or optimizer; a rank failure.
    fn load_optimizer_state(&mut self, state: &OptimizerState) -> Result<(), StrategyError>;
}
