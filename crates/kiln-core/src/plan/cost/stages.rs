//! Which blocks each pipeline stage holds ([`StageSplit`]), and which devices run a stage.
//!
//! The balanced and sequential splits weigh each stage by [`super::stage_cost`]'s time and
//! memory, which are linear in its blocks: `a·n + b` for `n` blocks, `b` being the edges the
//! stage carries (the embeddings on the first, the head and the loss on the last). A bound on
//! a stage's cost is then a most number of blocks, found without trying every split; the
//! least bound every stage can keep to while the blocks add up is found by bisection.

use super::layout::{Layout, StageSplit};
use super::stage_cost::{stage_memory, stage_path, stage_seconds};
use super::{Cluster, Workload};

/// The device (rank) of replica `d`, stage `s` and shard `t`: the mesh is `dp × pp × tp`,
/// `tp` innermost, and rank `r` runs on the run's `r`-th device.
pub(super) fn device(layout: &Layout, d: usize, s: usize, t: usize) -> usize {
    (d * layout.pp + s) * layout.tp + t
}

/// The device of stage `s` with the least memory a plan may use, and that memory: every
/// replica and shard of a stage holds the same, so the smallest of them bounds it.
pub(super) fn stage_limit(cluster: &Cluster, layout: &Layout, s: usize) -> (usize, f64) {
    if !cluster.unequal() {
        let first = device(layout, 0, s, 0);
        return (first, cluster.usable(first));
    }
    (0..layout.dp)
        .flat_map(|d| (0..layout.tp).map(move |t| device(layout, d, s, t)))
        .map(|device| (device, cluster.usable(device)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("a stage has a device")
}

/// The blocks of each stage of `layout` (one entry, all of them, without stages).
pub fn blocks(work: &Workload, cluster: &Cluster, layout: &Layout) -> Vec<usize> {
    let (layers, pp) = (work.layers, layout.pp);
    if pp <= 1 {
        return vec![layers];
    }
    match layout.split {
        StageSplit::Even => even(layers, pp),
        StageSplit::Balanced => balanced(work, cluster, layout),
        StageSplit::Sequential => sequential(work, cluster, layout),
    }
}

/// Kiln's even split: `layers / pp` blocks a stage, the first stages taking the remainder.
pub fn even(layers: usize, pp: usize) -> Vec<usize> {
    (0..pp)
        .map(|s| layers / pp + usize::from(s < layers % pp))
        .collect()
}

/// A stage's cost as `a·n + b` for `n` blocks.
#[derive(Debug, Clone, Copy)]
struct Linear {
    a: f64,
    b: f64,
}

impl Linear {
    /// `cost` at 0 and 1 block.
    fn of(cost: impl Fn(usize) -> f64) -> Self {
        let b = cost(0);
        Self { a: cost(1) - b, b }
    }

    /// The most blocks (up to `most`) whose cost stays within `bound`; 0 when not even one.
    fn most_within(&self, bound: f64, most: usize) -> usize {
        if self.b + self.a > bound {
            return 0;
        }
        if self.a <= 0.0 {
            return most;
        }
        // Within a hair of the bound, as the costs it was computed from are sums of floats.
        let n = ((bound - self.b) / self.a * (1.0 + 1e-12)).floor();
        (n.max(0.0) as usize).min(most)
    }
}

/// The costs of every stage of `layout`: its time (its critical path) and its memory as a
/// share of its devices' limit.
struct Costs {
    time: Vec<Linear>,
    memory: Vec<Linear>,
}

impl Costs {
    fn of(work: &Workload, cluster: &Cluster, layout: &Layout) -> Self {
        let (time, memory) = (0..layout.pp)
            .map(|s| {
                let limit = stage_limit(cluster, layout, s).1;
                (
                    Linear::of(|n| stage_path(layout, stage_seconds(work, cluster, layout, s, n))),
                    Linear::of(|n| stage_memory(work, cluster, layout, s, n).total / limit),
                )
            })
            .unzip();
        Self { time, memory }
    }

    /// The most blocks of each stage within time `t` and memory share `m`.
    fn caps(&self, t: f64, m: f64, layers: usize) -> Vec<usize> {
        self.time
            .iter()
            .zip(&self.memory)
            .map(|(time, memory)| {
                time.most_within(t, layers)
                    .min(memory.most_within(m, layers))
            })
            .collect()
    }
}

/// Whether blocks of at most `caps` a stage, at least one each, can add up to `layers`.
fn covers(caps: &[usize], layers: usize) -> bool {
    caps.iter().all(|&c| c >= 1) && caps.iter().sum::<usize>() >= layers
}

/// The least bound within `[low, high]` for which `caps(bound)` covers `layers` (`high`
/// itself must), by bisection.
fn least_bound(low: f64, high: f64, layers: usize, caps: impl Fn(f64) -> Vec<usize>) -> f64 {
    let (mut low, mut high) = (low, high);
    for _ in 0..100 {
        let mid = 0.5 * (low + high);
        if covers(&caps(mid), layers) {
            high = mid;
        } else {
            low = mid;
        }
    }
    high
}

/// The highest cost any stage could have: every block on it.
fn ceiling(costs: &[Linear], layers: usize) -> f64 {
    costs
        .iter()
        .map(|c| c.a * layers as f64 + c.b)
        .fold(0.0, f64::max)
}

/// See [`StageSplit::Balanced`]. Where no split fits the memory, the split whose fullest
/// device is the least full (the plan rejects it, naming that device).
fn balanced(work: &Workload, cluster: &Cluster, layout: &Layout) -> Vec<usize> {
    let layers = work.layers;
    let costs = Costs::of(work, cluster, layout);
    let (time_ceiling, memory_ceiling) =
        (ceiling(&costs.time, layers), ceiling(&costs.memory, layers));
    // Within a hair of a bound: ties between splits whose busiest stage is the same.
    let hair = 1.0 + 1e-9;
    let fits = covers(&costs.caps(time_ceiling, 1.0, layers), layers);
    let (time, memory) = match fits {
        true => {
            let time = least_bound(0.0, time_ceiling, layers, |t| costs.caps(t, 1.0, layers));
            let time = time * hair;
            let memory = least_bound(0.0, 1.0, layers, |m| costs.caps(time, m, layers));
            (time, memory * hair)
        }
        false => {
            let memory = least_bound(0.0, memory_ceiling, layers, |m| {
                costs.caps(time_ceiling, m, layers)
            });
            (time_ceiling, memory * hair)
        }
    };
    let caps = costs.caps(time, memory, layers);
    trim(caps, layers, |s, n| {
        let n = n as f64;
        let t = costs.time[s].a * n + costs.time[s].b;
        let m = costs.memory[s].a * n + costs.memory[s].b;
        (t / time).max(m / memory)
    })
}

/// `caps` (covering `layers`) cut down to add up to `layers`: a block at a time off the stage
/// whose `load` is highest, keeping one each.
fn trim(mut blocks: Vec<usize>, layers: usize, load: impl Fn(usize, usize) -> f64) -> Vec<usize> {
    let mut surplus = blocks.iter().sum::<usize>().saturating_sub(layers);
    while surplus > 0 {
        let fullest = (0..blocks.len())
            .filter(|&s| blocks[s] > 1)
            .max_by(|&a, &b| load(a, blocks[a]).total_cmp(&load(b, blocks[b])))
            .expect("a surplus leaves a stage of more than one block");
        blocks[fullest] -= 1;
        surplus -= 1;
    }
    blocks
}

/// See [`StageSplit::Sequential`]. The last stage takes what is left, fitting or not (the
/// plan then rejects it, naming its device).
fn sequential(work: &Workload, cluster: &Cluster, layout: &Layout) -> Vec<usize> {
    let (layers, pp) = (work.layers, layout.pp);
    let costs = Costs::of(work, cluster, layout);
    let mut left = layers;
    let mut blocks = Vec::with_capacity(pp);
    for s in 0..pp {
        let after = pp - s - 1;
        let n = match after {
            0 => left,
            _ => costs.memory[s].most_within(1.0, left - after).max(1),
        };
        blocks.push(n);
        left -= n;
    }
    blocks
}

/// Why the stages of `layout` hold `blocks`, for the planner's one line: empty for an even
/// split (the default, which needs no reason).
pub(super) fn why(layout: &Layout, blocks: &[usize]) -> String {
    let (first, last) = (blocks.first(), blocks.last());
    match (layout.split, first, last) {
        (StageSplit::Even, ..) | (_, None, _) | (_, _, None) => String::new(),
        (StageSplit::Balanced, Some(&first), Some(&last)) => format!(
            "; stages balanced by time, then memory: the first ({}) also holds the embeddings \
             and up to {} micro-batches in flight, the last ({}) the head and the loss",
            count(first),
            layout.micro_batches.min(layout.pp),
            count(last)
        ),
        (StageSplit::Sequential, ..) => {
            "; stages filled in order, each device up to its memory (sequential)".to_string()
        }
    }
}

/// `n` blocks, in words.
fn count(n: usize) -> String {
    match n {
        1 => "1 block".to_string(),
        n => format!("{n} blocks"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::Precision;
    use crate::plan::cost::{
        Fixed, LimitError, PlanError, Planned, Preset, TransformerShape, memory, memory_by_stage,
        memory_with, search, search_within, step_time, step_time_with,
    };

    const GIB: u64 = 1 << 30;

    /// LLaMA-3 8B's configuration, on samples of `seq` tokens.
    fn llama3_8b(seq: usize) -> TransformerShape {
        TransformerShape {
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            qkv_bias: false,
            o_bias: false,
            ffn: 14336,
            seq,
            vocab: 128_256,
            gated: true,
            tied: false,
        }
    }

    /// LLaMA-3 8B fine-tuned with rank-16 QLoRA adapters, 4 samples of `seq` tokens a step.
    fn qlora_8b(seq: usize) -> Workload {
        Workload::lora(&llama3_8b(seq), Precision::Bf16, 4, 16, true)
    }

    /// GPUs of the given memories (H100s in speed and links).
    fn gpus(memories: &[u64]) -> Cluster {
        let mut cluster =
            Preset::named("h100-sxm")
                .unwrap()
                .cluster(memories.len(), memories.len(), 0.5);
        cluster.device_memory = memories.to_vec();
        cluster
    }

    /// Two stages, no shards: the layouts whose split is under test.
    const TWO_STAGES: Fixed = Fixed {
        pp: Some(2),
        tp: Some(1),
        staged: false,
        micro_batches: None,
        recompute: None,
    };

    /// The candidate of `planned` cut by `split`.
    fn cut(planned: &Planned, split: StageSplit) -> &crate::plan::cost::Candidate {
        planned
            .candidates
            .iter()
            .find(|c| c.layout.split == split)
            .unwrap_or_else(|| panic!("no {split:?} candidate: {planned:#?}"))
    }

    /// Every stage of `candidate` within its device's memory.
    fn fits_each_device(work: &Workload, cluster: &Cluster, layout: &Layout) -> bool {
        memory_by_stage(work, cluster, layout)
            .iter()
            .all(|m| m.total <= cluster.usable(m.device))
    }

    #[test]
    fn balanced_stages_give_large_embeddings_and_head_fewer_blocks() {
        // The LLM fixture's block (width 32, 4 heads of 8, 2 key-value heads, SwiGLU of 64)
        // with 8 layers over 4 stages, LoRA of rank 4.
        let fixture = |vocab| TransformerShape {
            layers: 8,
            hidden: 32,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            qkv_bias: false,
            o_bias: false,
            ffn: 64,
            seq: 64,
            vocab,
            gated: true,
            tied: false,
        };
        let cluster = Preset::named("h100-sxm").unwrap().cluster(4, 4, 0.5);
        let layout = Layout {
            dp: 1,
            pp: 4,
            tp: 1,
            micro_batches: 8,
            micro_batch: 1,
            recompute: false,
            shard_state: crate::plan::ShardState::None,
            split: StageSplit::Balanced,
        };
        let work = |vocab| Workload::lora(&fixture(vocab), Precision::F32, 8, 4, false);
        let split = |vocab| blocks(&work(vocab), &cluster, &layout);
        // The fixture's own 96 words: edges smaller than a block, the even split's 2 a stage
        // give or take one.
        let small = split(96);
        assert_eq!(small.iter().sum::<usize>(), 8);
        assert!(small.iter().all(|&n| (1..=3).contains(&n)), "{small:?}");
        // 4,096 words: the head's product outweighs a block's, and the embeddings share the
        // first stage with the most micro-batches in flight.
        let large = split(4096);
        assert_eq!(large.iter().sum::<usize>(), 8);
        assert!(large[0] < 2 && large[3] < 2, "{large:?}");
        // The estimates of a cut given as blocks are those of the split that cuts them.
        let work = work(4096);
        let cut = blocks(&work, &cluster, &layout);
        assert_eq!(
            step_time(&work, &cluster, &layout),
            step_time_with(&work, &cluster, &layout, &cut)
        );
        assert_eq!(
            memory(&work, &cluster, &layout),
            memory_with(&work, &cluster, &layout, &cut)
        );
        let even = even(8, 4);
        assert_ne!(
            memory(&work, &cluster, &layout),
            memory_with(&work, &cluster, &layout, &even)
        );
    }

    #[test]
    fn llama3_8b_qlora_on_unequal_cards_gets_stages_that_fit_each() {
        let work = qlora_8b(1024);
        for memories in [
            [24 * GIB, 24 * GIB],
            [24 * GIB, 12 * GIB],
            [24 * GIB, 8 * GIB],
        ] {
            let cluster = gpus(&memories);
            let planned = search_within(&work, &cluster, TWO_STAGES).unwrap();
            let chosen = planned.chosen();
            assert!(
                fits_each_device(&work, &cluster, &chosen.layout),
                "{memories:?}: {chosen:#?}"
            );
            // The smaller second card holds no more blocks than the first.
            assert!(chosen.blocks[0] >= chosen.blocks[1], "{chosen:#?}");
        }
        // On 24 + 8 GiB the even split overflows the small card; the balanced one moves blocks
        // to the large one and fits.
        let cluster = gpus(&[24 * GIB, 8 * GIB]);
        let planned = search_within(&work, &cluster, TWO_STAGES).unwrap();
        let even = cut(&planned, StageSplit::Even);
        assert!(
            even.rejected
                .as_deref()
                .unwrap()
                .starts_with("device 1 needs"),
            "{even:#?}"
        );
        let balanced = cut(&planned, StageSplit::Balanced);
        assert!(balanced.rejected.is_none(), "{balanced:#?}");
        assert!(balanced.blocks[0] > 16, "{balanced:#?}");
    }

    #[test]
    fn the_sequential_split_fills_the_first_card_to_its_limit() {
        let work = qlora_8b(1024);
        let cluster = gpus(&[24 * GIB, 12 * GIB]);
        let planned = search_within(&work, &cluster, TWO_STAGES).unwrap();
        let layout = cut(&planned, StageSplit::Sequential).layout;
        let [first, second] = blocks(&work, &cluster, &layout)[..] else {
            panic!("two stages")
        };
        let usable = cluster.usable(0);
        assert!(stage_memory(&work, &cluster, &layout, 0, first).total <= usable);
        assert!(stage_memory(&work, &cluster, &layout, 0, first + 1).total > usable);
        assert_eq!(first + second, 32);
    }

    #[test]
    fn nothing_fitting_names_the_device_that_overflows_and_by_how_much() {
        let error = search(&qlora_8b(2048), &gpus(&[24 * GIB, 12 * GIB])).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, PlanError::DeviceOverflows { .. }), "{text}");
        assert!(
            text.starts_with("nothing fits: the least full layout (")
                && text.contains("overflows: device 1 needs")
                && text.contains("GiB over the 10.8 GiB it may use"),
            "{text}"
        );
        assert!(!text.contains('\n'));
    }

    #[test]
    fn a_limit_replaces_the_usable_share_and_bad_limits_are_refused() {
        let mut cluster = gpus(&[24 * GIB, 12 * GIB]);
        assert_eq!(
            cluster.usable(1),
            12.0 * GIB as f64 * crate::plan::cost::USABLE_MEMORY
        );
        cluster.max_memory.insert(0, 10 * GIB);
        assert_eq!(cluster.usable(0), 10.0 * GIB as f64);
        let work = qlora_8b(1024);
        let refused = |cluster: &Cluster| match search(&work, cluster) {
            Err(PlanError::Limit(e)) => e,
            other => panic!("{other:?}"),
        };
        let mut outside = cluster.clone();
        outside.max_memory.insert(2, GIB);
        assert!(matches!(
            refused(&outside),
            LimitError::NotInWorld { device: 2, .. }
        ));
        assert_eq!(
            refused(&outside).to_string(),
            "a memory limit is set for device 2, but the run has 2 device(s) (0 to 1); limit \
             only those"
        );
        let mut above = cluster.clone();
        above.max_memory.insert(1, 13 * GIB);
        assert_eq!(
            refused(&above).to_string(),
            "device 1 is limited to 13.0 GiB but has 12.0 GiB; give it at most its memory"
        );
        let mut listed = cluster.clone();
        listed.device_memory.push(GIB);
        assert!(matches!(
            refused(&listed),
            LimitError::Listed {
                listed: 3,
                devices: 2
            }
        ));
    }
}
