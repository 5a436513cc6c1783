//! Every layout of a cluster's devices, estimated, and the fastest that fits.

use serde::{Deserialize, Serialize};

use super::cluster::{LimitError, USABLE_MEMORY, size};
use super::estimate::{memory, step_time};
use super::layout::{Layout, Memory, StageSplit, StepTime};
use super::stages;
use super::{Cluster, Workload};
use crate::plan::{ShardState, StrategyKind};

/// What a run fixes of its layout: the planner lays out the rest. `None` leaves a setting to
/// the planner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fixed {
    /// Pipeline stages (1: none).
    pub pp: Option<usize>,
    /// Tensor-parallel shards (1: none).
    pub tp: Option<usize>,
    /// Whether the layout runs on the pipeline's engine even with one stage: a checkpoint of a
    /// one-stage pipeline holds its state per stage, which only a pipeline loads.
    #[serde(default)]
    pub staged: bool,
    /// Micro-batches per replica and step ([`Layout::micro_batches`]).
    #[serde(default)]
    pub micro_batches: Option<usize>,
    /// Whether the forward is recomputed ([`Layout::recompute`]), in the layouts that can: those
    /// with stages, and those without where the model recomputes its blocks
    /// ([`Workload::recomputes_blocks`]).
    #[serde(default)]
    pub recompute: Option<bool>,
}

impl Fixed {
    /// Whether a mesh of `pp` stages and `tp` shards keeps to it.
    pub fn allows(&self, pp: usize, tp: usize) -> bool {
        self.pp.is_none_or(|p| p == pp) && self.tp.is_none_or(|t| t == tp)
    }

    /// Whether `micro_batches` per replica keep to it.
    pub fn allows_micro_batches(&self, micro_batches: usize) -> bool {
        self.micro_batches.is_none_or(|m| m == micro_batches)
    }

    /// Whether a layout that `can` recompute may recompute or not, as it fixes: the
    /// planner's choice unless fixed.
    fn recomputations(&self, can: bool) -> &'static [bool] {
        match (can, self.recompute) {
            (false, _) => &[false],
            (true, Some(true)) => &[true],
            (true, Some(false)) => &[false],
            (true, None) => &[false, true],
        }
    }

    /// Whether it fixes nothing.
    pub fn is_free(&self) -> bool {
        *self == Self::default()
    }

    /// What both fix, or `None` when they fix a setting apart.
    pub fn and(self, other: Fixed) -> Option<Fixed> {
        fn both<T: PartialEq>(a: Option<T>, b: Option<T>) -> Result<Option<T>, ()> {
            match (a, b) {
                (Some(a), Some(b)) if a != b => Err(()),
                (a, b) => Ok(a.or(b)),
            }
        }
        Some(Fixed {
            pp: both(self.pp, other.pp).ok()?,
            tp: both(self.tp, other.tp).ok()?,
            staged: self.staged || other.staged,
            micro_batches: both(self.micro_batches, other.micro_batches).ok()?,
            recompute: both(self.recompute, other.recompute).ok()?,
        })
    }

    /// The strategy that runs `layout` on `devices` within it: [`strategy`]'s, but a pipeline
    /// of one stage where it is `staged`.
    pub(crate) fn strategy(&self, layout: &Layout, devices: usize) -> StrategyKind {
        match strategy(layout, devices) {
            StrategyKind::Single | StrategyKind::Ddp if self.staged => StrategyKind::Pipeline,
            kind => kind,
        }
    }
}

impl std::fmt::Display for Fixed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let degree = |d: Option<usize>| d.map_or("any".to_string(), |d| d.to_string());
        write!(f, "pp={} tp={}", degree(self.pp), degree(self.tp))?;
        if self.staged && self.pp.is_none_or(|p| p == 1) {
            f.write_str(" on the pipeline's engine")?;
        }
        if let Some(m) = self.micro_batches {
            write!(f, ", {m} micro-batch(es)")?;
        }
        match self.recompute {
            Some(true) => f.write_str(", recomputed"),
            Some(false) => f.write_str(", not recomputed"),
            None => Ok(()),
        }
    }
}

/// One way to lay the devices out, with its estimates and verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The strategy that runs it.
    pub strategy: StrategyKind,
    /// The mesh and micro-batches.
    pub layout: Layout,
    /// The blocks of each stage (one entry without stages), as `layout.split` cuts them.
    #[serde(default)]
    pub blocks: Vec<usize>,
    /// Memory per device.
    pub memory: Memory,
    /// Step time.
    pub time: StepTime,
    /// Model FLOPs utilisation: the step's model FLOPs over what the devices could do at
    /// their peak in the step's time.
    pub utilisation: f64,
    /// Why it cannot run; `None` when it can.
    pub rejected: Option<String>,
}

/// The candidates of a cluster, best first, and the reason for the first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Planned {
    /// Every candidate: the chosen, the others that fit, fastest first, then the rejected.
    pub candidates: Vec<Candidate>,
    /// Why the first was chosen, in one line.
    pub reason: String,
}

impl Planned {
    /// The chosen candidate.
    pub fn chosen(&self) -> &Candidate {
        &self.candidates[0]
    }
}

/// Nothing fits the cluster.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// Every layout needs more memory than a device has.
    #[error(
        "nothing fits: the smallest layout ({layout}) needs {needed:.1} GiB per device and the \
         devices have {usable:.1} GiB usable (90 % of {memory:.1}); {fix}"
    )]
    NothingFits {
        /// The least memory a layout needs, GiB.
        needed: f64,
        /// Its layout.
        layout: String,
        /// The devices' memory, GiB.
        memory: f64,
        /// What a plan may use of it, GiB.
        usable: f64,
        /// What would fit: more devices, or more memory per device.
        fix: String,
    },
    /// Every layout overflows one of the devices, which differ in memory or limits: the
    /// least full layout, and its device that overflows.
    #[error(
        "nothing fits: the least full layout ({layout}) overflows: {overflow}; raise that \
         device's limit, or add devices"
    )]
    DeviceOverflows {
        /// The layout.
        layout: String,
        /// Its fullest device and by how much it overflows.
        overflow: String,
    },
    /// The cluster or the workload cannot be laid out at all.
    #[error("no layout: {0}")]
    NoLayout(String),
    /// The devices' memory or limits do not describe the cluster.
    #[error(transparent)]
    Limit(#[from] LimitError),
}

/// The divisors of `n`, in increasing order (found up to its square root).
fn divisors(n: usize) -> impl Iterator<Item = usize> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1;
    while d <= n / d {
        if n.is_multiple_of(d) {
            small.push(d);
            if d * d != n {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.into_iter().chain(large.into_iter().rev())
}

/// The largest cluster the "what would fit" search tries: beyond the largest built.
const MOST_DEVICES: usize = 1 << 20;

/// The strategy that runs `layout` on `devices`.
pub fn strategy(layout: &Layout, devices: usize) -> StrategyKind {
    match (layout.pp, layout.tp) {
        _ if devices == 1 => StrategyKind::Single,
        (1, 1) => StrategyKind::Ddp,
        (_, 1) => StrategyKind::Pipeline,
        _ => StrategyKind::Tensor,
    }
}

fn describe(layout: &Layout, blocks: &[usize]) -> String {
    format!(
        "dp={} pp={} tp={}, {} micro-batch(es) of {}{}{}{}",
        layout.dp,
        layout.pp,
        layout.tp,
        layout.micro_batches,
        layout.micro_batch,
        match layout.split {
            StageSplit::Even => String::new(),
            split => format!(", {} stages of {} blocks", split.name(), join(blocks)),
        },
        layout.recomputation(),
        zero(layout)
    )
}

/// What the replicas split, as the plan's reason says it.
fn zero(layout: &Layout) -> &'static str {
    match (layout.shard_state, layout.recompute) {
        (ShardState::None, _) => "",
        (ShardState::Optimizer, _) => ", ZeRO-1 (optimizer state split over the replicas)",
        (ShardState::Gradients, _) => ", ZeRO-2 (optimizer state and gradients split)",
        (ShardState::Parameters, false) => ", ZeRO-3 (parameters gathered whole for the step)",
        (ShardState::Parameters, true) => ", ZeRO-3 (parameters gathered one block at a time)",
    }
}

/// Blocks per stage as `6+10+10+6`.
fn join(blocks: &[usize]) -> String {
    let parts: Vec<String> = blocks.iter().map(usize::to_string).collect();
    parts.join("+")
}

/// Why a device of `memory` is rejected: its bytes against what a plan may fill of it.
fn overflow(cluster: &Cluster, memory: &Memory) -> String {
    let usable = cluster.usable(memory.device);
    match cluster.unequal() {
        true => format!(
            "device {} needs {}, {} over the {} it may use",
            memory.device,
            size(memory.total),
            size(memory.total - usable),
            size(usable)
        ),
        false => format!(
            "needs {:.1} GiB per device, {:.1} GiB usable",
            memory.total / GIB,
            usable / GIB
        ),
    }
}

/// Whether `memory` fits its device.
fn fits(cluster: &Cluster, memory: &Memory) -> bool {
    memory.total <= cluster.usable(memory.device)
}

/// The best way to run mesh `(dp, pp, tp)` within `fixed`: the fastest micro-batching (and,
/// with stages, recomputation or not) that fits, else the one needing the least memory,
/// rejected; `None` when `fixed` allows no micro-batching of its replicas (micro-batches that
/// do not cut a replica's samples evenly).
fn best_micro_batching(
    work: &Workload,
    cluster: &Cluster,
    (dp, pp, tp): (usize, usize, usize),
    fixed: Fixed,
    (shard_state, split): (ShardState, StageSplit),
) -> Option<Candidate> {
    // Replicas of a batch that does not divide take one sample more or less (Kiln's uneven
    // shards): the largest sets the pace and the memory, and the smallest must fill every
    // micro-batch.
    let per_replica = work.global_batch.div_ceil(dp);
    let smallest = work.global_batch / dp;
    let make = |(micro_batches, recompute): (usize, bool)| {
        let layout = Layout {
            dp,
            pp,
            tp,
            micro_batches,
            micro_batch: per_replica / micro_batches,
            recompute,
            shard_state,
            split,
        };
        let (memory, time) = (
            memory(work, cluster, &layout),
            step_time(work, cluster, &layout),
        );
        let model_flops =
            (1.0 + work.backward_passes) * work.forward_flops * work.global_batch as f64;
        let peak = time.total * cluster.devices as f64 * cluster.peak_flops;
        let utilisation = model_flops / peak;
        Candidate {
            strategy: strategy(&layout, cluster.devices),
            layout,
            blocks: stages::blocks(work, cluster, &layout),
            memory,
            time,
            utilisation,
            rejected: None,
        }
    };
    // Stages recompute whole; without stages, a model that recomputes its blocks (under
    // replicas, not shards) recomputes one at a time.
    let can = pp > 1 || (tp == 1 && work.recomputes_blocks && !fixed.staged);
    let recompute = fixed.recomputations(can);
    let all: Vec<Candidate> = divisors(per_replica)
        .filter(|&m| m <= smallest && fixed.allows_micro_batches(m))
        .flat_map(|m| recompute.iter().map(move |&r| (m, r)))
        .map(make)
        .collect();
    let fastest = all
        .iter()
        .filter(|c| fits(cluster, &c.memory))
        .min_by(|a, b| a.time.total.total_cmp(&b.time.total));
    if let Some(c) = fastest {
        return Some(c.clone());
    }
    let mut least = all
        .into_iter()
        .min_by(|a, b| fullness(cluster, &a.memory).total_cmp(&fullness(cluster, &b.memory)))?;
    least.rejected = Some(overflow(cluster, &least.memory));
    Some(least)
}

const GIB: f64 = (1u64 << 30) as f64;

/// How full `memory` makes its device: 1 at its limit.
fn fullness(cluster: &Cluster, memory: &Memory) -> f64 {
    memory.total / cluster.usable(memory.device)
}

/// Every layout of `cluster` for `work`, estimated; the fastest that fits first.
///
/// # Errors
/// [`PlanError::NothingFits`] naming the least memory any layout needs and what would fit;
/// [`PlanError::NoLayout`] for an empty cluster or batch.
pub fn search(work: &Workload, cluster: &Cluster) -> Result<Planned, PlanError> {
    search_within(work, cluster, Fixed::default())
}

/// [`search`] among the layouts that keep to `fixed`.
///
/// # Errors
/// As [`search`]; [`PlanError::NoLayout`] when no layout of the cluster keeps to `fixed`.
pub fn search_within(
    work: &Workload,
    cluster: &Cluster,
    fixed: Fixed,
) -> Result<Planned, PlanError> {
    let candidates = candidates(work, cluster, fixed)?;
    let (mut fit, rejected): (Vec<_>, Vec<_>) =
        candidates.into_iter().partition(|c| c.rejected.is_none());
    fit.sort_by(|a, b| a.time.total.total_cmp(&b.time.total));
    let Some(fastest) = fit.first().map(|c| c.time.total) else {
        return Err(nothing_fits(work, cluster, fixed, &rejected));
    };
    // Within the model's error of the fastest, the simplest layout: fewest devices per
    // replica, then fewest micro-batches, then no recomputation.
    let tolerance = cluster.tolerance();
    let simplest = fit
        .iter()
        .enumerate()
        .filter(|(_, c)| c.time.total <= fastest * (1.0 + tolerance))
        .min_by_key(|(_, c)| {
            let l = &c.layout;
            (
                l.pp * l.tp,
                l.micro_batches,
                l.recompute,
                l.shard_state,
                l.split,
            )
        })
        .map(|(i, _)| i)
        .expect("the fastest is close to itself");
    let best = fit.remove(simplest);
    let why = match simplest {
        0 => format!("the fastest of {} layouts that fit", fit.len() + 1),
        _ => format!(
            "the simplest of the {} layouts that fit within {:.0} % of the fastest",
            fit.len() + 1,
            tolerance * 100.0
        ),
    };
    let reason = format!(
        "{}: {why} ({} rejected): {}, {:.1} ms a step predicted ({:.0} % model FLOPs \
         utilisation), {}{}",
        best.strategy.name(),
        rejected.len(),
        describe(&best.layout, &best.blocks),
        best.time.total * 1e3,
        best.utilisation * 100.0,
        match cluster.unequal() {
            true => format!(
                "{} of the {} it may use on device {}, the fullest",
                size(best.memory.total),
                size(cluster.usable(best.memory.device)),
                best.memory.device
            ),
            false => format!(
                "{} of {} per device",
                size(best.memory.total),
                size(cluster.memory as f64)
            ),
        },
        stages::why(&best.layout, &best.blocks),
    );
    fit.insert(0, best);
    fit.extend(rejected);
    Ok(Planned {
        candidates: fit,
        reason,
    })
}

fn candidates(
    work: &Workload,
    cluster: &Cluster,
    fixed: Fixed,
) -> Result<Vec<Candidate>, PlanError> {
    if cluster.devices == 0 || cluster.per_node == 0 {
        return Err(PlanError::NoLayout("a cluster of no devices".into()));
    }
    cluster.check_limits()?;
    if work.global_batch == 0 {
        return Err(PlanError::NoLayout("a global batch of no samples".into()));
    }
    let mut found = Vec::new();
    let mut kept = false;
    // Meshes whose replicas' samples the fixed micro-batches do not cut evenly.
    let mut uncut = Vec::new();
    for tp in divisors(cluster.devices).filter(|&t| work.shards_into(t)) {
        for pp in divisors(cluster.devices / tp).filter(|&p| p <= work.layers) {
            if !fixed.allows(pp, tp) {
                continue;
            }
            kept = true;
            let dp = cluster.devices / (tp * pp);
            if work.global_batch < dp {
                continue;
            }
            // Plain replicas may also split their state (`ddp`'s ZeRO stages): a layout each,
            // less memory for other collectives. Burn's backward returns every gradient at
            // once, and its autodiff keeps every parameter a forward used until the
            // backward, so ZeRO-2 and ZeRO-3 gathered whole peak as ZeRO-1 does; ZeRO-3 cuts
            // the peak where the model recomputes its blocks and gathers each as it runs it.
            let state_splits: &[ShardState] = match dp > 1 && pp == 1 && tp == 1 && !fixed.staged {
                true => &ShardState::ALL,
                false => &[ShardState::None],
            };
            // Stages may be cut evenly, balanced, or (on devices that differ) filled in turn:
            // each a layout of its own where its blocks differ from the even split's.
            let stage_splits: &[StageSplit] = match (pp > 1, cluster.unequal()) {
                (false, _) => &[StageSplit::Even],
                (true, false) => &[StageSplit::Even, StageSplit::Balanced],
                (true, true) => &StageSplit::ALL,
            };
            let mut even_blocks = None;
            let layouts = state_splits
                .iter()
                .flat_map(|&state| stage_splits.iter().map(move |&stages| (state, stages)));
            for split in layouts {
                let mesh = (dp, pp, tp);
                let Some(mut candidate) = best_micro_batching(work, cluster, mesh, fixed, split)
                else {
                    uncut.push(work.global_batch.div_ceil(dp));
                    break;
                };
                match split.1 {
                    StageSplit::Even => even_blocks = Some(candidate.blocks.clone()),
                    _ if even_blocks.as_ref() == Some(&candidate.blocks) => continue,
                    _ => {}
                }
                candidate.strategy = fixed.strategy(&candidate.layout, cluster.devices);
                if tp > cluster.per_node || !cluster.per_node.is_multiple_of(tp) {
                    candidate.rejected = Some(format!(
                        "{tp} shards span machines of {} devices: every block's all-reduces \
                         would cross the network",
                        cluster.per_node
                    ));
                }
                found.push(candidate);
            }
        }
    }
    if !kept {
        return Err(PlanError::NoLayout(format!(
            "no layout of {} devices keeps to {fixed}: the devices must be a multiple of the \
             stages times the shards, and the model must split into them",
            cluster.devices
        )));
    }
    if found.is_empty()
        && let Some(m) = fixed.micro_batches
        && !uncut.is_empty()
    {
        uncut.sort_unstable();
        uncut.dedup();
        let samples: Vec<String> = uncut.iter().map(usize::to_string).collect();
        return Err(PlanError::NoLayout(format!(
            "{m} micro-batch(es) cut no layout's replicas evenly (a replica's samples of a \
             global batch of {}: {}): fix micro-batches that divide them, or leave them to \
             the planner",
            work.global_batch,
            samples.join(", ")
        )));
    }
    if found.is_empty() {
        return Err(PlanError::NoLayout(format!(
            "no layout of {} devices gives every replica a sample of a global batch of {}",
            cluster.devices, work.global_batch
        )));
    }
    Ok(found)
}

fn nothing_fits(
    work: &Workload,
    cluster: &Cluster,
    fixed: Fixed,
    rejected: &[Candidate],
) -> PlanError {
    // The least full among the layouts rejected for memory (a layout rejected for its shards'
    // spanning machines may need less, and would contradict the message).
    let least = rejected
        .iter()
        .filter(|c| !fits(cluster, &c.memory))
        .min_by(|a, b| fullness(cluster, &a.memory).total_cmp(&fullness(cluster, &b.memory)));
    let Some(least) = least else {
        return PlanError::NoLayout(format!(
            "every layout that fits splits its layers over more shards than a machine's {} \
             devices: give machines of more devices (--gpus-per-node), or more memory per device",
            cluster.per_node
        ));
    };
    if cluster.unequal() {
        return PlanError::DeviceOverflows {
            layout: describe(&least.layout, &least.blocks),
            overflow: overflow(cluster, &least.memory),
        };
    }
    // The fewest devices (whole machines, doubling) with which a layout fits.
    let more = (1..=20)
        .map(|k| cluster.devices << k)
        .take_while(|&devices| devices <= MOST_DEVICES)
        .find(|&devices| {
            let bigger = Cluster {
                devices,
                ..cluster.clone()
            };
            candidates(work, &bigger, fixed)
                .is_ok_and(|all| all.iter().any(|c| c.rejected.is_none()))
        });
    let memory = cluster.memory as f64 / GIB;
    let needed = least.memory.total / GIB;
    let fix = match more {
        Some(devices) => format!(
            "{devices} such devices would fit, or {:.1} GiB per device",
            needed / USABLE_MEMORY
        ),
        None => format!("devices of {:.1} GiB would fit", needed / USABLE_MEMORY),
    };
    PlanError::NothingFits {
        needed,
        layout: describe(&least.layout, &least.blocks),
        memory,
        usable: memory * USABLE_MEMORY,
        fix,
    }
}
