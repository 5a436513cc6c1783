//! One layout's memory per device and step time, from the workload and the cluster.
//!
//! The arithmetic is Megatron-LM's and torchtitan's back-of-the-envelope model: a device holds
//! `1 / (pp · tp)` of the weights and trainable state and its stage's activations for the
//! micro-batches in flight; a step costs the busiest device's three forward passes of FLOPs
//! (or, for a model timed here, its [`Measured`](super::Measured) costs), plus the pipeline
//! bubble, plus each collective over its slowest link (a ring between devices of their own,
//! Kiln's in-process rendezvous between ranks sharing a CPU), without overlap with compute (an
//! upper bound where a framework overlaps).

use serde::{Deserialize, Serialize};

use super::{Cluster, Workload};

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
    /// Stages keep only each micro-batch's input and recompute their forward in the backward
    /// (Kiln's `[parallel.pipeline] recompute`; with stages only).
    pub recompute: bool,
    /// The replicas split the optimizer state (ZeRO-1, `ddp`'s `shard_state = "optimizer"`):
    /// plain replicas only (`pp = tp = 1`).
    #[serde(default)]
    pub split_optimizer: bool,
}

/// Bytes per trainable parameter that replicas splitting the optimizer state divide among
/// themselves: AdamW's two f32 moments. Kiln's master weights are the model's own f32
/// parameters, which every replica holds whole.
const MOMENT_BYTES: f64 = 8.0;

/// Bytes per trainable parameter a device keeps besides its weight: all of the workload's
/// ([`Workload::trainable_extra_bytes`]) less its part of the moments the replicas split.
fn kept_extra_bytes(work: &Workload, layout: &Layout) -> f64 {
    let extra = work.trainable_extra_bytes;
    match layout.split_optimizer && layout.dp > 1 {
        true => {
            let moments = MOMENT_BYTES.min(extra - work.gradient_bytes).max(0.0);
            extra - moments * (1.0 - 1.0 / layout.dp as f64)
        }
        false => extra,
    }
}

/// Bytes one device holds at its most (the first stage's, which holds the most micro-batches).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Memory {
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
    /// The gradients' all-reduce over the replicas, and the owners' broadcast of what they
    /// stepped when the replicas split the optimizer state.
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

/// The device memory `layout` needs for `work` on `cluster`: its most loaded device's, the
/// first stage's (the embeddings, the most micro-batches in flight) or the last's (the head).
pub fn memory(work: &Workload, cluster: &Cluster, layout: &Layout) -> Memory {
    let (embedding, head) = (work.embedding_params as f64, work.head_params as f64);
    let per_block_params = (work.params as f64 - embedding - head) / work.layers as f64;
    let trainable_share = work.trainable as f64 / work.params.max(1) as f64;
    let per_block = work.block_activation_bytes[layout.tp - 1];
    let micro_batch = layout.micro_batch as f64;
    let stage = |s: usize, edges: f64, in_flight: f64| {
        let blocks = stage_blocks(work.layers, layout.pp, s) as f64;
        let params = per_block_params * blocks / layout.tp as f64 + edges;
        let weights = params * work.weight_bytes;
        let trainable_state = params * trainable_share * kept_extra_bytes(work, layout);
        let buckets = match layout.dp > 1 {
            true => gradients(work, layout, trainable_state) * cluster.bucket_copies(),
            false => 0.0,
        };
        let kept = per_block * blocks * micro_batch;
        // A pipeline stage holds more than its blocks' share while a micro-batch passes
        // through it (the workload's measured `stage_activation_scale`): once, however many
        // micro-batches are in flight (a stage of 2 micro-batches of 24 in flight held less
        // than one of 48).
        let passing = match layout.pp > 1 {
            true => kept * (work.stage_activation_scale - 1.0),
            false => 0.0,
        };
        let activations = passing
            + match layout.recompute {
                // The inputs of the micro-batches in flight, and one micro-batch's stage
                // recomputed.
                true => work.boundary_bytes * micro_batch * in_flight + kept,
                false => kept * in_flight,
            };
        Memory {
            weights,
            trainable_state,
            activations,
            buckets,
            total: weights + trainable_state + activations + buckets + work.fixed_bytes,
        }
    };
    if layout.pp == 1 {
        return stage(0, embedding + head, 1.0);
    }
    // 1F1B: the first stage holds up to `pp` micro-batches' activations, the last one.
    let first = stage(0, embedding, layout.micro_batches.min(layout.pp) as f64);
    let last = stage(layout.pp - 1, head, 1.0);
    match first.total >= last.total {
        true => first,
        false => last,
    }
}

/// Bytes of the gradients within `trainable_state` (a device's gradients, moments and master
/// copies under `layout`): what its replicas all-reduce.
fn gradients(work: &Workload, layout: &Layout, trainable_state: f64) -> f64 {
    trainable_state / kept_extra_bytes(work, layout).max(f64::MIN_POSITIVE) * work.gradient_bytes
}

/// Seconds for every replica to receive the `bytes` of parameters their owners stepped, when
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

/// The blocks stage `s` of `pp` holds: Kiln cuts `layers` evenly and gives the first stages
/// the remainder. Every part of the cost model that asks which blocks a stage holds asks here.
fn stage_blocks(layers: usize, pp: usize, s: usize) -> usize {
    layers / pp + usize::from(s < layers % pp)
}

/// What one device of stage `s` does of the whole model's work, as shares of it.
#[derive(Debug, Clone, Copy)]
struct Share {
    /// Of the FLOPs (tensor parallelism splits a block's among its shards).
    flops: f64,
    /// Of the ops (a block or the head each count one; tensor parallelism splits an op's
    /// size, not the op).
    ops: f64,
    /// Of the parameters.
    params: f64,
}

/// The share of the whole model's work of each device of stage `s` of `layout`: its blocks
/// (split over `tp`, but for their `unsplit` share of per-sample work, whole on every shard),
/// the embeddings on the first stage, the head on the last (whole on every shard).
fn stage_share(work: &Workload, layout: &Layout, s: usize, unsplit: f64) -> Share {
    let layers = work.layers as f64;
    let (first, last) = (s == 0, s + 1 == layout.pp);
    let blocks = stage_blocks(work.layers, layout.pp, s) as f64;
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

/// The time of one step of `work` laid out as `layout` on `cluster`.
pub fn step_time(work: &Workload, cluster: &Cluster, layout: &Layout) -> StepTime {
    let Layout {
        dp,
        pp,
        tp,
        micro_batches,
        micro_batch,
        recompute,
        split_optimizer,
    } = *layout;
    // A forward, the backward, and with recomputation a second forward.
    let passes = 1.0 + work.backward_passes + if recompute { 1.0 } else { 0.0 };
    // Seconds of the whole model on one device: per sample, per micro-batch, per update.
    let (per_sample, per_micro_batch, per_update) = match &cluster.measured {
        Some(m) => (
            m.per_sample * passes / (1.0 + work.backward_passes),
            m.per_micro_batch,
            m.per_update,
        ),
        None => (passes * work.forward_flops / cluster.flops(), 0.0, 0.0),
    };
    let company = cluster.company();
    // One micro-batch's forward and backward, and the update, on a device of each stage.
    let work_of = |share: &Share| {
        let micro =
            company * (share.ops * per_micro_batch + share.flops * per_sample * micro_batch as f64);
        (micro, company * share.params * per_update)
    };
    let unsplit = cluster.measured.as_ref().map_or(0.0, |m| m.tp_unsplit);
    let shares: Vec<Share> = (0..pp)
        .map(|s| stage_share(work, layout, s, unsplit))
        .collect();
    let stages: Vec<(f64, f64)> = shares.iter().map(work_of).collect();
    // The busiest stage sets the pace: the longest of its micro-batches, through the bubble,
    // and its update.
    let path = |&(micro, update): &(f64, f64)| micro * (micro_batches + pp - 1) as f64 + update;
    let (stage, mut update) = stages
        .iter()
        .copied()
        .max_by(|a, b| path(a).total_cmp(&path(b)))
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
    // The most loaded device's gradients (every replica group all-reduces at once).
    let grads = gradients(work, layout, memory(work, cluster, layout).trainable_state);
    let (bw, lat) = link(cluster, pp * tp, dp);
    // Replicas that split the optimizer state then receive the parameters they do not own.
    let owners = match split_optimizer {
        true => broadcast(cluster, grads, dp, (bw, lat)),
        false => 0.0,
    };
    let data_parallel = all_reduce(cluster, grads, dp, (bw, lat)) + owners;
    // The first stage has the most blocks.
    let blocks = stage_blocks(work.layers, pp, 0) as f64;
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
