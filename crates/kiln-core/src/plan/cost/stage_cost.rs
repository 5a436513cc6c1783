//! What one device of one stage holds and does, for a given number of blocks: the pieces
//! that the stage splits ([`super::stages`]) weigh and the whole layout's estimates
//! ([`super::estimate`]) add up.
//!
//! Both are linear in the stage's blocks (a block's weights, state, activations and FLOPs,
//! plus the edges the stage carries: the embeddings on the first, the head and the loss on
//! the last), which the splits rely on.

use super::layout::{Layout, Memory};
use super::{Cluster, Workload};
use crate::plan::ShardState;

/// Bytes per trainable parameter of AdamW's two f32 moments: what every ZeRO stage splits.
const MOMENT_BYTES: f64 = 8.0;

/// Bytes per trainable parameter of its f32 master copy where the weights are copies in a
/// lower precision (mixed precision): what the workload keeps besides the gradient and the
/// moments. 0 in f32, where the weights are the parameters themselves.
fn master_bytes(work: &Workload) -> f64 {
    (work.trainable_extra_bytes - work.gradient_bytes - MOMENT_BYTES).max(0.0)
}

/// Bytes of a trainable parameter as the model holds it: f32, the master copy under mixed
/// precision (what ZeRO-3's gather before the forward moves).
pub(super) const PARAMETER_BYTES: f64 = 4.0;

/// Bytes per trainable parameter that an owner's broadcast after its step, or a block's
/// gather, moves: its weight as the forward reads it (a low-precision copy under mixed
/// precision, the f32 parameter otherwise).
pub(super) fn gathered_bytes(work: &Workload) -> f64 {
    match master_bytes(work) > 0.0 {
        true => work.weight_bytes,
        false => PARAMETER_BYTES,
    }
}

/// What the replicas of `layout` split: its ZeRO stage where it has replicas and neither
/// stages nor shards (Kiln's ZeRO is `ddp`'s), nothing otherwise.
pub(super) fn shard_state(layout: &Layout) -> ShardState {
    match layout.dp > 1 && layout.pp == 1 && layout.tp == 1 {
        true => layout.shard_state,
        false => ShardState::None,
    }
}

/// Whether the replicas hold their own parameters and one block at a time through the step:
/// ZeRO-3 in a model that recomputes its blocks (`gather_units`). Gathered whole before the
/// forward, the parameters stand whole at the peak, as under ZeRO-2.
pub(super) fn gathers_blocks(layout: &Layout) -> bool {
    shard_state(layout).splits_parameters() && layout.recompute
}

/// Bytes per trainable parameter a device keeps besides its weight: all of the workload's
/// ([`Workload::trainable_extra_bytes`]) less its part of what the replicas split. Burn's
/// backward returns every gradient at once, so the whole gradients stand at the peak under
/// every stage (ZeRO-2 and ZeRO-3 cut what a replica holds after the reduction). The f32
/// master copies of mixed precision split with the moments (each replica holds the others'
/// parameters in the compute dtype: `ddp`'s `compute_dtype`, which `fit` sets), but for
/// ZeRO-3 gathered whole, which gathers them for the step.
fn kept_extra_bytes(work: &Workload, layout: &Layout) -> f64 {
    let extra = work.trainable_extra_bytes;
    let moments = MOMENT_BYTES.min(extra - work.gradient_bytes).max(0.0);
    let others = 1.0 - 1.0 / layout.dp as f64;
    let split = match (shard_state(layout), gathers_blocks(layout)) {
        (ShardState::None, _) => 0.0,
        (ShardState::Parameters, false) => moments,
        _ => moments + master_bytes(work),
    };
    extra - split * others
}

/// Bytes of the gradients within `trainable_state` (a device's gradients, moments and master
/// copies under `layout`): what its replicas reduce.
pub(super) fn gradients(work: &Workload, layout: &Layout, trainable_state: f64) -> f64 {
    trainable_state / kept_extra_bytes(work, layout).max(f64::MIN_POSITIVE) * work.gradient_bytes
}

/// Micro-batches whose activations stage `s` holds at once: under 1F1B the first stage up to
/// `pp`, each later one one fewer, the last one; without stages, one (gradient accumulation
/// finishes a micro-batch before the next).
fn in_flight(layout: &Layout, s: usize) -> f64 {
    layout.micro_batches.min(layout.pp - s).max(1) as f64
}

/// The memory of a device of stage `s` of `layout` holding `blocks` blocks.
pub(super) fn stage_memory(
    work: &Workload,
    cluster: &Cluster,
    layout: &Layout,
    s: usize,
    blocks: usize,
) -> Memory {
    let (first, last) = (s == 0, s + 1 == layout.pp);
    let edge = |yes: bool, value: f64| if yes { value } else { 0.0 };
    let edges = edge(first, work.embedding_params as f64) + edge(last, work.head_params as f64);
    let (embedding, head) = (work.embedding_params as f64, work.head_params as f64);
    let per_block_params = (work.params as f64 - embedding - head) / work.layers as f64;
    let trainable_share = work.trainable as f64 / work.params.max(1) as f64;
    let per_block = work.block_activation_bytes[layout.tp - 1];
    let micro_batch = layout.micro_batch as f64;
    let blocks = blocks as f64;
    let params = per_block_params * blocks / layout.tp as f64 + edges;
    let weights = match gathers_blocks(layout) {
        // ZeRO-3 one block at a time: the replica's own trainable part, the frozen rest, one
        // block gathered, and the edges, gathered once for the step. The others' parameters
        // are one-element placeholders, in the compute dtype under mixed precision, which the
        // forward's cast takes as they are.
        true => {
            let own = 1.0 / layout.dp as f64;
            let blocks_params = per_block_params * blocks;
            let split = blocks_params * trainable_share * (1.0 - own);
            let gathered = per_block_params * trainable_share * blocks.min(1.0);
            (params - split + gathered) * work.weight_bytes
        }
        false => params * work.weight_bytes,
    };
    let trainable_state = params * trainable_share * kept_extra_bytes(work, layout);
    let buckets = match layout.dp > 1 {
        true => gradients(work, layout, trainable_state) * cluster.bucket_copies(),
        false => 0.0,
    };
    // The logits and their gradient exist only while one micro-batch passes the head.
    let head_activations = edge(last, work.head_activation_bytes * micro_batch);
    let kept = per_block * blocks * micro_batch;
    // A pipeline stage holds more than its blocks' share while a micro-batch passes through
    // it (the workload's measured `stage_activation_scale`): once, however many micro-batches
    // are in flight (a stage of 2 micro-batches of 24 in flight held less than one of 48).
    let passing = match layout.pp > 1 {
        true => kept * (work.stage_activation_scale - 1.0),
        false => 0.0,
    };
    let in_flight = in_flight(layout, s);
    let activations = head_activations
        + passing
        + match (layout.recompute, layout.pp > 1) {
            // The inputs of the micro-batches in flight, and one micro-batch's stage
            // recomputed.
            (true, true) => work.boundary_bytes * micro_batch * in_flight + kept,
            // Gradient checkpointing: every block's input, and one block recomputed.
            (true, false) => work.boundary_bytes * micro_batch * blocks + per_block * micro_batch,
            (false, _) => kept * in_flight,
        };
    Memory {
        device: 0,
        weights,
        trainable_state,
        activations,
        buckets,
        total: weights + trainable_state + activations + buckets + work.fixed_bytes,
    }
}

/// What one device of a stage does of the whole model's work, as shares of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Share {
    /// Of the FLOPs (tensor parallelism splits a block's among its shards).
    pub flops: f64,
    /// Of the ops (a block or the head each count one; tensor parallelism splits an op's
    /// size, not the op).
    pub ops: f64,
    /// Of the parameters.
    pub params: f64,
}

/// The share of the whole model's work of each device of stage `s` of `layout` holding
/// `blocks` blocks: its blocks (split over `tp`, but for their `unsplit` share of per-sample
/// work, whole on every shard), the embeddings on the first stage, the head on the last
/// (whole on every shard).
pub(super) fn stage_share(
    work: &Workload,
    layout: &Layout,
    s: usize,
    blocks: usize,
    unsplit: f64,
) -> Share {
    let layers = work.layers as f64;
    let (first, last) = (s == 0, s + 1 == layout.pp);
    let blocks = blocks as f64;
    let head = (work.head_flops / work.forward_flops.max(f64::MIN_POSITIVE)).clamp(0.0, 1.0);
    let params = work.params.max(1) as f64;
    let block_params = (params - work.embedding_params as f64 - work.head_params as f64) / layers;
    let edge = |yes: bool, value: f64| if yes { value } else { 0.0 };
    Share {
        flops: blocks * (1.0 - head) / layers * ((1.0 - unsplit) / layout.tp as f64 + unsplit)
            + edge(last, head),
        ops: (blocks + edge(last, 1.0)) / (layers + 1.0),
        params: (blocks * block_params / layout.tp as f64
            + edge(first, work.embedding_params as f64)
            + edge(last, work.head_params as f64))
            / params,
    }
}

/// Seconds of the whole model on one device: per sample, per micro-batch, per update (a
/// model timed here: its [`Measured`](super::Measured) costs; otherwise its FLOPs over the
/// device's speed).
fn model_seconds(work: &Workload, cluster: &Cluster, layout: &Layout) -> [f64; 3] {
    // A forward, the backward, and with recomputation a second forward.
    let passes = 1.0 + work.backward_passes + if layout.recompute { 1.0 } else { 0.0 };
    match &cluster.measured {
        Some(m) => [
            m.per_sample * passes / (1.0 + work.backward_passes),
            m.per_micro_batch,
            m.per_update,
        ],
        None => [passes * work.forward_flops / cluster.flops(), 0.0, 0.0],
    }
}

/// Seconds a device of stage `s` holding `blocks` blocks spends on one micro-batch's forward
/// and backward, and on its update.
pub(super) fn stage_seconds(
    work: &Workload,
    cluster: &Cluster,
    layout: &Layout,
    s: usize,
    blocks: usize,
) -> (f64, f64) {
    let [per_sample, per_micro_batch, per_update] = model_seconds(work, cluster, layout);
    let unsplit = cluster.measured.as_ref().map_or(0.0, |m| m.tp_unsplit);
    let share = stage_share(work, layout, s, blocks, unsplit);
    let company = cluster.company();
    let micro = company
        * (share.ops * per_micro_batch + share.flops * per_sample * layout.micro_batch as f64);
    (micro, company * share.params * per_update)
}

/// The time a stage's device sets the pipeline's pace by: its micro-batches through the
/// bubble, and its update (the busiest stage's is the step's critical path).
pub(super) fn stage_path(layout: &Layout, (micro, update): (f64, f64)) -> f64 {
    micro * (layout.micro_batches + layout.pp - 1) as f64 + update
}
