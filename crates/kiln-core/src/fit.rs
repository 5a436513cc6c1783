//! The training loop programs share: build the strategy the plan names, step it over
//! epoch-shuffled global batches, and say what happened.
//!
//! `kiln train`, the Algorithm Distillation job and the strategy benchmark all train through
//! [`fit`]; what they print and save around it is theirs.

use std::marker::PhantomData;
use std::time::Instant;

use burn::module::{AutodiffModule, ModuleDisplay};
use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

use crate::data::{DataSource, EpochSampler};
use crate::model::{
    LowPrecisionStep, ParallelModel, PrecisionSupport, Supported, TrainModel, Unsupported,
};
use crate::optim::{MixedPrecision, OptimizerState, Precision};
use crate::plan::Plan;
use crate::strategy::{ConfigError, OptimizerSpec, RankReport, StepOutput, StrategyError, build};
use crate::tensor_parallel::TpBackend;

/// How long and how to train: everything of a run but its [`Plan`].
pub struct Training<'a> {
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
    /// The plan that ran.
    pub plan: Plan,
    /// The loss of every step this run trained (from the resumed step on).
    pub losses: Vec<f64>,
    /// Steps the NaN guard skipped (`nan_policy = "skip"`).
    pub skipped_steps: usize,
    /// The optimizer state at the end, to checkpoint next to the model, when asked for
    /// ([`Training::keep_optimizer_state`]).
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

/// Trains `model` on `data` as `plan` says, over `devices` (one per rank of the plan), in the
/// precision `optim`'s configuration names (bf16 and f16 wrap the model in
/// [`MixedPrecision`]), calling `on_step(step, output)` after every step (1-based); returns
/// the trained whole model.
///
/// # Errors
/// A plan the model cannot run (refused from its [`ParallelModel`] declaration), a global
/// batch the data cannot fill, or what the strategy reports.
pub fn fit<B, M, S, I>(
    plan: &Plan,
    training: &Training<'_>,
    devices: Vec<B::Device>,
    model: M,
    optim: &S,
    data: DataSource<B, I, M::Input>,
    on_step: &mut dyn FnMut(usize, &StepOutput),
) -> Result<(M, FitRecord), StrategyError>
where
    B: AutodiffBackend + TpBackend,
    M: ParallelModel<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    tracing::info!(strategy = %plan.strategy(), "plan: {plan}");
    let run = Run {
        plan,
        training,
        optim,
        on_step,
        backend: PhantomData,
    };
    match optim.precision() {
        Precision::F32 => fit_as_is(run, devices, model, data),
        _ => <M::LowPrecision as PrecisionSupport<B, M>>::fit_low(run, devices, model, data),
    }
}

/// A run's plan, schedule, optimizer and step callback, as [`fit`] hands them on.
pub(crate) struct Run<'a, 'b, B, S> {
    plan: &'a Plan,
    training: &'a Training<'a>,
    optim: &'a S,
    on_step: &'b mut dyn FnMut(usize, &StepOutput),
    backend: PhantomData<B>,
}

/// [`fit`] of `model` as it is, in f32.
fn fit_as_is<B, M, S, I>(
    run: Run<'_, '_, B, S>,
    devices: Vec<B::Device>,
    model: M,
    data: DataSource<B, I, M::Input>,
) -> Result<(M, FitRecord), StrategyError>
where
    B: AutodiffBackend + TpBackend,
    M: ParallelModel<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    let Run {
        plan,
        training,
        optim,
        on_step,
        ..
    } = run;
    let sampler = EpochSampler::new(data.len(), plan.global_batch(), training.seed)?;
    let mut strategy = build(plan, devices, model, optim, data)?;
    let first = training.resume.map_or(0, |r| r.step);
    if let Some(resume) = training.resume {
        strategy.load_optimizer_state(&resume.optimizer)?;
        tracing::info!("resuming at step {first} of {}", training.steps);
    }
    let mut losses = Vec::with_capacity(training.steps.saturating_sub(first));
    let mut skipped_steps = 0;
    let start = Instant::now();
    let batches = sampler
        .batches()
        .take(training.steps)
        .enumerate()
        .skip(first);
    for (step, batch) in batches {
        let out = strategy.step(&batch, (training.lr)(step))?;
        losses.push(out.loss);
        skipped_steps += usize::from(out.guard.is_some_and(|g| g.skipped));
        on_step(step + 1, &out);
    }
    let wall_s = start.elapsed().as_secs_f64();
    let record = FitRecord {
        plan: plan.clone(),
        losses,
        skipped_steps,
        wall_s,
        ranks: strategy.stats().into_iter().map(Into::into).collect(),
        optimizer: if training.keep_optimizer_state {
            Some(strategy.optimizer_state()?)
        } else {
            None
        },
    };
    Ok((strategy.model()?, record))
}

#[allow(private_interfaces)]
impl<B, M> PrecisionSupport<B, M> for Supported
where
    B: AutodiffBackend + TpBackend,
    M: TrainModel<B> + LowPrecisionStep<B> + ModuleDisplay,
    <M as AutodiffModule<B>>::InnerModule: ModuleDisplay,
    MixedPrecision<B, M>: ParallelModel<B> + TrainStep<Input = M::Input, Output = M::Output>,
{
    fn fit_low<S: OptimizerSpec<B>, I: Send + 'static>(
        run: Run<'_, '_, B, S>,
        devices: Vec<B::Device>,
        model: M,
        data: DataSource<B, I, M::Input>,
    ) -> Result<(M, FitRecord), StrategyError> {
        let mut wrapped = MixedPrecision::new(model, run.optim.precision());
        if let Some(scale) = run.optim.loss_scale() {
            wrapped = wrapped.with_loss_scale(scale.clone());
        }
        let (trained, record) = fit_as_is(run, devices, wrapped, data)?;
        Ok((trained.model, record))
    }
}

#[allow(private_interfaces)]
impl<B, M> PrecisionSupport<B, M> for Unsupported
where
    B: AutodiffBackend + TpBackend,
    M: TrainModel<B>,
{
    fn fit_low<S: OptimizerSpec<B>, I: Send + 'static>(
        run: Run<'_, '_, B, S>,
        _: Vec<B::Device>,
        _: M,
        _: DataSource<B, I, M::Input>,
    ) -> Result<(M, FitRecord), StrategyError> {
        Err(ConfigError::Unsupported {
            strategy: format!("precision {}", run.optim.precision()),
            contract: "LowPrecisionStep",
            capability: "LowPrecision",
        }
        .into())
    }
}
