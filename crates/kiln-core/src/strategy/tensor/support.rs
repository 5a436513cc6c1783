//! [`TensorSupport`]: what `Tensor = Supported` launches, and how `Unsupported` refuses.

use burn::tensor::backend::AutodiffBackend;

use super::Tensor;
use crate::data::DataSource;
use crate::model::{ParallelModel, Supported, TensorParallelModel, TrainModel, Unsupported};
use crate::plan::Plan;
use crate::strategy::launch::world_on;
use crate::strategy::pipeline::PipelineSupport;
use crate::strategy::{ConfigError, OptimizerSpec, Strategy, StrategyError};
use crate::tensor_parallel::TpBackend;

/// How a capability builds tensor parallelism (see [`ParallelModel::Tensor`]). Only Kiln
/// calls it.
pub trait TensorSupport<B: AutodiffBackend + TpBackend, M: TrainModel<B>> {
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

impl<B, M> TensorSupport<B, M> for Supported
where
    B: AutodiffBackend + TpBackend,
    M: TensorParallelModel<B>,
    M::Sharded: ParallelModel<B, Pipeline: PipelineSupport<B, M::Sharded>>,
{
    fn tensor<S: OptimizerSpec<B>, I: Send + 'static>(
        plan: &Plan,
        devices: Vec<B::Device>,
        model: M,
        optim: &S,
        data: DataSource<B, I, M::Input>,
    ) -> Result<Box<dyn Strategy<B, M>>, StrategyError> {
        let world = world_on(devices, plan)?;
        let configs = plan.configs();
        Ok(Box::new(Tensor::new(
            &world,
            model,
            optim,
            data,
            configs.tensor.clone(),
            &configs.pipeline,
        )?))
    }
}

impl<B, M> TensorSupport<B, M> for Unsupported
where
    B: AutodiffBackend + TpBackend,
    M: TrainModel<B>,
{
    fn tensor<S: OptimizerSpec<B>, I: Send + 'static>(
        _: &Plan,
        _: Vec<B::Device>,
        _: M,
        _: &S,
        _: DataSource<B, I, M::Input>,
    ) -> Result<Box<dyn Strategy<B, M>>, StrategyError> {
        Err(ConfigError::Unsupported {
            strategy: "tensor".to_string(),
            contract: "TensorParallelModel",
            capability: "Tensor",
        }
        .into())
    }
}
