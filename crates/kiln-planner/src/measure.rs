//! The timing harness and the step's calibration: a model's step timed on one rank
//! ([`calibrate`]) and what the model's own ranks cost beyond their parts
//! ([`calibrate_ranks`]). The planner ([`super::planner`]) feeds them to the cost model; the
//! plan benchmark times every candidate with [`time_steps`].

use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;

use kiln_core::collective::CollectiveError;
use kiln_core::data::{DataSource, EpochSampler};
use kiln_core::plan::cost::{FitError, Measured, Timing};
use kiln_core::plan::{Plan, PlanRequest, StrategyKind};
use kiln_core::stats::{median, spread};
use kiln_core::strategy::StrategyModel;
use kiln_core::strategy::{
    ConfigError, OptimizerSpec, RankStats, StrategyConfigs, StrategyError, build,
};
use kiln_core::tensor_parallel::TpBackend;

mod ranks;

pub use ranks::{TIMED_RANKS, calibrate_ranks};

/// The most shards a block is measured over, for its time ([`calibrate_ranks`]) and its memory
/// ([`fit_memory`](crate::memory_fit::fit_memory)): more ranks than a small machine has cores
/// only take turns, and the activations a shard holds change little beyond.
pub const MOST_SHARDS: usize = 4;

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
    M: StrategyModel<B>,
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
/// few tens of microseconds ([`kiln_core::memory::device`]), which can miss a short-lived peak in
/// a few steps: over a fifth of a second of steps it reads within a few percent of the most
/// (the MLP's peak on an H100 read 14 % lower over 3 steps than over 250).
fn memory_budget<D: std::any::Any>(device: &D) -> Budget {
    match kiln_core::memory::device::has_own_memory(device) {
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
pub(super) fn timing_plan(
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
/// the process counts its memory ([`kiln_core::memory`]), the steps of one micro-batch run once
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
    M: StrategyModel<B>,
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
            if r == 0 && micro_batches == 1 && kiln_core::memory::counting() {
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
