//! Which parallel contracts a model has, declared once per model type, so that one builder
//! takes any model and refuses in one line what it cannot run.
//!
//! Rust fixes a model's capabilities by its type, while a run chooses its strategy by name.
//! [`ParallelModel`] bridges the two: each capability is an associated type, [`Supported`]
//! (which the compiler accepts only if the model implements the contract) or
//! [`Unsupported`].
//!
//! ```ignore
//! impl<B: AutodiffBackend + TpBackend> ParallelModel<B> for MyModel<B> {
//!     type Pipeline = Supported;      // MyModel implements PipelineModel
//!     type Tensor = Unsupported;      // it does not shard its layers
//!     type LowPrecision = Supported;  // it implements LowPrecisionStep
//! }
//! ```
//!
//! This layer only checks a declaration against the contracts. What each capability *does* is
//! defined where it is used, above: the strategies launch a pipeline or shard a model
//! ([`crate::strategy::StrategyModel`]), and the loop trains in bf16 or f16
//! ([`crate::fit::FitModel`]). Both are implemented for every model whose declaration holds,
//! so a model implements `ParallelModel` and nothing else.

use burn::tensor::backend::AutodiffBackend;

use super::{LowPrecisionStep, PipelineModel, TensorParallelModel, TrainModel};
use crate::tensor_parallel::TpBackend;

/// A capability the model has: the compiler checks that it implements the contract.
#[derive(Debug, Clone, Copy)]
pub struct Supported;

/// A capability the model does not have: a plan that needs it is refused in one line.
#[derive(Debug, Clone, Copy)]
pub struct Unsupported;

mod sealed {
    /// Only [`Supported`](super::Supported) and [`Unsupported`](super::Unsupported) are
    /// capabilities.
    pub trait Sealed {}
    impl Sealed for super::Supported {}
    impl Sealed for super::Unsupported {}
}

/// The parallel contracts a model has. See the [module docs](self).
pub trait ParallelModel<B: AutodiffBackend + TpBackend>: TrainModel<B> {
    /// [`Supported`] when the model implements [`PipelineModel`]: `pipeline`, and stages
    /// under `tensor`.
    type Pipeline: PipelineCapability<B, Self>;
    /// [`Supported`] when it implements [`TensorParallelModel`]: `tensor`.
    type Tensor: TensorCapability<B, Self>;
    /// [`Supported`] when it implements [`LowPrecisionStep`]: `precision = "bf16"` and
    /// `"f16"`.
    type LowPrecision: PrecisionCapability<B, Self>;
}

/// [`ParallelModel::Pipeline`]: [`Supported`] only for a [`PipelineModel`].
pub trait PipelineCapability<B: AutodiffBackend + TpBackend, M: TrainModel<B>>:
    sealed::Sealed
{
}

impl<B: AutodiffBackend + TpBackend, M: PipelineModel<B>> PipelineCapability<B, M> for Supported {}
impl<B: AutodiffBackend + TpBackend, M: TrainModel<B>> PipelineCapability<B, M> for Unsupported {}

/// [`ParallelModel::Tensor`]: [`Supported`] only for a [`TensorParallelModel`] whose shards
/// declare their own capabilities.
pub trait TensorCapability<B: AutodiffBackend + TpBackend, M: TrainModel<B>>:
    sealed::Sealed
{
}

impl<B, M> TensorCapability<B, M> for Supported
where
    B: AutodiffBackend + TpBackend,
    M: TensorParallelModel<B, Sharded: ParallelModel<B>>,
{
}
impl<B: AutodiffBackend + TpBackend, M: TrainModel<B>> TensorCapability<B, M> for Unsupported {}

/// [`ParallelModel::LowPrecision`]: [`Supported`] only for a [`LowPrecisionStep`] model.
pub trait PrecisionCapability<B: AutodiffBackend + TpBackend, M: TrainModel<B>>:
    sealed::Sealed
{
}

impl<B: AutodiffBackend + TpBackend, M: TrainModel<B> + LowPrecisionStep<B>>
    PrecisionCapability<B, M> for Supported
{
}
impl<B: AutodiffBackend + TpBackend, M: TrainModel<B>> PrecisionCapability<B, M> for Unsupported {}
