//! An optimizer for whatever module a strategy trains: the whole model, or one of its
//! pipeline stages.
//!
//! Burn's optimizers are typed by the module they step (`Optimizer<M, B>`), so a strategy that
//! trains stages (`M::Stage`) cannot use an optimizer made for the whole model `M`. Strategies
//! built by name therefore take the optimizer's *configuration* and make the optimizer for the
//! module they hold, as `AdamWConfig::init` does for any module.

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig};
use burn::tensor::backend::AutodiffBackend;
use kiln_kernels::{FusedAdamW, FusedAdamWConfig, KernelBackend, LowCopies};

use crate::optim::{
    GuardConfigError, GuardedOptimizer, LossScale, PerformanceConfig, PerformanceOptimizer,
    Precision,
};

/// An optimizer configuration that makes an optimizer for any module.
pub trait OptimizerSpec<B: AutodiffBackend> {
    /// The optimizer it makes for module `M`.
    type Optimizer<M: AutodiffModule<B> + 'static>: GuardedOptimizer<M, B> + 'static;

    /// A fresh optimizer (no state) for module `M`.
    fn init<M: AutodiffModule<B> + 'static>(&self) -> Self::Optimizer<M>;

    /// The compute precision the optimizers expect the model in ([`crate::fit::fit`] wraps
    /// the model for bf16 and f16).
    fn precision(&self) -> Precision {
        Precision::F32
    }

    /// The dynamic loss scale the optimizers share with the model, under f16.
    fn loss_scale(&self) -> Option<&LossScale> {
        None
    }

    /// Whether the optimizers (and their guards) read bf16 or f16 gradients of f32 parameters
    /// as they come, so that mixed precision may skip its pass casting them to f32 where no
    /// collective or accumulation reads them first. The fused AdamW and its gradient norm
    /// widen each value to f32 in their own kernels, which is exact: the same steps either way.
    fn reads_low_precision_grads(&self) -> bool {
        false
    }

    /// The compute-dtype copies the optimizers leave for mixed precision as they step (see
    /// [`LowCopies`]), off until `fit` turns them on for a run of one rank.
    fn low_copies(&self) -> Option<&LowCopies> {
        None
    }
}

/// Strategies built by name make the fused AdamW for whatever module they train (the whole
/// model, or each pipeline stage).
impl<B> OptimizerSpec<B> for FusedAdamWConfig
where
    B: AutodiffBackend<InnerBackend: KernelBackend>,
{
    type Optimizer<M: AutodiffModule<B> + 'static> = FusedAdamW<M, B>;

    fn init<M: AutodiffModule<B> + 'static>(&self) -> FusedAdamW<M, B> {
        FusedAdamWConfig::init(self)
    }

    fn reads_low_precision_grads(&self) -> bool {
        true
    }
}

impl<B: AutodiffBackend> OptimizerSpec<B> for AdamWConfig {
    type Optimizer<M: AutodiffModule<B> + 'static> = OptimizerAdaptor<AdamW, M, B>;

    fn init<M: AutodiffModule<B> + 'static>(&self) -> OptimizerAdaptor<AdamW, M, B> {
        AdamWConfig::init(self)
    }
}

/// An [`OptimizerSpec`] composed with the guards of a [`PerformanceConfig`]: it makes a
/// [`PerformanceOptimizer`] around the inner spec's optimizer, for whatever module a strategy
/// holds.
#[derive(Debug, Clone)]
pub struct PerformanceSpec<S> {
    inner: S,
    config: PerformanceConfig,
    loss_scale: Option<LossScale>,
    low_copies: Option<LowCopies>,
}

impl<S> PerformanceSpec<S> {
    /// Composes `inner` with `config`.
    ///
    /// # Errors
    /// [`GuardConfigError`] for a configuration that cannot work.
    pub fn new(inner: S, config: PerformanceConfig) -> Result<Self, GuardConfigError> {
        config.validate()?;
        // f16 needs a loss scale; the optimizers this spec makes and the model share it.
        let loss_scale = match config.precision {
            Precision::F16 => Some(LossScale::new(config.loss_scale)?),
            Precision::F32 | Precision::Bf16 => None,
        };
        // bf16 and f16 train from a compute-dtype copy of the f32 parameters, which the fused
        // AdamW can write as it steps.
        let low_copies = match config.precision {
            Precision::F32 => None,
            low => Some(LowCopies::new(low.dtype())),
        };
        Ok(Self {
            inner,
            config,
            loss_scale,
            low_copies,
        })
    }

    /// The configuration applied.
    pub fn config(&self) -> &PerformanceConfig {
        &self.config
    }

    /// The loss scale of `precision = "f16"`: give it to the
    /// [`MixedPrecision`](crate::optim::MixedPrecision) model too.
    pub fn loss_scale(&self) -> Option<&LossScale> {
        self.loss_scale.as_ref()
    }
}

impl<B: AutodiffBackend, S: OptimizerSpec<B>> OptimizerSpec<B> for PerformanceSpec<S> {
    type Optimizer<M: AutodiffModule<B> + 'static> = PerformanceOptimizer<S::Optimizer<M>>;

    fn init<M: AutodiffModule<B> + 'static>(&self) -> Self::Optimizer<M> {
        let optim = PerformanceOptimizer::new(self.inner.init::<M>(), self.config.clone())
            .expect("validated when the spec was made");
        let mut optim = match &self.loss_scale {
            Some(scale) => optim.with_loss_scale(scale.clone()),
            None => optim,
        };
        if let Some(copies) = &self.low_copies {
            optim.share_low_copies(copies.clone());
        }
        optim
    }

    fn precision(&self) -> Precision {
        self.config.precision
    }

    fn loss_scale(&self) -> Option<&LossScale> {
        self.loss_scale.as_ref()
    }

    fn reads_low_precision_grads(&self) -> bool {
        self.inner.reads_low_precision_grads()
    }

    fn low_copies(&self) -> Option<&LowCopies> {
        self.low_copies.as_ref()
    }
}
