//! The planner's inputs measured on this machine: a model's step timed on one rank
//! ([`calibrate`]), the collective's latency and bandwidth between two ranks
//! ([`probe_links`]), and what the model's own ranks cost beyond their parts
//! ([`calibrate_ranks`]). `kiln plan --model` and `auto` feed them to the cost model; the plan
//! benchmark times every candidate with [`time_steps`].

use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};

use crate::collective::{Collective, CollectiveError, InProcess, Link, ReduceOp};
use crate::data::{DataSource, EpochSampler};
use crate::model::ParallelModel;
use crate::plan::cost::{Cluster, FitError, Measured, Timing, Workload};
use crate::plan::{Plan, PlanRequest, Planner, StrategyKind};
use crate::stats::{WARMUP, median, spread};
use crate::strategy::{
    ConfigError, OptimizerSpec, RankStats, StrategyConfigs, StrategyError, build,
};
use crate::tensor_parallel::TpBackend;

mod ranks;

pub use ranks::{TIMED_RANKS, calibrate_ranks};

/// Why the machine could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// A timed step failed.
    #[error("timing the model's step: {0}")]
    Step(#[from] StrategyError),
    /// The timings do not separate the step's costs.
    #[error(transparent)]
    Fit(#[from] FitError),
    /// The collective's probe failed.
    #[error("probing the collective: {0}")]
    Probe(#[from] CollectiveError),
}

/// The learning rate of timed steps: any rate trains at the same speed.
const LR: f64 = 1e-3;

/// Rounds [`calibrate`] times its points in.
const ROUNDS: usize = 2;

/// What [`time_steps`] measured.
#[derive(Debug, Clone)]
pub struct TimedSteps {
    /// Seconds of each timed step.
    pub steps: Vec<f64>,
    /// Each rank's statistics over the timed steps.
    pub ranks: Vec<RankStats>,
}

impl TimedSteps {
    /// The median step's seconds: a noisy machine's outliers left out.
    pub fn median(&self) -> f64 {
        median(&self.steps)
    }

    /// The steps' interquartile range over their median.
    pub fn spread(&self) -> f64 {
        spread(&self.steps)
    }
}

/// How many steps a timing takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// Untimed steps first.
    pub warmup: usize,
    /// Timed steps at least.
    pub steps: usize,
    /// Then more, until the timed steps took this many seconds together (a fast step is
    /// noisy: many are needed for a steady median) ...
    pub seconds: f64,
    /// ... or this many were timed.
    pub most_steps: usize,
}

impl Budget {
    /// This budget `by` times over: its seconds, and its step counts rounded down and one more
    /// (a companion given `scaled(1.5)` still outlasts a run of one step). The warm-up stays.
    pub(crate) fn scaled(self, by: f64) -> Self {
        let count = |n: usize| ((n as f64 * by) as usize).saturating_add(1);
        Self {
            seconds: self.seconds * by,
            steps: count(self.steps),
            most_steps: count(self.most_steps),
            ..self
        }
    }

    /// `steps` timed steps exactly, after `warmup`.
    pub fn steps(warmup: usize, steps: usize) -> Self {
        Self {
            warmup,
            steps,
            seconds: 0.0,
            most_steps: steps,
        }
    }
}

/// Trains `model` through `plan`'s strategy on `devices` with `optim`'s optimizer for the
/// `budget`'s untimed, then timed, steps, on batches of `data` in a fixed order from `seed`.
///
/// # Errors
/// What building the strategy or a step returns.
pub fn time_steps<B, M, S, I>(
    plan: &Plan,
    devices: &[B::Device],
    model: M,
    optim: &S,
    data: DataSource<B, I, M::Input>,
    budget: Budget,
    seed: u64,
) -> Result<TimedSteps, StrategyError>
where
    B: AutodiffBackend + TpBackend,
    M: ParallelModel<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    // Epoch after epoch, as training reads them.
    let sampler = EpochSampler::new(data.len(), plan.global_batch(), seed)?;
    let mut batches = sampler.batches();
    let model = model.fork(&devices[0]);
    let mut strategy = build(plan, devices.to_vec(), model, optim, data)?;
    for batch in batches.by_ref().take(budget.warmup) {
        strategy.step(&batch, LR)?;
    }
    let before = strategy.stats();
    let mut times = Vec::with_capacity(budget.steps);
    let mut total = 0.0;
    for batch in batches {
        let enough = times.len() >= budget.steps && total >= budget.seconds;
        if enough || times.len() >= budget.most_steps.max(budget.steps) {
            break;
        }
        let start = Instant::now();
        strategy.step(&batch, LR)?;
        let seconds = start.elapsed().as_secs_f64();
        total += seconds;
        times.push(seconds);
    }
    let ranks = before
        .into_iter()
        .zip(strategy.stats())
        .map(|(before, after)| after.since(&before))
        .collect();
    Ok(TimedSteps {
        steps: times,
        ranks,
    })
}

/// The samples and micro-batches [`calibrate`] times a model at, for a global batch of
/// `batch`: the batch whole and in four micro-batches, a quarter of it whole and in eight.
/// The costs differ by orders of magnitude (a micro-batch's dispatch is a few percent of a
/// step), so the points must separate them well: the quarter in eight micro-batches of a few
/// samples each is mostly dispatch.
fn calibration_points(batch: usize) -> Vec<(usize, usize)> {
    let quarter = batch.div_ceil(4).max(2);
    let mut points = vec![
        (batch.max(2), 1),
        (quarter, 1),
        (quarter, quarter.min(8)),
        (batch.max(2), batch.clamp(2, 4)),
    ];
    for p in &mut points {
        // Micro-batches of equal size.
        p.0 = p.0 / p.1 * p.1;
    }
    points.dedup();
    points
}

/// Runs `timed` while each of `companions` runs on a thread of its own, as the other cores'
/// ranks would, and returns what `timed` returned. Companions should run a little longer
/// than the timed work ([`longer`]), so that it is never alone.
fn beside<T, C, F>(
    companions: impl IntoIterator<Item = F>,
    timed: impl FnOnce() -> Result<T, StrategyError>,
) -> Result<T, StrategyError>
where
    C: Send,
    F: FnOnce() -> Result<C, StrategyError> + Send,
{
    std::thread::scope(|s| {
        let companions: Vec<_> = companions.into_iter().map(|c| s.spawn(c)).collect();
        let timed = timed();
        for c in companions {
            c.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
        }
        timed
    })
}

/// The steps [`calibrate`] counts a rank's peak memory over on `device`. The host's count is
/// exact, and two steps hold every buffer a step makes; a device's is read by a watch every
/// few tens of microseconds ([`crate::memory::device`]), which can miss a short-lived peak in
/// a few steps: over a fifth of a second of steps it reads within a few percent of the most
/// (the MLP's peak on an H100 read 14 % lower over 3 steps than over 250).
fn memory_budget<D: std::any::Any>(device: &D) -> Budget {
    match crate::memory::device::has_own_memory(device) {
        false => Budget::steps(1, 2),
        true => Budget {
            warmup: 1,
            steps: 10,
            seconds: 0.2,
            most_steps: 1000,
        },
    }
}

/// `budget` a little longer: what companions of a timed run are given, so that they outlast it.
fn longer(budget: Budget) -> Budget {
    budget.scaled(1.5)
}

/// The plan of `strategy` over `world` single-threaded ranks (as CPU ranks run) for
/// `samples` in `micro_batches`.
fn timing_plan(
    strategy: StrategyKind,
    world: usize,
    samples: usize,
    micro_batches: usize,
) -> Result<Plan, StrategyError> {
    let mut configs = StrategyConfigs::default();
    configs.set_threads_per_rank(1);
    configs.set_grad_accumulation(micro_batches);
    Ok(Plan::resolve(
        PlanRequest::new(strategy, samples)
            .with_world(world)
            .with_configs(configs),
    )?)
}

/// Times a step of `model` on one rank of `device` (one intra-op thread, as CPU ranks run)
/// at several batch sizes and micro-batch counts around `batch`, each as long as `budget`
/// says, and fits the [`Measured`] costs.
///
/// Ranks that share a CPU compute side by side: the cores share the memory bus and caches,
/// and each runs slower than it does alone (5 to 10 % for the transformer on this project's
/// 2-core machine). So `beside` more copies of the same step run on threads of their own
/// while one is timed, as the other cores' ranks would. The batch whole is then timed once
/// more alone, for the cost model's runs that leave cores idle ([`Measured::alone`]). Where
/// the process counts its memory ([`crate::memory`]), the steps of one micro-batch run once
/// more alone, for the rank's peak bytes.
///
/// # Errors
/// What a step returns, or timings that cannot be fitted.
pub fn calibrate<B, M, S, I>(
    device: &B::Device,
    model: &M,
    optim: &S,
    data: &DataSource<B, I, M::Input>,
    (batch, others): (usize, usize),
    budget: Budget,
    seed: u64,
) -> Result<Measured, MeasureError>
where
    B: AutodiffBackend + TpBackend,
    M: ParallelModel<B>,
    S: OptimizerSpec<B> + Sync,
    I: Send + 'static,
{
    // The fit needs points that differ in samples and micro-batches, and a step's costs are
    // linear in its samples: a batch of fewer than 8 is timed at 8 (as the data allows).
    let batch = batch.max(8).min(data.len()).max(1);
    let points = calibration_points(batch);
    // Each point is timed in rounds, its steps pooled: a burst of another program's work on
    // a shared machine then falls on a part of every point's steps, not on one point's all.
    let round = Budget {
        seconds: budget.seconds / ROUNDS as f64,
        steps: budget.steps.div_ceil(ROUNDS),
        most_steps: budget.most_steps.div_ceil(ROUNDS),
        ..budget
    };
    let mut steps = vec![Vec::new(); points.len()];
    let mut peaks = vec![None; points.len()];
    for r in 0..ROUNDS {
        for (i, &(samples, micro_batches)) in points.iter().enumerate() {
            let plan = &timing_plan(StrategyKind::Single, 1, samples, micro_batches)?;
            let time = move |model: M, data: DataSource<B, I, M::Input>, budget: Budget| {
                let devices = std::slice::from_ref(device);
                time_steps(plan, devices, model, optim, data, budget, seed)
            };
            let companions = (0..others).map(|_| {
                let (model, data) = (model.clone(), data.clone());
                move || time(model, data, longer(round))
            });
            let timed = beside(companions, || time(model.clone(), data.clone(), round))?;
            steps[i].extend(timed.steps);
            if r == 0 && micro_batches == 1 && crate::memory::counting() {
                // Counted alone: the companions' ranks are numbered as this one's.
                peaks[i] = time(model.clone(), data.clone(), memory_budget(device))?
                    .ranks
                    .first()
                    .and_then(|r| r.peak_bytes);
            }
        }
    }
    let timings: Vec<Timing> = points
        .iter()
        .zip(steps.iter().zip(peaks))
        .map(|(&(samples, micro_batches), (steps, peak_bytes))| Timing {
            samples,
            micro_batches,
            seconds: median(steps),
            spread: spread(steps),
            steps: steps.len(),
            peak_bytes,
        })
        .collect();
    let measured = Measured::fit(&timings)?;
    if others == 0 {
        return Ok(measured);
    }
    let (samples, _) = points[0];
    let plan = timing_plan(StrategyKind::Single, 1, samples, 1)?;
    let devices = std::slice::from_ref(device);
    let alone = time_steps(
        &plan,
        devices,
        model.clone(),
        optim,
        data.clone(),
        budget,
        seed,
    )?;
    Ok(measured.with_alone(samples, alone.median()))
}

/// Whether `error` says the model cannot be cut as a layout asks (it refuses stages or
/// shards): a layout the measurement skips, not a failure.
pub(super) fn cannot_cut(error: &StrategyError) -> bool {
    matches!(
        error,
        StrategyError::Config(
            ConfigError::Unsupported { .. }
                | ConfigError::TooManyStages { .. }
                | ConfigError::SplitRefused { .. }
                | ConfigError::Shard(_),
        )
    )
}

/// The in-process collective between two ranks on `device`, `calls` timed each way after a
/// warm-up:
/// - its latency: the second rank sleeps before each all-reduce of 16 values, so the first
///   is asleep in the call when the second arrives, as ranks reach a step's collectives one
///   after the other; the latency is the time from the second's arrival to the first's
///   return (waking a thread, on a machine of few cores, is most of a small collective);
/// - its bandwidth: all-reduces of 1 Mi values (4 MiB) against ones of 16, back to back.
///
/// # Errors
/// A collective that fails (a timeout: a rank that does not arrive in `timeout`).
pub fn probe_links<B: AutodiffBackend>(
    device: &B::Device,
    calls: usize,
    timeout: Duration,
) -> Result<Link, MeasureError> {
    const SMALL: usize = 16;
    const LARGE: usize = 1 << 20;
    /// How long the second rank sleeps before each latency call: enough for the first to
    /// fall asleep waiting.
    const LATE: Duration = Duration::from_micros(300);
    let rounds = calls + WARMUP;
    let arrivals: Vec<std::sync::OnceLock<Instant>> =
        (0..rounds).map(|_| std::sync::OnceLock::new()).collect();
    let run = |mut rank: InProcess<B>| -> Result<(f64, f64, f64), CollectiveError> {
        let tensor = |len: usize| {
            Tensor::<B, 1>::from_data(TensorData::new(vec![1.0f32; len], [len]), device)
        };
        let (small, large) = (tensor(SMALL), tensor(LARGE));
        let mut woken = Vec::with_capacity(calls);
        for (call, arrival) in arrivals.iter().enumerate() {
            if rank.rank() == 1 {
                std::thread::sleep(LATE);
                let _ = arrival.set(Instant::now());
            }
            let _ = rank.all_reduce(small.clone(), ReduceOp::Sum)?.into_data();
            if rank.rank() == 0 && call >= WARMUP {
                let arrived = *arrival.get().expect("the second rank arrived first");
                woken.push(arrived.elapsed().as_secs_f64());
            }
        }
        let mut back_to_back = |tensor: &Tensor<B, 1>| -> Result<f64, CollectiveError> {
            let mut times = Vec::with_capacity(calls);
            for call in 0..rounds {
                let start = Instant::now();
                // The result read back, as a step's gradients are used.
                let _ = rank.all_reduce(tensor.clone(), ReduceOp::Sum)?.into_data();
                if call >= WARMUP {
                    times.push(start.elapsed().as_secs_f64());
                }
            }
            Ok(median(&times))
        };
        Ok((median(&woken), back_to_back(&small)?, back_to_back(&large)?))
    };
    let [first, second]: [InProcess<B>; 2] = InProcess::group(2, timeout)
        .try_into()
        .unwrap_or_else(|_| unreachable!("a group of two"));
    let (latency, small, large) = std::thread::scope(|s| {
        let other = s.spawn(|| run(second));
        let mine = run(first);
        let theirs = other
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        theirs.and(mine)
    })?;
    Ok(Link::probed(latency, small, large, (LARGE * 4) as f64))
}

/// Steps [`planner`] times at each calibration point: at least 5 and a fifth of a second, at
/// most 1000.
const PLANNER_BUDGET: Budget = Budget {
    warmup: WARMUP,
    steps: 5,
    seconds: 0.2,
    most_steps: 1000,
};

/// The untimed steps [`device_planner`] runs before it calibrates: half a second of them.
const DEVICE_WARMUP: Budget = Budget {
    warmup: WARMUP,
    steps: 10,
    seconds: 0.5,
    most_steps: 10_000,
};

/// All-reduces [`planner`]'s link probe times at each size.
const PROBE_CALLS: usize = 20;

/// This machine's `cores` as the planner's devices for `model`'s step (`workload` to the cost
/// model) on batches of `batch` from `data`, trained with `optim`: the step timed on one core
/// of `devices` ([`calibrate`], beside copies on the others, and alone), the in-process
/// collective probed ([`probe_links`]), and the step over two to four ranks of `devices`
/// ([`calibrate_ranks`]).
/// About a second. Where the process counts its memory, the memory model is then fitted to
/// the model cut over shards and stages ([`fit_memory`](super::memory_fit::fit_memory)). What
/// `auto` plans with on the CPU, whatever the model.
///
/// # Errors
/// A step or the probe that fails, or timings that cannot be fitted.
#[allow(clippy::too_many_arguments)]
pub fn planner<B, M, S, I>(
    workload: Workload,
    devices: &[B::Device],
    model: &M,
    optim: &S,
    data: &DataSource<B, I, M::Input>,
    batch: usize,
    cores: usize,
    seed: u64,
) -> Result<Planner, MeasureError>
where
    B: AutodiffBackend + TpBackend,
    M: ParallelModel<B>,
    S: OptimizerSpec<B> + Sync,
    I: Send + 'static,
{
    let device = &devices[0];
    let others = cores.saturating_sub(1);
    let measured = calibrate(
        device,
        model,
        optim,
        data,
        (batch, others),
        PLANNER_BUDGET,
        seed,
    )?;
    let link = probe_links::<B>(device, PROBE_CALLS, Duration::from_secs(60))?;
    let planner = cpu_planner(workload, measured, link, cores);
    let others = cores.saturating_sub(2);
    let planner = calibrate_ranks(
        planner,
        devices,
        model,
        optim,
        data,
        (batch, others),
        PLANNER_BUDGET,
        seed,
    )?;
    super::memory_fit::fit_memory(planner, device, model, optim, data, seed)
}

/// `devices` that have memory of their own (GPUs: one rank each, `memory` bytes each) as the
/// planner's devices for `model`'s step (`workload` to the cost model) on batches of `batch`
/// from `data`, trained with `optim`: the step timed on the first ([`calibrate`], alone), and
/// where there are two distinct devices, the collective probed ([`probe_links`], on the first
/// device) and the step timed over the first two ([`calibrate_ranks`]). What `auto` plans a
/// CUDA run with.
///
/// # Errors
/// A step or the probe that fails, or timings that cannot be fitted.
#[allow(clippy::too_many_arguments)]
pub fn device_planner<B, M, S, I>(
    workload: Workload,
    devices: &[B::Device],
    memory: u64,
    model: &M,
    optim: &S,
    data: &DataSource<B, I, M::Input>,
    batch: usize,
    seed: u64,
) -> Result<Planner, MeasureError>
where
    B: AutodiffBackend + TpBackend,
    M: ParallelModel<B>,
    S: OptimizerSpec<B> + Sync,
    I: Send + 'static,
{
    let mut distinct: Vec<B::Device> = Vec::with_capacity(devices.len());
    for device in devices {
        if !distinct.contains(device) {
            distinct.push(device.clone());
        }
    }
    // A GPU idle before the run runs at lower clocks for its first fraction of a second of
    // work: steps before the timed ones, so that the calibration's first points are not
    // timed slower than its last.
    let plan = timing_plan(StrategyKind::Single, 1, batch.min(data.len()).max(1), 1)?;
    let one = std::slice::from_ref(&distinct[0]);
    time_steps(
        &plan,
        one,
        model.clone(),
        optim,
        data.clone(),
        DEVICE_WARMUP,
        seed,
    )?;
    let measured = calibrate(
        &distinct[0],
        model,
        optim,
        data,
        (batch, 0),
        PLANNER_BUDGET,
        seed,
    )?;
    let link = match distinct.len() {
        // One device: no collective to price (a plan of one rank has none). The largest
        // finite bandwidth, not an infinite one, so that the cluster still writes as JSON.
        1 => Link {
            latency: 0.0,
            bandwidth: f64::MAX,
        },
        _ => probe_links::<B>(&distinct[0], PROBE_CALLS, Duration::from_secs(60))?,
    };
    let shape = Shape {
        devices: distinct.len(),
        memory,
        cores: None,
    };
    let planner = measured_planner(workload, measured, link, shape);
    // With one device it has no pair to time, and returns the planner as it is.
    calibrate_ranks(
        planner,
        &distinct,
        model,
        optim,
        data,
        (batch, 0),
        PLANNER_BUDGET,
        seed,
    )
}

/// This machine's `cores` as the planner's devices, running `workload` as `measured` on one
/// core, linked as `link` says: what `auto` plans a CPU run with. Their memory is the
/// machine's (Linux's `MemTotal`, or 8 GiB where `/proc` does not say), shared among the
/// ranks.
pub fn cpu_planner(workload: Workload, measured: Measured, link: Link, cores: usize) -> Planner {
    let shape = Shape {
        devices: cores,
        memory: machine_memory(),
        cores: Some(cores),
    };
    measured_planner(workload, measured, link, shape)
}

/// The devices of a measured machine.
struct Shape {
    /// How many.
    devices: usize,
    /// Bytes of memory each.
    memory: u64,
    /// The cores they share, when they are a CPU's ([`Cluster::cores`]).
    cores: Option<usize>,
}

/// The planner of `shape`'s devices, running `workload` as `measured` on one, linked as `link`
/// says.
///
/// Where the calibration counted the rank's memory, the workload's activations are scaled to
/// the measured bytes per sample, and what the rank held beyond its parameters, gradients,
/// moments and activations becomes the workload's `fixed_bytes`.
fn measured_planner(
    mut workload: Workload,
    measured: Measured,
    link: Link,
    shape: Shape,
) -> Planner {
    if let Some((base, per_sample)) = measured.memory_line() {
        let predicted = workload.block_activation_bytes[0] * workload.layers as f64;
        if predicted > 0.0 {
            let scale = per_sample / predicted;
            for bytes in &mut workload.block_activation_bytes {
                *bytes *= scale;
            }
            workload.boundary_bytes *= scale.max(1.0);
        }
        let state = workload.params as f64 * workload.weight_bytes
            + workload.trainable as f64 * workload.trainable_extra_bytes;
        workload.fixed_bytes = (base - state).max(0.0);
    }
    // The model's own FLOPs over its measured time a sample: the "peak" its utilisation is
    // read against is one device's speed on this model (finite, as a plan's JSON holds it,
    // where the fit leaves no time a sample).
    let per_sample = measured.per_sample.max(f64::MIN_POSITIVE);
    let flops =
        ((1.0 + workload.backward_passes) * workload.forward_flops / per_sample).min(f64::MAX);
    let cluster = Cluster {
        devices: shape.devices,
        per_node: shape.devices,
        memory: shape.memory,
        peak_flops: flops,
        efficiency: 1.0,
        intra_bandwidth: link.bandwidth,
        inter_bandwidth: link.bandwidth,
        intra_latency: link.latency,
        inter_latency: link.latency,
        cores: shape.cores,
        measured: Some(measured),
    };
    Planner {
        workload,
        cluster,
        nodes: 1,
    }
}

/// The machine's memory (Linux's `MemTotal`), or 8 GiB where `/proc` does not say.
fn machine_memory() -> u64 {
    let read = || -> Option<u64> {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    read().unwrap_or(8 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_points_separate_the_three_costs() {
        for batch in [8, 9, 64, 96, 1000] {
            let points = calibration_points(batch);
            assert!(points.len() >= 3, "{batch}: {points:?}");
            // Two sizes at one micro-batch, and two micro-batch counts at one size.
            let single: Vec<_> = points.iter().filter(|p| p.1 == 1).collect();
            assert!(
                single.len() >= 2 && single[0].0 != single[1].0,
                "{points:?}"
            );
            assert!(points.iter().any(|p| p.1 > 1), "{points:?}");
            for &(samples, micro_batches) in &points {
                assert!(samples.is_multiple_of(micro_batches) && samples >= micro_batches);
            }
        }
    }
}
