//! [`PerformanceOptimizer`]: a Burn optimizer composed with Kiln's stability guards.

use std::collections::HashSet;

use burn::module::{AutodiffModule, ParamId};
use burn::optim::LearningRate;
use burn::optim::{GradientsParams, MultiGradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use kiln_kernels::LowCopies;

use super::guard::{Guard, GuardReport};
use super::step::{Findings, StepError, Sync, guarded_step};
use super::{GuardConfigError, GuardedOptimizer, LossScale, NonFinite, PerformanceConfig};

/// A Burn optimizer composed with global-norm clipping and a NaN/Inf guard, applied the same
/// way by every strategy, across ranks and pipeline stages.
///
/// ```
/// # use burn::backend::{Autodiff, Flex};
/// # use burn::nn::Linear;
/// use burn::optim::AdamWConfig;
/// use kiln_core::optim::{NanPolicy, PerformanceConfig, PerformanceOptimizer};
///
/// let config = PerformanceConfig::new()
///     .with_clip_norm(Some(1.0))
///     .with_nan_policy(NanPolicy::Skip);
/// let optim = PerformanceOptimizer::new(
///     AdamWConfig::new().init::<Autodiff<Flex>, Linear<Autodiff<Flex>>>(),
///     config,
/// )
/// .unwrap();
/// // Give `optim` to any strategy: Single::new(model, optim, data, device, ...).
/// ```
///
/// Its [`Optimizer::step`] is the inner optimizer's step: the strategies run the guard before
/// calling it, where every rank's facts are known. A hand-written single-device loop calls
/// [`Self::guarded_step`] instead.
#[derive(Clone)]
pub struct PerformanceOptimizer<O> {
    inner: O,
    guard: Guard,
}

impl<O> PerformanceOptimizer<O> {
    /// Composes `inner` with the guards of `config`.
    ///
    /// # Errors
    /// [`GuardConfigError`] for a configuration that cannot work.
    pub fn new(inner: O, config: PerformanceConfig) -> Result<Self, GuardConfigError> {
        config.validate()?;
        Ok(Self {
            inner,
            guard: Guard::new(config),
        })
    }

    /// This optimizer, unscaling the gradients by `scale` and adjusting it: give the same
    /// `scale` to the [`MixedPrecision`](super::MixedPrecision) model, which scales the loss.
    /// An overflow then skips the step on every rank and halves the scale, whatever the NaN
    /// policy, since overflows are how the scale finds its level.
    pub fn with_loss_scale(self, scale: LossScale) -> Self {
        Self {
            guard: self.guard.with_loss_scale(scale),
            ..self
        }
    }

    /// The configuration applied.
    pub fn config(&self) -> &PerformanceConfig {
        self.guard.config()
    }

    /// The wrapped optimizer.
    pub fn inner(&self) -> &O {
        &self.inner
    }

    /// One guarded step on one device, for hand-written loops: inspects `grads` (and whether
    /// the loss was finite), then skips, halts or clips exactly as a one-rank strategy does,
    /// and steps. `step` numbers the report.
    ///
    /// # Errors
    /// [`NonFinite`] under [`NanPolicy::Halt`](super::NanPolicy::Halt); the module is then
    /// lost to the caller, as after a failed strategy step.
    pub fn guarded_step<M, B>(
        &mut self,
        lr: LearningRate,
        module: M,
        grads: GradientsParams,
        loss_finite: bool,
        step: u64,
    ) -> Result<(M, GuardReport), NonFinite>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: GuardedOptimizer<M, B>,
    {
        // The device only matters for collectives, which one device has none of.
        let device = module.devices().into_iter().next().unwrap_or_default();
        let sync = Sync {
            dp: None,
            split: None,
            owners: None,
            device: &device,
        };
        let findings = Findings::Inspect { loss_finite };
        match guarded_step(self, module, grads, findings, sync, lr, step) {
            Ok(stepped) => Ok((
                stepped.model,
                stepped.guard.expect("a PerformanceOptimizer has a guard"),
            )),
            Err(StepError::NonFinite(report)) => Err(report),
            Err(other) => unreachable!("one device runs no collective: {other}"),
        }
    }
}

impl<O, M, B> Optimizer<M, B> for PerformanceOptimizer<O>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    /// The inner optimizer's record, and the loss scale's state when there is one.
    type Record = (O::Record, Option<(f64, u64, u64)>);

    fn step(&mut self, lr: LearningRate, module: M, grads: GradientsParams) -> M {
        self.inner.step(lr, module, grads)
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        self.inner.step_multi(lr, module, grads)
    }

    fn to_record(&self) -> Self::Record {
        let scale = self.guard.loss_scale().map(LossScale::to_record);
        (self.inner.to_record(), scale)
    }

    fn load_record(self, (inner, scale): Self::Record) -> Self {
        if let (Some(loss_scale), Some(state)) = (self.guard.loss_scale(), scale) {
            loss_scale.load_record(state);
        }
        Self {
            inner: self.inner.load_record(inner),
            guard: self.guard,
        }
    }
}

impl<O, M, B> GuardedOptimizer<M, B> for PerformanceOptimizer<O>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: GuardedOptimizer<M, B>,
{
    fn guard(&self) -> Option<&Guard> {
        Some(&self.guard)
    }

    fn squares(&self, module: &M, grads: &GradientsParams, skip: Option<&HashSet<ParamId>>) -> f64 {
        self.inner.squares(module, grads, skip)
    }

    fn step_scaled(
        &mut self,
        lr: LearningRate,
        module: M,
        grads: GradientsParams,
        factor: f64,
    ) -> M {
        self.inner.step_scaled(lr, module, grads, factor)
    }

    fn share_low_copies(&mut self, copies: LowCopies) {
        self.inner.share_low_copies(copies);
    }

    // The guard's state (the loss scale) is the same on every replica: it stays as it is.
    fn retain_state(self, keep: &HashSet<ParamId>) -> Option<Self> {
        Some(Self {
            inner: self.inner.retain_state(keep)?,
            guard: self.guard,
        })
    }

    fn merge_state(self, other: Self) -> Option<Self> {
        Some(Self {
            inner: self.inner.merge_state(other.inner)?,
            guard: self.guard,
        })
    }
}
