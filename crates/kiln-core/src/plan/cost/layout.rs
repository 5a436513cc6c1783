//! What the cost model answers about a layout: the layout itself, a device's memory, the
//! step's time by part.

use serde::{Deserialize, Serialize};

use crate::plan::ShardState;

/// How a step runs: the mesh and how each replica's share of the batch is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Replicas.
    pub dp: usize,
    /// Pipeline stages.
    pub pp: usize,
    /// Tensor-parallel shards.
    pub tp: usize,
    /// Micro-batches per replica and step (pipeline micro-batches, or gradient accumulation
    /// without stages).
    pub micro_batches: usize,
    /// Samples per micro-batch.
    pub micro_batch: usize,
    /// The forward is recomputed in the backward. With stages, each stage keeps only its
    /// micro-batches' inputs and recomputes its whole forward (Kiln's
    /// `[parallel.pipeline] recompute`). Without, the model keeps each block's input and
    /// recomputes one block at a time (gradient checkpointing, `kiln finetune
    /// --gradient-checkpointing`), which only a workload that
    /// [recomputes its blocks](super::Workload::recomputes_blocks) does.
    pub recompute: bool,
    /// What the replicas split among themselves (`ddp`'s ZeRO stage, `shard_state`): plain
    /// replicas only (`pp = tp = 1`). Parameters split with [`Self::recompute`] are gathered one
    /// block at a time as the model runs it (`gather_units`); without it, whole before the
    /// forward.
    #[serde(default)]
    pub shard_state: ShardState,
    /// How the blocks are cut into the stages (with stages only; [`StageSplit::Even`] without).
    #[serde(default)]
    pub split: StageSplit,
}

impl Layout {
    /// Its recomputation as the plan's lines say it: ", recomputed" for stages, ", blocks
    /// recomputed" one block at a time without them, nothing without recomputation.
    pub fn recomputation(&self) -> &'static str {
        match (self.recompute, self.pp > 1) {
            (false, _) => "",
            (true, true) => ", recomputed",
            (true, false) => ", blocks recomputed",
        }
    }
}

/// How a pipeline's blocks are cut into its stages, as the planner chooses them.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum StageSplit {
    /// The same number of blocks on every stage, the first ones taking the remainder: Kiln's
    /// default where nothing else is known.
    #[default]
    Even,
    /// The busiest stage's time as low as the blocks allow, counting the embeddings on the
    /// first stage and the head and the loss on the last, with every stage within its devices'
    /// memory; among splits as fast, the one whose fullest device is the least full.
    Balanced,
    /// Each stage, in order, takes as many blocks as its devices' memory holds, leaving one for
    /// each stage after it (Accelerate's `device_map="sequential"`).
    Sequential,
}

impl StageSplit {
    /// Every split, the default first.
    pub const ALL: [StageSplit; 3] = [Self::Even, Self::Balanced, Self::Sequential];

    /// Its name, as the configuration and the tables spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Even => "even",
            Self::Balanced => "balanced",
            Self::Sequential => "sequential",
        }
    }
}

/// Bytes one device holds at its most: of all devices, the one nearest its limit (on equal
/// devices the first stage's, which holds the most micro-batches, or the last's, the head).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// The device, by rank (the mesh is `dp × pp × tp`, `tp` innermost).
    #[serde(default)]
    pub device: usize,
    /// Its share of the weights.
    pub weights: f64,
    /// Gradients, optimizer moments and master copies of its trainable share.
    pub trainable_state: f64,
    /// Activations kept for the backward: its blocks', for the micro-batches in flight.
    pub activations: f64,
    /// The flat copy of its gradients that data parallelism packs into buckets to all-reduce
    /// them (Kiln's `grads::BucketPlan`, as PyTorch's DDP): 0 without replicas. Where the
    /// ranks share one memory, a second copy: the reduced buckets every replica reads
    /// ([`Cluster::bucket_copies`]).
    #[serde(default)]
    pub buckets: f64,
    /// All of it, with the workload's `fixed_bytes`.
    pub total: f64,
}

/// Seconds of one optimizer step, by part.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepTime {
    /// Forward and backward passes of the busiest device: its FLOPs over its speed, or its
    /// [`Measured`](super::Measured) costs.
    pub compute: f64,
    /// The optimizer's update of the device's parameters (measured devices only; a large
    /// model's update is a sliver of its step).
    #[serde(default)]
    pub update: f64,
    /// Stages waiting for the pipeline to fill and drain.
    pub bubble: f64,
    /// The replicas' collectives: the gradients' all-reduce, or under ZeRO the reduction to
    /// each owner and the owners' broadcasts of their parameters (after the step, or as
    /// ZeRO-3's gathers).
    pub data_parallel: f64,
    /// The shards' all-reduces inside every block, forward and backward.
    pub tensor_parallel: f64,
    /// Activations and their gradients between stages.
    pub pipeline: f64,
    /// Every device's facts of the step (loss, samples, times) gathered over all of them:
    /// one small collective a step; on a measured machine, with the ranks' measured
    /// [`rendezvous`](super::Measured::rendezvous).
    #[serde(default)]
    pub sync: f64,
    /// The step.
    pub total: f64,
}
