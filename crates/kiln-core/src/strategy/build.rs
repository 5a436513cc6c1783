//! Building any strategy from a resolved [`Plan`], for any model: the one entry programs use
//! to choose a strategy with a flag or a config field.

use burn::tensor::backend::AutodiffBackend;

use super::capability::StrategyModel;
use super::launch::{Launch, check_processes, world_on};
use super::pipeline::PipelineSupport;
use super::tensor::TensorSupport;
use super::{
    ConfigError, DataParallel, Ddp, OptimizerSpec, Single, Strategy, StrategyError, StrategyKind,
};
use crate::data::DataSource;
use crate::plan::Plan;
use crate::tensor_parallel::TpBackend;

/// Builds the strategy `plan` names over `devices` (one per rank of the plan) for `model`,
/// with an optimizer from `optim` for whatever module each rank steps. A strategy the model
/// cannot run (`pipeline` without the stage contract, `tensor` without the sharding
/// contract) is refused in one line, from the model's
/// [`ParallelModel`](crate::model::ParallelModel) declaration.
///
/// # Errors
/// [`ConfigError::NoDevices`] when `devices` do not match the plan's ranks, and what the
/// chosen strategy's constructor reports.
pub fn build<B, M, S, I>(
    plan: &Plan,
    devices: Vec<B::Device>,
    model: M,
    optim: &S,
    data: DataSource<B, I, M::Input>,
) -> Result<Box<dyn Strategy<B, M>>, StrategyError>
where
    B: AutodiffBackend + TpBackend,
    M: StrategyModel<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    if devices.len() != plan.local_ranks() {
        return Err(ConfigError::DevicesNotPlan {
            devices: devices.len(),
            plan: plan.to_string(),
        }
        .into());
    }
    check_processes(&world_on(devices.clone(), plan)?, plan.strategy())?;
    let configs = plan.configs();
    Ok(match plan.strategy() {
        StrategyKind::Single => {
            let device = devices.into_iter().next().ok_or(ConfigError::NoDevices)?;
            let single = configs.single.clone();
            Box::new(Single::new(model, optim.init::<M>(), data, device, single)?)
        }
        StrategyKind::DataParallel => Box::new(DataParallel::new(
            model,
            optim.init::<M>(),
            data,
            devices,
            configs.data_parallel.clone(),
        )?),
        StrategyKind::Ddp | StrategyKind::Auto => {
            let world = world_on(devices, plan)?;
            let ddp = configs.ddp.clone();
            Box::new(Ddp::new(&world, model, optim.init::<M>(), data, ddp)?)
        }
        StrategyKind::Pipeline => {
            let world = world_on(devices, plan)?;
            let config = configs.pipeline.clone();
            let launch = Launch::whole(&world, model, config.timeout())?;
            <M::Pipeline as PipelineSupport<B, M>>::launch(
                launch,
                optim,
                data,
                config,
                "kiln-pipeline",
            )?
        }
        StrategyKind::Tensor => {
            <M::Tensor as TensorSupport<B, M>>::tensor(plan, devices, model, optim, data)?
        }
    })
}
