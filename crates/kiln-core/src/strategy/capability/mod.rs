//! What each capability a model declares ([`ParallelModel`]) does when a plan asks for it:
//! `Supported` launches the strategy, `Unsupported` refuses it in one line. One file per
//! capability: the tensor strategy launches its stages through the pipeline's, so the
//! pipeline's sits below the tensor strategy and the tensor's above it.
//!
//! [`StrategyModel`] is every model whose declaration [`build`](super::build) can act on. It
//! is implemented for every [`ParallelModel`] whose capabilities hold, so a model implements
//! `ParallelModel` and nothing here; programs generic over models bound them by
//! `StrategyModel` (or `crate::fit::FitModel`) to build and train them.

mod pipeline;
mod tensor;

use burn::tensor::backend::AutodiffBackend;

pub use pipeline::PipelineSupport;
pub use tensor::TensorSupport;

use crate::model::ParallelModel;
use crate::tensor_parallel::TpBackend;

/// A model whose every declared capability [`build`](super::build) can launch: any
/// [`ParallelModel`] whose declaration holds (implemented for all of them).
pub trait StrategyModel<B: AutodiffBackend + TpBackend>:
    ParallelModel<B, Pipeline: PipelineSupport<B, Self>, Tensor: TensorSupport<B, Self>>
{
}

impl<B, M> StrategyModel<B> for M
where
    B: AutodiffBackend + TpBackend,
    M: ParallelModel<B, Pipeline: PipelineSupport<B, M>, Tensor: TensorSupport<B, M>>,
{
}
