//! One layout's memory per device and step time, from the workload and the cluster.
//!
//! The arithmetic is Megatron-LM's and torchtitan's back-of-the-envelope model: a device holds
//! `1 / (pp · tp)` of the weights and trainable state and its stage's activations for the
//! micro-batches in flight; a step costs the busiest device's three forward passes of FLOPs
//! (or, for a model timed here, its [`Measured`](super::Measured) costs), plus the pipeline
//! bubble, plus each collective over its slowest link (a ring between devices of their own,
//! Kiln's in-process rendezvous between ranks sharing a CPU), without overlap with compute (an
//! upper bound where a framework overlaps).

use super::layout::{Layout, Memory, StepTime};
use super::stage_cost::{
    PARAMETER_BYTES, gathered_bytes, gathers_blocks, gradients, shard_state, stage_memory,
    stage_path, stage_seconds,
};
use super::stages::{self, stage_limit};
use super::{Cluster, Workload};
use crate::plan::ShardState;

/// The device memory `layout` needs for `work` on `cluster`: that of the device nearest its
/// limit (on equal devices, the first stage's, with the embeddings and the most micro-batches
/// in flight, or the last's, with the head).
pub fn memory(work: &Workload, cluster: &Cluster, layout: &Layout) -> Memory {
    memory_with(
        work,
        cluster,
        layout,
        &stages::blocks(work, cluster, layout),
    )
}

/// [`memory`] with the stages holding `blocks` (one entry a stage), whatever `layout.split`
/// would cut: for a layout that ran with a cut chosen under another calibration.
pub fn memory_with(
    work: &Workload,
    cluster: &Cluster,
    layout: &Layout,
    blocks: &[usize],
) -> Memory {
    let fullness = |m: &Memory| m.total / cluster.usable(m.device);
    // The first of the fullest: stage 0 where stages tie.
    stage_memories(work, cluster, layout, blocks)
        .into_iter()
        .rev()
        .max_by(|a, b| fullness(a).total_cmp(&fullness(b)))
        .expect("a layout has a stage")
}

/// The memory of each stage of `layout` (one entry without stages), in stage order, each for
/// the stage's device with the least room ([`Memory::device`]).
pub fn memory_by_stage(work: &Workload, cluster: &Cluster, layout: &Layout) -> Vec<Memory> {
    stage_memories(
        work,
        cluster,
        layout,
        &stages::blocks(work, cluster, layout),
    )
}

/// The memory of each stage of `layout` holding `blocks`, as [`memory_by_stage`].
fn stage_memories(
    work: &Workload,
    cluster: &Cluster,
    layout: &Layout,
    blocks: &[usize],
) -> Vec<Memory> {
    blocks
        .iter()
        .enumerate()
        .map(|(s, &n)| Memory {
            device: stage_limit(cluster, layout, s).0,
            ..stage_memory(work, cluster, layout, s, n)
        })
        .collect()
}

/// Seconds for every replica to receive the `bytes` of parameters their owners hold, when
/// the replicas split the optimizer state: one broadcast per owner's part. Over a ring each
/// part is pipelined around it once (every link carries every byte once, and each part pays
/// the ring's `n - 1` hops); between ranks sharing a CPU, each part is a meeting after which
/// every other rank copies it.
fn broadcast(cluster: &Cluster, bytes: f64, n: usize, (bandwidth, latency): (f64, f64)) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let n_f = n as f64;
    match cluster.cores.is_some() {
        true => n_f * latency + (n_f - 1.0) / n_f * bytes / bandwidth,
        false => bytes / bandwidth + n_f * (n_f - 1.0) * latency,
    }
}

/// Seconds for each of `n` owners to receive the sum of its part of `bytes` (ZeRO-2's and
/// ZeRO-3's reduction): over a ring, a reduce-scatter (`n - 1` steps, each moving `bytes / n`
/// over each link: half an all-reduce's traffic); between ranks sharing a CPU, a meeting per
/// owner, each owner summing its part of the `n` tensors.
fn reduce_scatter(
    cluster: &Cluster,
    bytes: f64,
    n: usize,
    (bandwidth, latency): (f64, f64),
) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let n_f = n as f64;
    match cluster.cores.is_some() {
        true => n_f * latency + (n_f - 1.0) / n_f * bytes / bandwidth,
        false => (n_f - 1.0) / n_f * bytes / bandwidth + (n_f - 1.0) * latency,
    }
}

/// Seconds of the replicas' collectives in a step of `layout`, whose busiest device reduces
/// `grads` bytes of gradients, by what the replicas split:
/// - nothing: the gradients' all-reduce;
/// - the optimizer state (ZeRO-1): the all-reduce, then each owner's broadcast of the
///   parameters it stepped, as the forward reads them (the compute dtype's copy under mixed
///   precision);
/// - the gradients (ZeRO-2): each owner's reduction (half an all-reduce's traffic), then the
///   broadcast;
/// - the parameters gathered whole (ZeRO-3): the reduction, and the owners' f32 parameters
///   gathered before the forward;
/// - the parameters gathered one block at a time: the reduction, and every block gathered
///   for its forward and again for its recomputation, 1.5 all-reduces' traffic.
fn data_parallel(
    work: &Workload,
    cluster: &Cluster,
    layout: &Layout,
    grads: f64,
    link: (f64, f64),
) -> f64 {
    let dp = layout.dp;
    let params = grads / work.gradient_bytes.max(f64::MIN_POSITIVE);
    let sent = broadcast(cluster, params * gathered_bytes(work), dp, link);
    match (shard_state(layout), gathers_blocks(layout)) {
        (ShardState::None, _) => all_reduce(cluster, grads, dp, link),
        (ShardState::Optimizer, _) => all_reduce(cluster, grads, dp, link) + sent,
        (ShardState::Gradients, _) => reduce_scatter(cluster, grads, dp, link) + sent,
        (ShardState::Parameters, false) => {
            reduce_scatter(cluster, grads, dp, link)
                + broadcast(cluster, params * PARAMETER_BYTES, dp, link)
        }
        (ShardState::Parameters, true) => reduce_scatter(cluster, grads, dp, link) + 2.0 * sent,
    }
}

/// Seconds of an all-reduce of `bytes` among `n` devices over a link of `bandwidth` and
/// `latency`: a ring between devices of their own (`2 (n - 1)` steps, each moving `bytes / n`
/// over each link); between ranks sharing a CPU (`cluster.cores`), Kiln's in-process
/// rendezvous, where the ranks meet once (one latency: the last to arrive wakes the others)
/// and the `n` tensors are summed in memory.
fn all_reduce(cluster: &Cluster, bytes: f64, n: usize, (bandwidth, latency): (f64, f64)) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    if cluster.cores.is_some() {
        return latency + (n - 1) as f64 * bytes / bandwidth;
    }
    let steps = 2.0 * (n - 1) as f64;
    steps / n as f64 * bytes / bandwidth + steps * latency
}

/// Bytes of a step's facts (loss, samples, times and running totals of every rank) that every
/// rank gathers once a step (`strategy/facts.rs`): a few hundred bytes a rank.
const FACT_BYTES: f64 = 256.0;

/// The all-reduces a tensor-parallel block makes per micro-batch: Megatron-LM's two each way
/// (after attention and after the MLP, forward and backward).
pub const TP_CALLS_PER_BLOCK: usize = 4;

/// The link of a group of `n` devices `stride` ranks apart (the mesh is `dp × pp × tp`, `tp`
/// innermost): the machine's own when every such group lies in one machine (the groups tile
/// the machines), the network otherwise.
fn link(cluster: &Cluster, stride: usize, n: usize) -> (f64, f64) {
    let span = stride * n;
    match span <= cluster.per_node && cluster.per_node.is_multiple_of(span) {
        true => (cluster.intra_bandwidth, cluster.intra_latency),
        false => (cluster.inter_bandwidth, cluster.inter_latency),
    }
}

/// The time of one step of `work` laid out as `layout` on `cluster`.
pub fn step_time(work: &Workload, cluster: &Cluster, layout: &Layout) -> StepTime {
    step_time_with(
        work,
        cluster,
        layout,
        &stages::blocks(work, cluster, layout),
    )
}

/// [`step_time`] with the stages holding `blocks` (one entry a stage), whatever `layout.split`
/// would cut: for a layout that ran with a cut chosen under another calibration.
pub fn step_time_with(
    work: &Workload,
    cluster: &Cluster,
    layout: &Layout,
    blocks: &[usize],
) -> StepTime {
    let Layout {
        dp,
        pp,
        tp,
        micro_batches,
        micro_batch,
        ..
    } = *layout;
    // One micro-batch's forward and backward, and the update, on a device of each stage.
    let stages: Vec<(f64, f64)> = blocks
        .iter()
        .enumerate()
        .map(|(s, &n)| stage_seconds(work, cluster, layout, s, n))
        .collect();
    // The busiest stage sets the pace: the longest of its micro-batches, through the bubble,
    // and its update.
    let (stage, mut update) = stages
        .iter()
        .copied()
        .max_by(|a, b| stage_path(layout, *a).total_cmp(&stage_path(layout, *b)))
        .expect("a layout has a stage");
    let mut compute = stage * micro_batches as f64;
    // 1F1B: the busiest stage waits `pp - 1` micro-batches' worth while the pipeline fills
    // and drains.
    let mut bubble = stage * (pp - 1) as f64;
    // Ranks beyond the cores take turns (`Cluster::crowding`): the most crowded core runs
    // that many ranks' work, an average rank's. A stage's wait in the bubble is then another
    // rank's turn, so the step is the longer of its critical path and the crowded core's
    // work.
    let crowding = cluster.crowding();
    if crowding > 1.0 {
        let ranks = (pp * tp) as f64;
        let replica: f64 = stages
            .iter()
            .map(|(micro, update)| tp as f64 * (micro * micro_batches as f64 + update))
            .sum();
        let turns = crowding * replica / ranks;
        let stretch = (turns / (compute + update + bubble)).max(1.0);
        compute *= stretch;
        update *= stretch;
        bubble *= stretch;
    }
    // The most loaded device's gradients (every replica group reduces at once).
    let grads = gradients(work, layout, memory(work, cluster, layout).trainable_state);
    let data_parallel = data_parallel(work, cluster, layout, grads, link(cluster, pp * tp, dp));
    // The stage of the most blocks makes the most calls.
    let blocks = blocks.iter().copied().max().unwrap_or(0) as f64;
    let (bw, lat) = link(cluster, 1, tp);
    // Four all-reduces a block, each of a quarter of `tp_bytes`, each a meeting of the shards'
    // threads mid-block; where ranks outnumber the cores, each also waits for its turns.
    let per_call = work.tp_bytes / 4.0 * micro_batch as f64;
    let meeting = match (tp, &cluster.measured) {
        (2.., Some(m)) => m.tp_call * crowding.max(1.0),
        _ => 0.0,
    };
    let tensor_parallel = blocks
        * micro_batches as f64
        * TP_CALLS_PER_BLOCK as f64
        * (all_reduce(cluster, per_call, tp, (bw, lat)) + meeting);
    let devices = dp * pp * tp;
    let rendezvous = match (devices, &cluster.measured) {
        (2.., Some(m)) => m.rendezvous,
        _ => 0.0,
    };
    let sync = rendezvous
        + all_reduce(
            cluster,
            FACT_BYTES * devices as f64,
            devices,
            link(cluster, 1, devices),
        );
    let pipeline = match pp {
        1 => 0.0,
        _ => {
            let (bw, lat) = link(cluster, tp, pp);
            let handoff = cluster.measured.as_ref().map_or(0.0, |m| m.handoff);
            let transfer = work.boundary_bytes * micro_batch as f64 / bw + lat + handoff;
            // Each micro-batch's activation forward and its gradient back, on the critical
            // path of the last stage; where ranks outnumber the cores, the two stages of a
            // hand-off each wait for their turn, as shards meeting mid-block do (2 replicas
            // of 2 stages on 2 cores: 17 % under without, the MLP; half a turn on average fit
            // a quiet machine better and a busy one worse: the book's planning chapter).
            2.0 * micro_batches as f64 * transfer * crowding.max(1.0)
        }
    };
    StepTime {
        compute,
        update,
        bubble,
        data_parallel,
        tensor_parallel,
        pipeline,
        sync,
        total: compute + update + bubble + data_parallel + tensor_parallel + pipeline + sync,
    }
}
