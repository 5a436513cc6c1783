//! What a model implements to be trained by Kiln: the contracts, in one place.
//!
//! - [`TrainModel`]: any Burn module with a burn-train `TrainStep` whose output carries its
//!   loss ([`StepLoss`]). Every strategy trains it whole (`single`, `data_parallel`, `ddp`).
//! - [`PipelineModel`]: how it splits into stages of blocks, for `pipeline`.
//! - [`TensorParallelModel`]: how it shards its layers over a tensor-parallel group, for
//!   `tensor`.
//! - [`LowPrecisionStep`]: how it computes its step in bf16 or f16, for mixed precision.
//! - [`ParallelModel`]: which of those it has, so that one builder
//!   ([`crate::strategy::build`]) and one loop ([`crate::fit::fit`]) take any model and refuse,
//!   in one line, a plan the model cannot run. What a capability does lives with them
//!   ([`crate::strategy::StrategyModel`], [`crate::fit::FitModel`]); this layer only checks a
//!   declaration against the contracts.
//!
//! Nothing here depends on Kiln's own models or strategies: implement these for yours.

mod loss;
mod parallel;
mod pipeline;
mod precision;
mod tensor;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

pub use loss::StepLoss;
pub use parallel::{
    ParallelModel, PipelineCapability, PrecisionCapability, Supported, TensorCapability,
    Unsupported,
};
pub use pipeline::{PipelineModel, even_ranges};
pub use precision::{LowPrecisionStep, backward_scaled};
pub use tensor::{ShardError, TensorParallelModel};

/// A model a strategy can train: any Burn [`AutodiffModule`] with a burn-train [`TrainStep`]
/// whose output reports its loss.
///
/// Contract: `TrainStep::step` returns the gradients of the **mean** loss over the samples of
/// its input; strategies rely on it to weight shards and micro-batches exactly.
pub trait TrainModel<B: AutodiffBackend>:
    AutodiffModule<B> + TrainStep<Output: StepLoss<B>> + 'static
{
}

impl<B, M> TrainModel<B> for M
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + TrainStep<Output: StepLoss<B>> + 'static,
{
}
