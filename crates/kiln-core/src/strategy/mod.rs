//! The [`Strategy`] trait and its implementations.
//!
//! A strategy owns a model and where its parameters live. [`Strategy::step`] takes the sample
//! indices of one global batch and reads top-down in every implementation: shard the batch
//! → forward/backward per rank (micro-batches weighted by their share of the global batch) →
//! synchronise gradients → optimizer step → statistics. Because the weighting is exact, `k`
//! steps with any strategy match `k` steps of single-device training on the same global
//! batches (the equivalence tests in `tests/`).

mod agree;
mod build;
mod capability;
mod data_parallel;
mod ddp;
mod error;
mod exchange;
mod facts;
mod handover;
mod kind;
pub(crate) mod launch;
mod micro_batch;
mod optimizer;
mod pipeline;
mod ranks;
mod single;
mod tensor;
mod threads;

use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

// The settings each strategy runs with are the plan's vocabulary; their paths here stay.
pub use crate::plan::{
    AutoConfig, ConfigError, DataParallelConfig, DdpConfig, PipelineConfig, Schedule, ShardState,
    SingleConfig, StrategyConfigs, StrategyKind, TensorConfig,
};
pub use build::build;
pub use capability::StrategyModel;
pub use data_parallel::DataParallel;
pub use ddp::Ddp;
pub use error::{RankError, RankFailure, StrategyError};
pub use optimizer::{OptimizerSpec, PerformanceSpec};
pub use pipeline::{Action, Pipeline, PipelineSupport, peak_live};
pub use single::Single;
pub use tensor::{Tensor, TensorSupport};

use crate::collective::CollectiveCounters;
use crate::model::TrainModel;
use crate::optim::{GuardReport, OptimizerState};
use crate::tensor_parallel::TpTraffic;

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
    /// Whether a process of the run asked to stop before this step
    /// ([`Strategy::ask_stop`]): every process learns it with this step, so that all stop
    /// after the same one.
    pub stop: bool,
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
    /// Bytes of the parameters the rank holds (its replica, stage or shard), frozen ones
    /// included.
    pub param_bytes: u64,
    /// Bytes of the reduced gradients the rank holds for its optimizer step: its trainable
    /// parameters', or under ZeRO-2 (`shard_state = "gradients"`) its own parameters'. (Burn's
    /// backward returns every gradient at once, so the backward's own gradients are whole
    /// until the reduction consumes them, bucket by bucket, under every stage.)
    pub grad_bytes: u64,
    /// Bytes of the rank's optimizer state (tensor data, e.g. AdamW's two moments), measured
    /// after the first step; 0 before.
    pub optimizer_bytes: u64,
    /// The traffic of the rank's tensor-parallel group (inside forward and backward); zero
    /// without tensor parallelism.
    pub shard_traffic: TpTraffic,
    /// Most bytes the rank held at once since it started, where its tensors live: its
    /// parameters, gradients, optimizer state, activations and buffers (see
    /// [`memory`](crate::memory)). On the CPU, the host memory its threads allocated; on a
    /// device with memory of its own (CUDA, wgpu), the device memory CubeCL held for it, as a
    /// watch read it ([`memory::device`](crate::memory::device)). `None` when the process does
    /// not count its memory (its global allocator is not [`Counted`](crate::memory::Counted),
    /// or `KILN_COUNT_MEMORY` is not `1`).
    pub peak_bytes: Option<u64>,
    /// Bytes the rank held after its last step (or its start), counted on the host as
    /// [`Self::peak_bytes`] is: what it keeps between steps, its parameters, optimizer state
    /// and buffers. `None` when not counted, and on a device with memory of its own, whose
    /// watch reads peaks only.
    pub held_bytes: Option<u64>,
}

impl RankStats {
    /// The times spent since `earlier` (the same rank's stats at an earlier moment): how
    /// benchmarks leave out their warm-up steps. Counts and peaks stay this moment's.
    pub fn since(&self, earlier: &RankStats) -> RankStats {
        RankStats {
            compute: self.compute.saturating_sub(earlier.compute),
            communication: self.communication.saturating_sub(earlier.communication),
            idle: self.idle.saturating_sub(earlier.idle),
            shard_traffic: TpTraffic {
                calls: self
                    .shard_traffic
                    .calls
                    .saturating_sub(earlier.shard_traffic.calls),
                elements: (self.shard_traffic.elements)
                    .saturating_sub(earlier.shard_traffic.elements),
                time: self
                    .shard_traffic
                    .time
                    .saturating_sub(earlier.shard_traffic.time),
            },
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
    /// Elements the rank contributed to its collectives: its input to each group operation
    /// (an all-reduce's buckets, a broadcast's buffer) and what it sent.
    pub collective_elements: u64,
    /// Bytes of the parameters the rank holds.
    pub param_bytes: u64,
    /// Bytes of the reduced gradients the rank holds for its optimizer step (see
    /// [`RankStats::grad_bytes`]).
    pub grad_bytes: u64,
    /// Bytes of the rank's optimizer state (after the first step).
    pub optimizer_bytes: u64,
    /// Calls of the rank's tensor-parallel group (0 without tensor parallelism).
    pub tp_calls: u64,
    /// Elements the rank sent into its tensor-parallel group.
    pub tp_elements: u64,
    /// Seconds in tensor-parallel calls, inside forward and backward.
    pub tp_communication_s: f64,
    /// Most bytes the rank held at once, on the host or on its device
    /// ([`RankStats::peak_bytes`]); `null` when not counted.
    pub peak_bytes: Option<u64>,
    /// Bytes the rank held after its last step, on the host ([`RankStats::held_bytes`]);
    /// `null` when not counted.
    #[serde(default)]
    pub held_bytes: Option<u64>,
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
            collective_elements: s.collective.elements,
            param_bytes: s.param_bytes,
            grad_bytes: s.grad_bytes,
            optimizer_bytes: s.optimizer_bytes,
            tp_calls: s.shard_traffic.calls,
            tp_elements: s.shard_traffic.elements,
            tp_communication_s: s.shard_traffic.time.as_secs_f64(),
            peak_bytes: s.peak_bytes,
            held_bytes: s.held_bytes,
        }
    }
}

/// A way of training one model on one or more devices.
///
/// `M` is the model and `B` its autodiff backend. Implementations: [`Single`],
/// [`DataParallel`], [`Ddp`], [`Pipeline`], [`Tensor`]; build one directly, or from a
/// resolved [`Plan`](crate::plan::Plan) with [`build`].
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

    /// Whether some of the strategy's ranks live in other processes: then [`Self::model`] and
    /// [`Self::optimizer_state`] gather through the collective, and every process must call
    /// them at the same points (as [`fit`](crate::fit::fit) does).
    fn spans_processes(&self) -> bool {
        false
    }

    /// This process asks the run to stop (a signal arrived). Returns `true` when the caller
    /// may stop now, after the step it just took: one process, the default. A strategy whose
    /// ranks span processes returns `false` and carries the request with its next step, after
    /// which every process's [`StepOutput::stop`] says to stop: processes that stopped after
    /// different steps would wait for each other forever.
    fn ask_stop(&mut self) -> bool {
        true
    }

    /// Replaces every rank's optimizer state with `state`, saved by a strategy of the same
    /// [`StateLayout`](crate::optim::StateLayout) over the same model.
    ///
    /// # Errors
    /// [`StrategyError::State`] for a state of another layout or optimizer; a rank failure.
    fn load_optimizer_state(&mut self, state: &OptimizerState) -> Result<(), StrategyError>;
}

/// The ranks that run the shards of [`Tensor`]: Ddp's without stages, the pipeline's with them.
/// Beyond being a strategy over the sharded model, they hand back every shard.
pub(crate) trait Engine<B: AutodiffBackend, M: TrainModel<B>>: Strategy<B, M> {
    /// The model of every tensor-parallel shard of the first replica, in shard order (one
    /// model without shards).
    fn shard_models(&self) -> Result<Vec<M>, StrategyError>;
}

impl<B: AutodiffBackend, M: TrainModel<B>> Engine<B, M> for Ddp<B, M> {
    fn shard_models(&self) -> Result<Vec<M>, StrategyError> {
        Ddp::shard_models(self)
    }
}

impl<B: AutodiffBackend, M: crate::model::PipelineModel<B>> Engine<B, M> for Pipeline<B, M> {
    fn shard_models(&self) -> Result<Vec<M>, StrategyError> {
        Pipeline::shard_models(self)
    }
}
