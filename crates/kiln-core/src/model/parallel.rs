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

use burn::tensor::backend::AutodiffBackend;

use super::TrainModel;
use crate::data::DataSource;
use crate::fit::{FitError, FitRecord, Run};
use crate::plan::Plan;
use crate::strategy::launch::Launch;
use crate::strategy::{Engine, OptimizerSpec, Strategy, StrategyError};
use crate::tensor_parallel::TpBackend;

/// A capability the model has: the compiler checks that it implements the contract.
#[derive(Debug, Clone, Copy)]
pub struct Supported;

/// A capability the model does not have: a plan that needs it is refused in one line.
#[derive(Debug, Clone, Copy)]
pub struct Unsupported;

pub(crate) mod sealed {
    /// Only [`Supported`](super::Supported) and [`Unsupported`](super::Unsupported) are
    /// capabilities.
    pub trait Sealed {}
    impl Sealed for super::Supported {}
    impl Sealed for super::Unsupported {}
}

/// The parallel contracts a model has. See the [module docs](self).
pub trait ParallelModel<B: AutodiffBackend + TpBackend>: TrainModel<B> {
    /// [`Supported`] when the model implements
    /// [`PipelineModel`](super::PipelineModel): `pipeline`, and stages under `tensor`.
    type Pipeline: PipelineSupport<B, Self>;
    /// [`Supported`] when it implements
    /// [`TensorParallelModel`](super::TensorParallelModel): `tensor`.
    type Tensor: TensorSupport<B, Self>;
    /// [`Supported`] when it implements [`LowPrecisionStep`](super::LowPrecisionStep):
    /// `precision = "bf16"` and `"f16"`.
    type LowPrecision: PrecisionSupport<B, Self>;
}

/// How a capability builds a pipeline (see [`ParallelModel::Pipeline`]). Only Kiln calls it.
#[allow(private_interfaces)]
pub trait PipelineSupport<B: AutodiffBackend + TpBackend, M: TrainModel<B>>:
    sealed::Sealed
{
    /// The pipeline over the ranks of `launch`, each with its stage of its model.
    #[doc(hidden)]
    fn launch<S: OptimizerSpec<B>, I: Send + 'static>(
        launch: Launch<B, M>,
        optim: &S,
        data: DataSource<B, I, M::Input>,
        config: crate::strategy::PipelineConfig,
        name: &str,
    ) -> Result<Box<dyn Engine<B, M>>, StrategyError>;
}

/// How a capability builds tensor parallelism (see [`ParallelModel::Tensor`]). Only Kiln
/// calls it.
pub trait TensorSupport<B: AutodiffBackend + TpBackend, M: TrainModel<B>>: sealed::Sealed {
    /// `tensor` over `devices` as `plan` says.
    #[doc(hidden)]
    fn tensor<S: OptimizerSpec<B>, I: Send + 'static>(
        plan: &Plan,
        devices: Vec<B::Device>,
        model: M,
        optim: &S,
        data: DataSource<B, I, M::Input>,
    ) -> Result<Box<dyn Strategy<B, M>>, StrategyError>;
}

/// How a capability trains in bf16 or f16 (see [`ParallelModel::LowPrecision`]). Only Kiln
/// calls it.
#[allow(private_interfaces)]
pub trait PrecisionSupport<B: AutodiffBackend + TpBackend, M: TrainModel<B>>:
    sealed::Sealed
{
    /// Runs `run` with `model` wrapped in mixed precision; returns it unwrapped.
    #[doc(hidden)]
    fn fit_low<S: OptimizerSpec<B>, I: Send + 'static>(
        run: Run<'_, '_, B, S, M>,
        devices: Vec<B::Device>,
        model: M,
        data: DataSource<B, I, M::Input>,
    ) -> Result<(M, FitRecord), FitError>;
}
