//! The planner's decisions on described hardware.

use super::*;
use crate::optim::Precision;
use crate::plan::{ShardState, StrategyKind};

/// The transformer the planner's tests on a measured machine use: 4 blocks of width 64, 4
/// heads, an FFN of 256, 16 tokens of a 16-symbol vocabulary.
pub(crate) fn tiny_transformer() -> TransformerShape {
    TransformerShape {
        layers: 4,
        hidden: 64,
        heads: 4,
        kv_heads: 4,
        head_dim: 16,
        qkv_bias: false,
        o_bias: false,
        ffn: 256,
        seq: 16,
        vocab: 16,
        gated: false,
        tied: false,
    }
}

fn shape(layers: usize, hidden: usize, heads: usize, ffn: usize) -> TransformerShape {
    TransformerShape {
        layers,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        qkv_bias: false,
        o_bias: false,
        ffn,
        seq: 4096,
        vocab: 32000,
        gated: true,
        tied: false,
    }
}

fn llama(b: u32) -> TransformerShape {
    match b {
        7 => shape(32, 4096, 32, 11008),
        70 => TransformerShape {
            kv_heads: 8,
            ..shape(80, 8192, 64, 28672)
        },
        _ => unreachable!(),
    }
}

fn h100(devices: usize) -> Cluster {
    Preset::named("h100-sxm")
        .unwrap()
        .cluster(devices, 8.min(devices), DEFAULT_EFFICIENCY)
}

fn work(shape: &TransformerShape, batch: usize) -> Workload {
    Workload::transformer(shape, Precision::Bf16, batch)
}

#[test]
fn one_device_trains_alone() {
    let small = shape(4, 512, 8, 2048);
    let planned = search(&work(&small, 8), &h100(1)).unwrap();
    assert_eq!(planned.chosen().strategy, StrategyKind::Single);
    assert_eq!(planned.candidates.len(), 1);
}

#[test]
fn a_model_that_fits_everywhere_is_replicated() {
    let small = shape(12, 768, 12, 3072);
    let planned = search(&work(&small, 64), &h100(8)).unwrap();
    let chosen = planned.chosen();
    assert_eq!(chosen.strategy, StrategyKind::Ddp, "{}", planned.reason);
    assert_eq!(chosen.layout.dp, 8);
    assert!(
        planned.reason.starts_with("ddp: the fastest of"),
        "{}",
        planned.reason
    );
}

#[test]
fn a_model_too_big_for_one_device_is_split_and_says_why_replicas_were_not_enough() {
    // LLaMA-2 70B (grouped-query attention): Meta reports 68.98 B parameters; at 16 bytes
    // each, 1.1 TB: no device holds a replica.
    let params = llama(70).params() as f64;
    assert!((params - 68.98e9).abs() < 0.05e9, "{params}");
    let planned = search(&work(&llama(70), 512), &h100(64)).unwrap();
    let chosen = planned.chosen();
    assert!(
        chosen.layout.pp * chosen.layout.tp > 1,
        "{}",
        planned.reason
    );
    assert!(matches!(
        chosen.strategy,
        StrategyKind::Pipeline | StrategyKind::Tensor
    ));
    assert!(chosen.memory.total <= 80.0 * (1u64 << 30) as f64 * USABLE_MEMORY);
    let replicas = planned
        .candidates
        .iter()
        .find(|c| c.layout.pp == 1 && c.layout.tp == 1)
        .unwrap();
    let why = replicas.rejected.as_deref().unwrap();
    assert!(
        why.starts_with("needs ") && why.contains("GiB per device"),
        "{why}"
    );
    // Tensor parallelism never spans machines.
    assert!(
        planned
            .candidates
            .iter()
            .filter(|c| c.layout.tp > 8)
            .all(|c| c.rejected.as_deref().unwrap().contains("span machines"))
    );
    // A plausible utilisation, as large runs report (30 to 60 %).
    assert!(
        (0.2..0.6).contains(&chosen.utilisation),
        "{}",
        chosen.utilisation
    );
}

#[test]
fn nothing_fitting_names_the_memory_and_the_devices_that_would() {
    let a100 = Preset::named("a100-40g").unwrap().cluster(2, 2, 0.5);
    let error = search(&work(&llama(70), 8), &a100).unwrap_err();
    let PlanError::NothingFits { needed, fix, .. } = &error else {
        panic!("{error}");
    };
    assert!(*needed > 36.0, "{error}");
    assert!(fix.contains("such devices would fit"), "{error}");
    let text = error.to_string();
    assert!(
        text.starts_with("nothing fits: the smallest layout"),
        "{text}"
    );
}

#[test]
fn qlora_fits_a_7b_model_on_one_24_gib_device_where_full_training_cannot() {
    let seven = llama(7);
    let mut small = Preset::named("a100-40g").unwrap().cluster(1, 1, 0.5);
    small.memory = 24 << 30;
    let short = TransformerShape { seq: 512, ..seven };
    let full = Workload::transformer(&short, Precision::Bf16, 4);
    assert!(matches!(
        search(&full, &small),
        Err(PlanError::NothingFits { .. })
    ));
    let qlora = Workload::lora(&short, Precision::Bf16, 4, 16, true);
    // LoRA rank 16 on every projection of LLaMA-2 7B: 40.0 M adapter weights, as PEFT counts.
    assert_eq!(qlora.trainable, 39_976_960);
    let planned = search(&qlora, &small).unwrap();
    let chosen = planned.chosen();
    assert_eq!(chosen.strategy, StrategyKind::Single);
    // About 3.9 GB of 4-bit base, 0.5 GB of embeddings and head, the adapters' state.
    let weights = chosen.memory.weights / (1u64 << 30) as f64;
    assert!((3.5..5.0).contains(&weights), "{weights} GiB");
}

#[test]
fn what_fits_nowhere_is_said_at_once() {
    // A million tokens a sample: one block's activations for one sample outgrow any device,
    // however many there are; the search for "how many would fit" stops at a million devices.
    let endless = TransformerShape {
        seq: 1 << 20,
        ..llama(7)
    };
    let start = std::time::Instant::now();
    let error = search(&work(&endless, 1024), &h100(3072)).unwrap_err();
    assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
    let text = error.to_string();
    assert!(
        text.contains("devices of") && text.contains("GiB would fit"),
        "{text}"
    );
}

#[test]
fn shards_that_straddle_machines_are_rejected() {
    let six = Preset::named("h100-sxm").unwrap().cluster(12, 6, 0.5);
    let planned = search(&work(&llama(7), 48), &six).unwrap();
    for c in &planned.candidates {
        if c.layout.tp == 4 {
            assert!(
                c.rejected.as_deref().unwrap().contains("span machines"),
                "{c:?}"
            );
        }
    }
}

#[test]
fn replicas_hold_sixteen_bytes_a_parameter_and_their_activations() {
    let seven = llama(7);
    let w = work(&seven, 8);
    let layout = Layout {
        dp: 1,
        pp: 1,
        tp: 1,
        micro_batches: 8,
        micro_batch: 1,
        recompute: false,
        shard_state: ShardState::None,
        split: StageSplit::Even,
    };
    let m = memory(&w, &h100(1), &layout);
    let params = seven.params() as f64;
    assert!((m.weights + m.trainable_state - 16.0 * params).abs() < 1.0);
    // The blocks' activations, and the logits and their gradient of the one sample in the head.
    let head = w.head_activation_bytes;
    assert!((m.activations - 32.0 * seven.block_activation_bytes(1, 2.0) - head).abs() < 1.0);
    // Two stages: the first holds the embedding and half the blocks, and two micro-batches.
    let staged = memory(&w, &h100(2), &Layout { pp: 2, ..layout });
    let first = w.embedding_params as f64 + 16.0 * seven.block_params() as f64;
    assert!((staged.weights - 2.0 * first).abs() < 1.0);
    assert!((staged.activations - (m.activations - head)).abs() < 1.0);
    // Recomputed, a stage keeps its micro-batches' inputs and one micro-batch's blocks: two
    // inputs on the first stage, one on the last, which also holds the sample's logits and is
    // then the fuller.
    let recomputed = memory(
        &w,
        &h100(2),
        &Layout {
            pp: 2,
            recompute: true,
            ..layout
        },
    );
    let expected = w.boundary_bytes + 16.0 * seven.block_activation_bytes(1, 2.0) + head;
    assert!((recomputed.activations - expected).abs() < 1.0);
    assert_eq!(recomputed.device, 1);
}

#[test]
fn replicas_also_hold_their_gradients_packed_into_buckets() {
    let seven = llama(7);
    let alone = Layout {
        dp: 1,
        pp: 2,
        tp: 2,
        micro_batches: 4,
        micro_batch: 1,
        recompute: false,
        shard_state: ShardState::None,
        split: StageSplit::Even,
    };
    let replicated = Layout { dp: 4, ..alone };
    // Full training in bf16: of a parameter's 14 bytes of trainable state, 2 are its bf16
    // gradient.
    let full = work(&seven, 16);
    let gpus = h100(16);
    let (one, four) = (
        memory(&full, &gpus, &alone),
        memory(&full, &gpus, &replicated),
    );
    assert_eq!(one.buckets, 0.0);
    assert!(
        (four.buckets - one.trainable_state * 2.0 / 14.0).abs() < 1.0,
        "{four:?}"
    );
    assert!((four.total - one.total - four.buckets).abs() < 1.0);
    // Ranks sharing one memory read the first replica's reduced buckets: it holds two copies.
    let shared = Cluster {
        cores: Some(16),
        ..gpus.clone()
    };
    let first = memory(&full, &shared, &replicated);
    assert!(
        (first.buckets - 2.0 * four.buckets).abs() < 1.0,
        "{first:?}"
    );
    assert_eq!(memory(&full, &shared, &alone).buckets, 0.0);
    // LoRA: only the adapters' f32 gradients are packed, not the frozen base.
    let short = TransformerShape { seq: 512, ..seven };
    let adapters = Workload::lora(&short, Precision::Bf16, 16, 16, true);
    let whole = Layout {
        pp: 1,
        tp: 1,
        ..replicated
    };
    let m = memory(&adapters, &gpus, &whole);
    assert!(
        (m.buckets - 4.0 * adapters.trainable as f64).abs() < 1.0,
        "{m:?}"
    );
}

#[test]
fn a_stage_holds_its_measured_surplus_once_however_many_micro_batches_are_in_flight() {
    let seven = llama(7);
    let w = Workload {
        stage_activation_scale: 1.25,
        ..work(&seven, 8)
    };
    let kept = 16.0 * seven.block_activation_bytes(1, 2.0);
    // Two micro-batches of one sample in flight on the first stage: both kept, the surplus
    // of one passing.
    let staged = memory(&w, &h100(2), &layout(1, 2, 8, 1));
    assert!((staged.activations - (2.0 + 0.25) * kept).abs() < 1.0);
    // One micro-batch of two samples: the same samples in flight, a surplus twice as large;
    // the last stage, as many blocks and micro-batches in flight, also holds the two samples'
    // logits and their gradient, and is the fuller.
    let whole = memory(&w, &h100(2), &layout(1, 2, 1, 2));
    let head = 2.0 * w.head_activation_bytes;
    assert!((whole.activations - (2.0 + 0.5) * kept - head).abs() < 1.0);
    // Without stages there is no boundary and no surplus.
    let unstaged = memory(&w, &h100(1), &layout(1, 1, 1, 2));
    let blocks = 2.0 * 32.0 * seven.block_activation_bytes(1, 2.0);
    assert!((unstaged.activations - blocks - head).abs() < 1.0);
}

#[test]
fn the_bubble_shrinks_with_micro_batches_and_rings_cost_by_their_link() {
    let w = work(&llama(7), 64);
    let cluster = h100(16);
    let layout = |micro_batches| Layout {
        dp: 2,
        pp: 8,
        tp: 1,
        micro_batches,
        micro_batch: 32 / micro_batches,
        recompute: false,
        shard_state: ShardState::None,
        split: StageSplit::Even,
    };
    let few = step_time(&w, &cluster, &layout(8));
    let many = step_time(&w, &cluster, &layout(32));
    assert!((few.compute - many.compute).abs() < 1e-9);
    assert!((few.bubble - few.compute * 7.0 / 8.0).abs() < 1e-9);
    assert!(many.bubble < few.bubble / 3.0);
    // The replicas are 8 ranks apart: across the two machines, over the network; each
    // all-reduces its stage's gradients (the first stage's: the embedding and 4 blocks).
    let held = w.embedding_params as f64 + 4.0 * llama(7).block_params() as f64;
    let bytes = held * 2.0;
    let expected = bytes / cluster.inter_bandwidth + 2.0 * cluster.inter_latency;
    assert!((few.data_parallel - expected).abs() < 1e-9);
}

/// Two CPU cores as devices, a small transformer's step measured on one of them.
fn cores(devices: usize, measured: Measured) -> (Workload, Cluster) {
    let small = TransformerShape {
        seq: 16,
        vocab: 16,
        ..shape(4, 64, 4, 256)
    };
    let cluster = Cluster {
        devices,
        per_node: devices,
        memory: 16 << 30,
        peak_flops: 1e10,
        efficiency: 1.0,
        intra_bandwidth: 5e9,
        inter_bandwidth: 5e9,
        intra_latency: 15e-6,
        inter_latency: 15e-6,
        cores: Some(2),
        measured: Some(measured),
        device_memory: Vec::new(),
        max_memory: Default::default(),
        margin: None,
    };
    (Workload::transformer(&small, Precision::F32, 64), cluster)
}

fn measured(alone: f64, rendezvous: f64, handoff: f64) -> Measured {
    Measured {
        per_sample: 100e-6,
        per_micro_batch: 400e-6,
        per_update: 200e-6,
        timings: Vec::new(),
        alone,
        rendezvous,
        handoff,
        tp_call: 0.0,
        tp_unsplit: 0.0,
        crowded: 1.0,
    }
}

fn layout(dp: usize, pp: usize, micro_batches: usize, micro_batch: usize) -> Layout {
    Layout {
        dp,
        pp,
        tp: 1,
        micro_batches,
        micro_batch,
        recompute: false,
        shard_state: ShardState::None,
        split: StageSplit::Even,
    }
}

#[test]
fn a_step_alone_on_the_machine_runs_at_its_alone_pace_and_ranks_meet_at_a_cost() {
    let one = layout(1, 1, 1, 64);
    let (work, plain) = cores(1, measured(1.0, 0.0, 0.0));
    let (_, lonely) = cores(1, measured(1.5, 0.0, 0.0));
    let (base, slow) = (
        step_time(&work, &plain, &one),
        step_time(&work, &lonely, &one),
    );
    assert!(
        (slow.compute - 1.5 * base.compute).abs() < 1e-12,
        "{slow:?}"
    );
    assert!((slow.update - 1.5 * base.update).abs() < 1e-12);
    assert_eq!(slow.sync, base.sync, "one rank meets no one");
    // Two ranks on two cores: every core busy, as the step was timed; the ranks meet.
    let two = layout(2, 1, 1, 32);
    let (_, met) = cores(2, measured(1.5, 1e-3, 0.0));
    let (_, plain) = cores(2, measured(1.0, 0.0, 0.0));
    let (a, b) = (step_time(&work, &met, &two), step_time(&work, &plain, &two));
    assert_eq!(a.compute, b.compute);
    assert!((a.sync - b.sync - 1e-3).abs() < 1e-12, "{a:?} {b:?}");
    // A hand-off is paid by every micro-batch each way.
    let staged = layout(1, 2, 4, 16);
    let (_, handing) = cores(2, measured(1.0, 0.0, 1e-4));
    let (a, b) = (
        step_time(&work, &handing, &staged),
        step_time(&work, &plain, &staged),
    );
    assert!(
        (a.pipeline - b.pipeline - 8e-4).abs() < 1e-12,
        "{a:?} {b:?}"
    );
}

#[test]
fn crowded_ranks_take_turns_and_a_stage_s_wait_is_another_rank_s_turn() {
    let (work, two) = cores(2, measured(1.0, 0.0, 0.0));
    let (_, four) = cores(4, measured(1.0, 0.0, 0.0));
    // Replicas: twice as many ranks as cores run at half the pace.
    let (a, b) = (
        step_time(&work, &two, &layout(2, 1, 1, 16)),
        step_time(&work, &four, &layout(4, 1, 1, 16)),
    );
    assert!((b.compute - 2.0 * a.compute).abs() < 1e-12, "{a:?} {b:?}");
    // Three replicas on two cores: as slowly as four at the most crowded core's pace (the
    // default), one and a half times at the cores' time evenly shared, and between for a
    // share between.
    let three = |crowded: f64| {
        let mut cluster = cores(
            2,
            Measured {
                crowded,
                ..measured(1.0, 0.0, 0.0)
            },
        )
        .1;
        cluster.devices = 3;
        step_time(&work, &cluster, &layout(3, 1, 1, 16)).compute
    };
    assert!((three(1.0) - 2.0 * a.compute).abs() < 1e-12);
    assert!((three(0.0) - 1.5 * a.compute).abs() < 1e-12);
    assert!((three(0.5) - 1.75 * a.compute).abs() < 1e-12);
    // Two replicas of two stages on two cores: each core runs two ranks' work, the whole of
    // a replica's, which is less than twice the busiest stage's critical path with its bubble.
    let staged = layout(2, 2, 4, 8);
    let crowded = step_time(&work, &four, &staged);
    let alone = step_time(&work, &two, &layout(1, 2, 4, 8));
    let replica = step_time(
        &work,
        &cores(1, measured(1.0, 0.0, 0.0)).1,
        &layout(1, 1, 4, 8),
    );
    let critical = alone.compute + alone.update + alone.bubble;
    let turns = crowded.compute + crowded.update + crowded.bubble;
    assert!(turns < 2.0 * critical, "{crowded:?} {alone:?}");
    assert!(
        (turns - (replica.compute + replica.update)).abs() < 1e-3 * turns,
        "{turns} against a replica's {replica:?}"
    );
    // Each hand-off between stages waits for both stages' turns: twice as long where every
    // core runs two ranks as on cores of their own.
    let (_, uncrowded) = cores(4, measured(1.0, 0.0, 0.0));
    let uncrowded = Cluster {
        cores: Some(4),
        ..uncrowded
    };
    let apart = step_time(&work, &uncrowded, &staged).pipeline;
    assert!(apart > 0.0 && (crowded.pipeline - 2.0 * apart).abs() < 1e-12 * apart.max(1.0));
}

#[test]
fn every_stage_holds_the_blocks_kiln_gives_it() {
    // Five blocks over two stages: three on the first, two on the last (with the head).
    let (work, cluster) = cores(2, measured(1.0, 0.0, 0.0));
    let work = Workload { layers: 5, ..work };
    let staged = layout(1, 2, 1, 8);
    let held = memory(&work, &cluster, &staged);
    let whole = memory(&work, &cluster, &layout(1, 1, 1, 8));
    let per_block = (work.params - work.embedding_params - work.head_params) as f64 / 5.0;
    let first = 3.0 * per_block + work.embedding_params as f64;
    let last = 2.0 * per_block + work.head_params as f64;
    assert!(
        (held.weights - first.max(last) * work.weight_bytes).abs() < 1e-6,
        "{held:?}"
    );
    assert!(held.weights < whole.weights);
    assert!(step_time(&work, &cluster, &staged).total > 0.0);
}

#[test]
fn a_fixed_degree_is_kept_and_what_cannot_keep_it_is_said() {
    let small = shape(4, 512, 8, 2048);
    let free = search(&work(&small, 64), &h100(8)).unwrap();
    assert_eq!(free.chosen().layout.pp, 1, "{}", free.reason);
    let staged = Fixed {
        pp: Some(2),
        tp: Some(1),
        ..Fixed::default()
    };
    let kept = search_within(&work(&small, 64), &h100(8), staged).unwrap();
    assert!(
        kept.candidates
            .iter()
            .all(|c| (c.layout.pp, c.layout.tp) == (2, 1)),
        "{kept:?}"
    );
    assert_eq!(kept.chosen().layout.dp, 4);
    // Three stages of eight devices: no layout.
    let three = Fixed {
        pp: Some(3),
        ..Fixed::default()
    };
    let error = search_within(&work(&small, 64), &h100(8), three).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("no layout: no layout of 8 devices keeps to pp=3 tp=any"),
        "{error}"
    );
}

#[test]
fn shards_meet_at_every_all_reduce_and_run_their_unsplit_work_whole() {
    let shards = Layout {
        tp: 2,
        ..layout(1, 1, 1, 32)
    };
    let plain = measured(1.0, 0.0, 0.0);
    let (work, base) = cores(2, plain.clone());
    let (_, meeting) = cores(
        2,
        Measured {
            tp_call: 1e-5,
            ..plain.clone()
        },
    );
    let (a, b) = (
        step_time(&work, &meeting, &shards),
        step_time(&work, &base, &shards),
    );
    // Four all-reduces in each of the 4 blocks.
    let calls = (4 * TP_CALLS_PER_BLOCK) as f64;
    assert!(
        (a.tensor_parallel - b.tensor_parallel - calls * 1e-5).abs() < 1e-12,
        "{a:?} {b:?}"
    );
    assert_eq!(a.compute, b.compute);
    // Four shards on two cores take turns at every meeting too.
    let four = Layout { tp: 4, ..shards };
    let (_, crowded) = cores(
        4,
        Measured {
            tp_call: 1e-5,
            ..plain.clone()
        },
    );
    let (_, uncrowded) = cores(4, plain.clone());
    let extra = step_time(&work, &crowded, &four).tensor_parallel
        - step_time(&work, &uncrowded, &four).tensor_parallel;
    assert!((extra - 2.0 * calls * 1e-5).abs() < 1e-12, "{extra}");
    // The blocks' unsplit share runs whole on every shard: all of it, and a shard computes
    // what the whole model's blocks do; none of it, and half.
    let unsplit = |share: f64| {
        let (_, cluster) = cores(
            2,
            Measured {
                tp_unsplit: share,
                ..plain.clone()
            },
        );
        step_time(&work, &cluster, &shards).compute
    };
    let whole = step_time(&work, &base, &layout(1, 1, 1, 32)).compute;
    assert!(unsplit(0.0) < unsplit(0.5) && unsplit(0.5) < unsplit(1.0));
    assert!(
        (unsplit(1.0) - whole).abs() < 1e-12,
        "{} {whole}",
        unsplit(1.0)
    );
    // Replicas do not shard: neither cost touches them.
    let (_, both) = cores(
        2,
        Measured {
            tp_call: 1e-5,
            tp_unsplit: 0.5,
            ..plain
        },
    );
    assert_eq!(
        step_time(&work, &both, &layout(2, 1, 1, 16)),
        step_time(&work, &base, &layout(2, 1, 1, 16))
    );
}

/// Each of a shape's sizes set to 1 or to its limit, with every combination of the flags:
/// the corners of what the planner takes.
fn corners() -> impl Iterator<Item = TransformerShape> {
    let sizes = TransformerShape::LIMITS.map(|(_, max)| max);
    (0u32..1 << 12).map(move |bits| {
        let size = |i: usize| if bits & (1 << i) != 0 { sizes[i] } else { 1 };
        let flag = |i: usize| bits & (1 << (8 + i)) != 0;
        TransformerShape {
            layers: size(0),
            hidden: size(1),
            heads: size(2),
            kv_heads: size(3),
            head_dim: size(4),
            ffn: size(5),
            seq: size(6),
            vocab: size(7),
            qkv_bias: flag(0),
            o_bias: flag(1),
            gated: flag(2),
            tied: flag(3),
        }
    })
}

/// The parameters of `shape` counted in 128 bits, where nothing the limits allow overflows.
fn params_u128(s: &TransformerShape) -> u128 {
    let (h, f) = (s.hidden as u128, s.ffn as u128);
    let (q, kv) = (
        (s.heads * s.head_dim) as u128,
        (s.kv_heads * s.head_dim) as u128,
    );
    let matrices = if s.gated { 3 } else { 2 };
    let bias = if s.qkv_bias { q + 2 * kv } else { 0 } + if s.o_bias { h } else { 0 };
    let block = 2 * h * q + 2 * h * kv + matrices * h * f + 2 * h + bias;
    let embed = s.vocab as u128 * h;
    s.layers as u128 * block + embed + if s.tied { 0 } else { embed } + h
}

#[test]
fn the_planner_s_counts_are_exact_up_to_its_limits() {
    // A vocabulary of 2^64 - 1 once wrapped to fewer parameters than 32,000: every size is
    // now bounded, and at every corner of the bounds the 64-bit count is the exact one.
    for shape in corners() {
        shape.check().unwrap();
        let exact = params_u128(&shape);
        assert_eq!(shape.params() as u128, exact, "{shape:?}");
        assert!(exact < 1 << 56, "{shape:?}: {exact}");
        let w = work(&shape, 1);
        assert!(
            w.forward_flops.is_finite() && w.forward_flops > 0.0,
            "{shape:?}"
        );
        let lora = Workload::lora(&shape, Precision::Bf16, 1, shape.hidden.min(16), true);
        assert!(
            lora.params > w.params && lora.weight_bytes.is_finite(),
            "{shape:?}"
        );
    }
    let mut too_big = llama(7);
    too_big.vocab = usize::MAX;
    assert!(too_big.check().unwrap_err().contains("vocab"));
}

#[test]
fn memory_grows_with_every_size_of_the_model() {
    // Memory once fell as the width grew (an overflow); now doubling any size, from a 7B
    // model and from the planner's limits halved, never lowers a replica's memory or its
    // parameters.
    let alone = Layout {
        dp: 1,
        pp: 1,
        tp: 1,
        micro_batches: 1,
        micro_batch: 1,
        recompute: false,
        shard_state: ShardState::None,
        split: StageSplit::Even,
    };
    let halved = {
        let [l, h, a, kv, d, f, s, v] = TransformerShape::LIMITS.map(|(_, max)| max / 2);
        TransformerShape {
            layers: l,
            hidden: h,
            heads: a,
            kv_heads: kv,
            head_dim: d,
            ffn: f,
            seq: s,
            vocab: v,
            ..llama(7)
        }
    };
    for base in [llama(7), halved] {
        let before = memory(&work(&base, 1), &h100(1), &alone).total;
        for i in 0..8 {
            let mut grown = base;
            let size = match i {
                0 => &mut grown.layers,
                1 => &mut grown.hidden,
                2 => &mut grown.heads,
                3 => &mut grown.kv_heads,
                4 => &mut grown.head_dim,
                5 => &mut grown.ffn,
                6 => &mut grown.seq,
                _ => &mut grown.vocab,
            };
            *size *= 2;
            grown.check().unwrap();
            let after = memory(&work(&grown, 1), &h100(1), &alone).total;
            assert!(
                after.is_finite() && after > before,
                "size {i}: {before} → {after}"
            );
            assert!(grown.params() >= base.params(), "size {i}");
        }
    }
}

#[test]
fn replicas_split_the_optimizer_state_only_where_the_whole_does_not_fit() {
    // 1.74 G parameters of 512 tokens over 2 replicas: 16 bytes a parameter whole, the moments'
    // 8 halved when split.
    let model = TransformerShape {
        seq: 512,
        ..shape(24, 2048, 16, 8192)
    };
    let w = work(&model, 4);
    let plain = Layout {
        dp: 2,
        pp: 1,
        tp: 1,
        micro_batches: 2,
        micro_batch: 1,
        recompute: false,
        shard_state: ShardState::None,
        split: StageSplit::Even,
    };
    let split = Layout {
        shard_state: ShardState::Optimizer,
        ..plain
    };
    let cluster = h100(2);
    let (whole, part) = (memory(&w, &cluster, &plain), memory(&w, &cluster, &split));
    // bf16: a gradient (2), the moments (8) and an f32 master (4); the replicas split the
    // moments and the masters (each holds the others' parameters in bf16).
    let expected = (14.0 - 12.0 / 2.0) / 14.0;
    assert!((part.trainable_state / whole.trainable_state - expected).abs() < 1e-12);
    assert_eq!((part.weights, part.buckets), (whole.weights, whole.buckets));
    let (t_whole, t_part) = (
        step_time(&w, &cluster, &plain),
        step_time(&w, &cluster, &split),
    );
    assert_eq!(t_part.compute, t_whole.compute);
    assert!(
        t_part.data_parallel > t_whole.data_parallel,
        "the owners' broadcast costs"
    );

    // Every plain-replica mesh is a layout whole and one split: whether each fits, and
    // which the planner chooses among the two.
    let verdicts = |memory_gib: u64| {
        let cluster = Cluster {
            memory: memory_gib << 30,
            ..h100(2)
        };
        let planned = search(&w, &cluster).unwrap();
        let fits = |split: ShardState| {
            let c = planned
                .candidates
                .iter()
                .find(|c| c.layout.dp == 2 && c.layout.shard_state == split);
            c.expect("both layouts of 2 replicas").rejected.is_none()
        };
        let first = planned
            .candidates
            .iter()
            .find(|c| c.layout.dp == 2)
            .unwrap();
        (
            fits(ShardState::None),
            fits(ShardState::Optimizer),
            first.layout.shard_state != ShardState::None,
        )
    };
    // Ample memory: both fit, and the whole state is faster. Less: only a split fits (any
    // stage: without recomputation they peak alike). Less again: neither.
    assert_eq!(verdicts(80), (true, true, false));
    assert_eq!(verdicts(32), (false, true, true));
    let (whole, split, _) = verdicts(16);
    assert!(!whole && !split, "neither fits 16 GiB");
}

/// A plain-replica layout of `dp` replicas, one micro-batch of `micro_batch`, splitting
/// `shard_state`.
fn replicas(dp: usize, micro_batch: usize, shard_state: ShardState, recompute: bool) -> Layout {
    Layout {
        dp,
        pp: 1,
        tp: 1,
        micro_batches: 1,
        micro_batch,
        recompute,
        shard_state,
        split: StageSplit::Even,
    }
}

#[test]
fn zero_2_peaks_as_zero_1_and_moves_less_and_zero_3_gathered_whole_holds_the_masters() {
    let w = work(&shape(8, 1024, 8, 4096), 8);
    let cluster = h100(4);
    let at = |state| {
        let layout = replicas(4, 2, state, false);
        (
            memory(&w, &cluster, &layout),
            step_time(&w, &cluster, &layout),
        )
    };
    let (one, two, three) = (
        at(ShardState::Optimizer),
        at(ShardState::Gradients),
        at(ShardState::Parameters),
    );
    // Burn's backward returns every gradient at once: ZeRO-2 peaks as ZeRO-1. ZeRO-3 gathered
    // whole holds the f32 masters through the step, which ZeRO-1 and -2 split (bf16 copies of
    // the others' parameters).
    assert_eq!(two.0, one.0);
    assert_eq!(three.0.weights, one.0.weights);
    assert!(three.0.trainable_state > one.0.trainable_state);
    // A reduction to each owner is half an all-reduce's traffic; ZeRO-3's gather moves f32
    // parameters where ZeRO-2's broadcast moves their bf16 copies.
    assert!(two.1.data_parallel < one.1.data_parallel);
    assert!(three.1.data_parallel > two.1.data_parallel);
    assert_eq!(three.1.compute, one.1.compute);
}

#[test]
fn zero_3_one_block_at_a_time_holds_its_part_and_one_block() {
    // In f32 the weights are the parameters ZeRO-3 releases.
    let model = shape(8, 1024, 8, 4096);
    let w = Workload::transformer(&model, Precision::F32, 8).as_llm();
    let cluster = h100(4);
    let (dp, micro_batch) = (4, 2);
    let plain = replicas(dp, micro_batch, ShardState::Parameters, false);
    let by_block = replicas(dp, micro_batch, ShardState::Parameters, true);
    let (whole, part) = (
        memory(&w, &cluster, &plain),
        memory(&w, &cluster, &by_block),
    );
    let block = model.block_params() as f64;
    let edges = (w.embedding_params + w.head_params) as f64;
    let blocks = block * model.layers as f64;
    // The replica's quarter of the blocks, one block gathered, the edges whole, in f32.
    let expected = (blocks / dp as f64 + block + edges) * 4.0;
    assert!(
        (part.weights - expected).abs() < 1.0,
        "{} vs {expected}",
        part.weights
    );
    assert_eq!(whole.weights, w.params as f64 * 4.0);
    // Gradients stay whole (Burn's backward returns them at once); the moments split.
    let params = w.params as f64;
    let state = params * (4.0 + 8.0 / dp as f64);
    assert!((part.trainable_state - state).abs() < 1.0);
    assert_eq!(part.buckets, whole.buckets);
    // Every block's input kept, one block's activations recomputed at a time.
    let kept = w.boundary_bytes * micro_batch as f64 * model.layers as f64
        + w.block_activation_bytes[0] * micro_batch as f64
        + w.head_activation_bytes * micro_batch as f64;
    assert!((part.activations - kept).abs() < 1.0);
    assert!(part.total < whole.total);
    // A second forward, and each block gathered twice: 1.5 all-reduces' traffic with the
    // reduction (each owner's gather of its part is a broadcast of the whole model).
    let (t_whole, t_part) = (
        step_time(&w, &cluster, &plain),
        step_time(&w, &cluster, &by_block),
    );
    assert!((t_part.compute / t_whole.compute - 4.0 / 3.0).abs() < 1e-9);
    assert!(t_part.data_parallel > t_whole.data_parallel);
}

#[test]
fn only_a_model_that_recomputes_its_blocks_recomputes_without_stages() {
    let model = shape(8, 1024, 8, 4096);
    let cluster = h100(4);
    // Recomputation fixed on: every layout that can recompute does.
    let recomputed = Fixed {
        recompute: Some(true),
        ..Fixed::default()
    };
    let unstaged_recomputed = |w: &Workload| {
        let planned = search_within(w, &cluster, recomputed).unwrap();
        planned
            .candidates
            .iter()
            .filter(|c| c.layout.pp == 1 && c.layout.recompute)
            .map(|c| c.layout.tp)
            .collect::<Vec<_>>()
    };
    assert_eq!(unstaged_recomputed(&work(&model, 8)), Vec::<usize>::new());
    // Kiln's LLM recomputes one block at a time under replicas, never under shards.
    let llm = unstaged_recomputed(&work(&model, 8).as_llm());
    assert!(!llm.is_empty());
    assert!(llm.iter().all(|&tp| tp == 1), "{llm:?}");
}

#[test]
fn zero_3_by_block_is_chosen_where_nothing_else_fits() {
    // 7B in f32 on 4 devices of 80 GB: whole replicas need 16 bytes a parameter (108 GB);
    // ZeRO-1 still 8 whole; ZeRO-3 a block at a time holds a quarter of the weights and the
    // moments. Stages and shards are fixed out.
    let model = TransformerShape {
        seq: 1024,
        ..llama(7)
    };
    let w = Workload::transformer(&model, Precision::F32, 8).as_llm();
    let fixed = Fixed {
        pp: Some(1),
        tp: Some(1),
        ..Fixed::default()
    };
    let planned = search_within(&w, &h100(4), fixed).unwrap();
    let chosen = planned.chosen();
    assert_eq!(chosen.strategy, StrategyKind::Ddp);
    assert_eq!(
        (chosen.layout.shard_state, chosen.layout.recompute),
        (ShardState::Parameters, true),
        "{}",
        planned.reason
    );
    assert!(planned.reason.contains("ZeRO-3"), "{}", planned.reason);
    for stage in [
        ShardState::None,
        ShardState::Optimizer,
        ShardState::Gradients,
    ] {
        let c = planned
            .candidates
            .iter()
            .find(|c| c.layout.shard_state == stage)
            .unwrap();
        assert!(c.rejected.is_some(), "{stage:?} fits: {:?}", c.memory);
    }
}
