//! The training loop programs share: pick the strategy, build it, step it over epoch-shuffled
//! global batches, and say what happened.
//!
//! `kiln train` and the Algorithm Distillation job both train through [`fit`]; what they
//! print and save around it is theirs.

use std::time::Instant;

use burn::module::{AutodiffModule, ModuleDisplay};
use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

use crate::data::{DataSource, EpochSampler};
use crate::optim::{LowPrecisionStep, MixedPrecision, OptimizerState, OutputLoss, Precision};
use crate::stages::PipelineModel;
use crate::strategy::{
    AutoDecision, OptimizerSpec, PerformanceSpec, RankReport, StepOutput, Strategy,
    StrategyConfigs, StrategyError, StrategyKind, TrainModel, build, build_replicated,
};

/// What to train and for how long.
pub struct FitPlan<'a> {
    /// The strategy; `Auto` is resolved from the number of devices and logged with why.
    pub strategy: StrategyKind,
    /// Every strategy's settings; the chosen one's apply.
    pub configs: &'a StrategyConfigs,
    /// Samples per optimizer step, all ranks together.
    pub batch: usize,
    /// Optimizer steps.
    pub steps: usize,
    /// Seed of the sample order.
    pub seed: u64,
    /// The learning rate of each step (0-based).
    pub lr: &'a dyn Fn(usize) -> f64,
    /// Where a resumed run starts; `None` starts at step 0 with a fresh optimizer.
    pub resume: Option<&'a Resume>,
    /// Whether to read the optimizer state out of the ranks at the end
    /// ([`FitRecord::optimizer`]): only a run that checkpoints needs it, and it costs an
    /// encoding of every optimizer buffer.
    pub keep_optimizer_state: bool,
}

/// Where a resumed [`fit`] starts: the steps already trained (the sampler skips their batches)
/// and the optimizer state after them. With the model saved at that point, the run continues
/// bit for bit as if it had not stopped.
#[derive(Debug, Clone)]
pub struct Resume {
    /// Steps already trained.
    pub step: usize,
    /// The strategy's optimizer state after them ([`FitRecord::optimizer`]).
    pub optimizer: OptimizerState,
}

/// What a [`fit`] did.
#[derive(Debug, Clone)]
pub struct FitRecord {
    /// The strategy that ran, and why.
    pub decision: AutoDecision,
    /// Its ranks.
    pub world: usize,
    /// The loss of every step this run trained (from the resumed step on).
    pub losses: Vec<f64>,
    /// Steps the NaN guard skipped (`nan_policy = "skip"`).
    pub skipped_steps: usize,
    /// The optimizer state at the end, to checkpoint next to the model, when the plan asked
    /// for it ([`FitPlan::keep_optimizer_state`]).
    pub optimizer: Option<OptimizerState>,
    /// Seconds of the loop (building the strategy excluded).
    pub wall_s: f64,
    /// Each rank's totals.
    pub ranks: Vec<RankReport>,
}

impl FitRecord {
    /// Mean loss of the last `n` steps (fewer when the run was shorter); NaN without steps.
    pub fn tail_loss(&self, n: usize) -> f64 {
        let tail = &self.losses[self.losses.len().saturating_sub(n)..];
        tail.iter().sum::<f64>() / tail.len() as f64
    }

    /// Milliseconds per optimizer step.
    pub fn ms_per_step(&self) -> f64 {
        1e3 * self.wall_s / self.losses.len().max(1) as f64
    }
}

/// Trains `model` on `data` over `devices` (one rank each) as `plan` says, calling
/// `on_step(step, output)` after every step (1-based), and returns the trained whole model.
///
/// # Errors
/// A global batch the data cannot fill, or what the strategy reports.
pub fn fit<B, M, S, I>(
    plan: &FitPlan<'_>,
    devices: Vec<B::Device>,
    model: M,
    optim: &S,
    data: DataSource<B, I, M::Input>,
    on_step: &mut dyn FnMut(usize, &StepOutput),
) -> Result<(M, FitRecord), StrategyError>
where
    B: AutodiffBackend,
    M: PipelineModel<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    let (decision, sampler) = decide(plan, devices.len(), data.len())?;
    let strategy = build(decision.kind, devices, model, optim, data, plan.configs)?;
    run(plan, decision, &sampler, strategy, on_step)
}

/// [`fit`] for a model without the pipeline's stage contract: the strategies that keep whole
/// replicas (`single`, `data_parallel`, `ddp`, `auto`); `pipeline` is refused.
///
/// # Errors
/// As [`fit`], and [`ConfigError::NoStageContract`](crate::strategy::ConfigError) for the
/// pipeline.
pub fn fit_replicated<B, M, S, I>(
    plan: &FitPlan<'_>,
    devices: Vec<B::Device>,
    model: M,
    optim: &S,
    data: DataSource<B, I, M::Input>,
    on_step: &mut dyn FnMut(usize, &StepOutput),
) -> Result<(M, FitRecord), StrategyError>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    let (decision, sampler) = decide(plan, devices.len(), data.len())?;
    let strategy = build_replicated(decision.kind, devices, model, optim, data, plan.configs)?;
    run(plan, decision, &sampler, strategy, on_step)
}

/// [`fit`] in the precision `optim`'s configuration names: f32 trains `model` as it is; bf16
/// and f16 train it wrapped in [`MixedPrecision`] (f32 master weights, and for f16 the loss
/// scale the spec's optimizers share), through the strategies that keep whole replicas.
/// Returns the model unwrapped.
///
/// # Errors
/// As [`fit`]; the pipeline refuses bf16 and f16
/// ([`PerformanceConfig::check_strategy`](crate::optim::PerformanceConfig::check_strategy)
/// says so before anything starts).
pub fn fit_in_precision<B, M, S, I>(
    plan: &FitPlan<'_>,
    devices: Vec<B::Device>,
    model: M,
    optim: &PerformanceSpec<S>,
    data: DataSource<B, I, M::Input>,
    on_step: &mut dyn FnMut(usize, &StepOutput),
) -> Result<(M, FitRecord), StrategyError>
where
    B: AutodiffBackend,
    M: PipelineModel<B> + LowPrecisionStep<B> + ModuleDisplay,
    <M as AutodiffModule<B>>::InnerModule: ModuleDisplay,
    <M as TrainStep>::Output: OutputLoss<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    let precision = optim.config().precision;
    if precision == Precision::F32 {
        return fit(plan, devices, model, optim, data, on_step);
    }
    let mut wrapped = MixedPrecision::new(model, precision);
    if let Some(scale) = optim.loss_scale() {
        wrapped = wrapped.with_loss_scale(scale.clone());
    }
    let (trained, record) = fit_replicated(plan, devices, wrapped, optim, data, on_step)?;
    Ok((trained.model, record))
}

/// The strategy `plan` resolves to on `ranks` ranks (logged with why), and its sampler over
/// `samples` samples.
fn decide(
    plan: &FitPlan<'_>,
    ranks: usize,
    samples: usize,
) -> Result<(AutoDecision, EpochSampler), StrategyError> {
    let decision = plan.strategy.resolve(ranks);
    tracing::info!(strategy = %decision.kind, "strategy {}: {}", decision.kind, decision.reason);
    let sampler = EpochSampler::new(samples, plan.batch, plan.seed)?;
    Ok((decision, sampler))
}

/// The loop itself, over a built strategy.
fn run<B: AutodiffBackend, M: TrainModel<B>>(
    plan: &FitPlan<'_>,
    decision: AutoDecision,
    sampler: &EpochSampler,
    mut strategy: Box<dyn Strategy<B, M>>,
    on_step: &mut dyn FnMut(usize, &StepOutput),
) -> Result<(M, FitRecord), StrategyError> {
    let first = plan.resume.map_or(0, |r| r.step);
    if let Some(resume) = plan.resume {
        strategy.load_optimizer_state(&resume.optimizer)?;
        tracing::info!("resuming at step {first} of {}", plan.steps);
    }
    let mut losses = Vec::with_capacity(plan.steps.saturating_sub(first));
    let mut skipped_steps = 0;
    let start = Instant::now();
    let batches = sampler.batches().take(plan.steps).enumerate().skip(first);
    for (step, batch) in batches {
        let out = strategy.step(&batch, (plan.lr)(step))?;
        losses.push(out.loss);
        skipped_steps += usize::from(out.guard.is_some_and(|g| g.skipped));
        on_step(step + 1, &out);
    }
    let wall_s = start.elapsed().as_secs_f64();
    let record = FitRecord {
        decision,
        world: strategy.world_size(),
        losses,
        skipped_steps,
        wall_s,
        ranks: strategy.stats().into_iter().map(Into::into).collect(),
        optimizer: if plan.keep_optimizer_state {
            Some(strategy.optimizer_state()?)
        } else {
            None
        },
    };
    Ok((strategy.model()?, record))
}
