//! What each capability a model declares ([`ParallelModel`]) does when a plan asks for it:
//! `Supported` launches the strategy, `Unsupported` refuses it in one line.
//!
//! [`StrategyModel`] is every model whose declaration [`build`](super::build) can act on. It
//! is implemented for every [`ParallelModel`] whose capabilities hold, so a model implements
//! `ParallelModel` and nothing here; programs generic over models bound them by
//! `StrategyModel` (or `crate::fit::FitModel`) to build and train them.

use burn::tensor::backend::AutodiffBackend;

use super::launch::{Launch, world_on};
use super::{
    ConfigError, Engine, OptimizerSpec, Pipeline, PipelineConfig, Strategy, StrategyError, Tensor,
};
use crate::data::DataSource;
use crate::model::{
    ParallelModel, PipelineModel, Supported, TensorParallelModel, TrainModel, Unsupported,
};
use crate::plan::Plan;
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

/// How a capability builds a pipeline (see [`ParallelModel::Pipeline`]). Only Kiln calls it.
#[allow(private_interfaces)]
pub trait PipelineSupport<B: AutodiffBackend + TpBackend, M: TrainModel<B>> {
    /// The pipeline over the ranks of `launch`, each with its stage of its model.
    #[doc(hidden)]
    fn launch<S: OptimizerSpec<B>, I: Send + 'static>(
        launch: Launch<B, M>,
        optim: &S,
        data: DataSource<B, I, M::Input>,
        config: PipelineConfig,
        name: &str,
    ) -> Result<Box<dyn Engine<B, M>>, StrategyError>;
}

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

#[allow(private_interfaces)]
impl<B, M> PipelineSupport<B, M> for Supported
where
    B: AutodiffBackend + TpBackend,
    M: PipelineModel<B>,
{
    fn launch<S: OptimizerSpec<B>, I: Send + 'static>(
        launch: Launch<B, M>,
        optim: &S,
        data: DataSource<B, I, M::Input>,
        config: PipelineConfig,
        name: &str,
    ) -> Result<Box<dyn Engine<B, M>>, StrategyError> {
        let optim = optim.init::<M::Stage>();
        Ok(Box::new(Pipeline::launch(
            launch, optim, data, config, name,
        )?))
    }
}

#[allow(private_interfaces)]
impl<B, M> PipelineSupport<B, M> for Unsupported
where
    B: AutodiffBackend + TpBackend,
    M: TrainModel<B>,
{
    fn launch<S: OptimizerSpec<B>, I: Send + 'static>(
        launch: Launch<B, M>,
        _: &S,
        _: DataSource<B, I, M::Input>,
        _: PipelineConfig,
        _: &str,
    ) -> Result<Box<dyn Engine<B, M>>, StrategyError> {
        let strategy = if launch.shards.is_some() {
            "tensor with stages (its shards split into pipeline stages)"
        } else {
            "pipeline"
        };
        Err(ConfigError::Unsupported {
            strategy: strategy.to_string(),
            contract: "PipelineModel",
            capability: "Pipeline",
        }
        .into())
    }
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
