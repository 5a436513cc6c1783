//! Building any strategy by name, so programs choose one with a flag or a config field.

use burn::tensor::backend::AutodiffBackend;

use super::{
    ConfigError, DataParallel, DataParallelConfig, Ddp, DdpConfig, OptimizerSpec, Pipeline,
    PipelineConfig, Single, SingleConfig, Strategy, StrategyError, StrategyKind, TrainModel,
};
use crate::data::DataSource;
use crate::stages::PipelineModel;
use crate::world::World;

/// The settings of every strategy, so one config file serves whichever is chosen.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StrategyConfigs {
    /// Settings of [`Single`].
    pub single: SingleConfig,
    /// Settings of [`DataParallel`].
    pub data_parallel: DataParallelConfig,
    /// Settings of [`Ddp`].
    pub ddp: DdpConfig,
    /// Settings of [`Pipeline`].
    pub pipeline: PipelineConfig,
}

impl StrategyConfigs {
    /// Sets the gradient accumulation of every strategy.
    pub fn set_grad_accumulation(&mut self, micro_batches: usize) {
        self.single.grad_accumulation = micro_batches;
        self.data_parallel.grad_accumulation = micro_batches;
        self.ddp.grad_accumulation = micro_batches;
        self.pipeline.grad_accumulation = micro_batches;
    }

    /// Sets the intra-op threads per rank of every strategy.
    pub fn set_threads_per_rank(&mut self, threads: usize) {
        self.single.threads_per_rank = Some(threads);
        self.data_parallel.threads_per_rank = Some(threads);
        self.ddp.threads_per_rank = Some(threads);
        self.pipeline.threads_per_rank = Some(threads);
    }

    /// Whether `kind` can run on `world` ranks with these settings: `single` on exactly one,
    /// `pipeline` on a multiple of its stages. The one place this rule lives; the configs of
    /// `kiln train` and `kiln ad train` ask it before anything starts.
    ///
    /// # Errors
    /// [`ConfigError::NoDevices`] for no ranks, [`ConfigError::ZeroStages`],
    /// [`ConfigError::SingleWithMany`] or [`ConfigError::PipelineMesh`].
    pub fn check_world(&self, kind: StrategyKind, world: usize) -> Result<(), ConfigError> {
        if world == 0 {
            return Err(ConfigError::NoDevices);
        }
        match kind.resolve(world).kind {
            StrategyKind::Pipeline if self.pipeline.stages == 0 => Err(ConfigError::ZeroStages),
            StrategyKind::Single if world != 1 => Err(ConfigError::SingleWithMany { ranks: world }),
            StrategyKind::Pipeline if !world.is_multiple_of(self.pipeline.stages) => {
                Err(ConfigError::PipelineMesh {
                    mesh: crate::world::Mesh::flat(world).to_string(),
                    stages: self.pipeline.stages,
                    world_size: world,
                })
            }
            _ => Ok(()),
        }
    }

    /// The gradient accumulation `kind` runs with.
    pub fn grad_accumulation(&self, kind: StrategyKind) -> usize {
        match kind {
            StrategyKind::Single => self.single.grad_accumulation,
            StrategyKind::DataParallel => self.data_parallel.grad_accumulation,
            StrategyKind::Ddp | StrategyKind::Auto => self.ddp.grad_accumulation,
            StrategyKind::Pipeline => self.pipeline.grad_accumulation,
        }
    }
}

/// Builds the strategy `kind` over `devices` (one rank each; `Auto` resolves from their
/// number) for a model that splits into pipeline stages: every strategy, `pipeline` included.
/// The optimizer is given by its configuration, which makes one for the whole model or for
/// each stage.
///
/// # Errors
/// What the chosen strategy's constructor reports, e.g. no devices, `Single` given several,
/// more stages than the model has blocks.
pub fn build<B, M, S, I>(
    kind: StrategyKind,
    devices: Vec<B::Device>,
    model: M,
    optim: &S,
    data: DataSource<B, I, M::Input>,
    configs: &StrategyConfigs,
) -> Result<Box<dyn Strategy<B, M>>, StrategyError>
where
    B: AutodiffBackend,
    M: PipelineModel<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    if kind.resolve(devices.len()).kind != StrategyKind::Pipeline {
        return build_replicated(kind, devices, model, optim, data, configs);
    }
    let world = World::local(devices).map_err(|_| ConfigError::NoDevices)?;
    Ok(Box::new(Pipeline::new(
        &world,
        model,
        optim.init::<M::Stage>(),
        data,
        configs.pipeline.clone(),
    )?))
}

/// [`build`] for any model: the strategies that keep whole replicas (`single`,
/// `data_parallel`, `ddp`, `auto`). `pipeline` needs the stage contract and is refused here.
///
/// # Errors
/// [`ConfigError::NoStageContract`] for `pipeline`, and what the chosen strategy's
/// constructor reports.
pub fn build_replicated<B, M, S, I>(
    kind: StrategyKind,
    devices: Vec<B::Device>,
    model: M,
    optim: &S,
    data: DataSource<B, I, M::Input>,
    configs: &StrategyConfigs,
) -> Result<Box<dyn Strategy<B, M>>, StrategyError>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    let optim = optim.init::<M>();
    Ok(match kind.resolve(devices.len()).kind {
        StrategyKind::Single => {
            configs.check_world(StrategyKind::Single, devices.len())?;
            let device = devices.into_iter().next().ok_or(ConfigError::NoDevices)?;
            Box::new(Single::new(
                model,
                optim,
                data,
                device,
                configs.single.clone(),
            )?)
        }
        StrategyKind::DataParallel => Box::new(DataParallel::new(
            model,
            optim,
            data,
            devices,
            configs.data_parallel.clone(),
        )?),
        StrategyKind::Pipeline => return Err(ConfigError::NoStageContract.into()),
        // `resolve` never returns `Auto`; it shares Ddp's arm rather than a panic.
        StrategyKind::Ddp | StrategyKind::Auto => {
            let world = World::local(devices).map_err(|_| ConfigError::NoDevices)?;
            Box::new(Ddp::new(&world, model, optim, data, configs.ddp.clone())?)
        }
    })
}
