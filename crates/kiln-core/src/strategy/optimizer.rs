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

use crate::optim::{GuardConfigError, GuardedOptimizer, PerformanceConfig, PerformanceOptimizer};

/// An optimizer configuration that makes an optimizer for any module.
pub trait OptimizerSpec<B: AutodiffBackend> {
    /// The optimizer it makes for module `M`.
    type Optimizer<M: AutodiffModule<B> + 'static>: GuardedOptimizer<M, B> + 'static;

    /// A fresh optimizer (no state) for module `M`.
    fn init<M: AutodiffModule<B> + 'static>(&self) -> Self::Optimizer<M>;
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
#[derive(Debug, Clone, PartialEq)]
pub struct PerformanceSpec<S> {
    inner: S,
    config: PerformanceConfig,
}

impl<S> PerformanceSpec<S> {
    /// Composes `inner` with `config`.
    ///
    /// # Errors
    /// [`GuardConfigError`] for a configuration that cannot work.
    pub fn new(inner: S, config: PerformanceConfig) -> Result<Self, GuardConfigError> {
        config.validate()?;
        Ok(Self { inner, config })
    }
}

impl<B: AutodiffBackend, S: OptimizerSpec<B>> OptimizerSpec<B> for PerformanceSpec<S> {
    type Optimizer<M: AutodiffModule<B> + 'static> = PerformanceOptimizer<S::Optimizer<M>>;

    fn init<M: AutodiffModule<B> + 'static>(&self) -> Self::Optimizer<M> {
        PerformanceOptimizer::new(self.inner.init::<M>(), self.config.clone())
            .expect("validated when the spec was made")
    }
}
