//! Every model whose declared capabilities ([`ParallelModel`]) the strategies can act on.
//! What each capability does when a plan asks for it lives with its strategy:
//! [`PipelineSupport`] in `pipeline/support.rs`, [`TensorSupport`] in `tensor/support.rs`
//! (`Supported` launches the strategy, `Unsupported` refuses it in one line).
//!
//! [`StrategyModel`] is every model whose declaration [`build`](super::build) can act on. It
//! is implemented for every [`ParallelModel`] whose capabilities hold, so a model implements
//! `ParallelModel` and nothing here; programs generic over models bound them by
//! `StrategyModel` (or `crate::fit::FitModel`) to build and train them.

use burn::tensor::backend::AutodiffBackend;

use super::pipeline::PipelineSupport;
use super::tensor::TensorSupport;
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
