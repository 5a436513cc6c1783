//! [`PipelineSupport`]: what `Pipeline = Supported` launches, and how `Unsupported` refuses.

use burn::tensor::backend::AutodiffBackend;

use super::Pipeline;
use crate::data::DataSource;
use crate::model::{PipelineModel, Supported, TrainModel, Unsupported};
use crate::strategy::launch::Launch;
use crate::strategy::{ConfigError, Engine, OptimizerSpec, PipelineConfig, StrategyError};
use crate::tensor_parallel::TpBackend;

/// How a capability builds a pipeline (see
/// [`ParallelModel::Pipeline`](crate::model::ParallelModel::Pipeline)). Only Kiln calls it.
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
