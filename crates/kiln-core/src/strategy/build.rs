//! Building any strategy by name, so programs choose one with a flag or a config field.

use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;

use super::{
    DataParallel, DataParallelConfig, Ddp, DdpConfig, Single, SingleConfig, Strategy,
    StrategyError, StrategyKind, TrainModel,
};
use crate::data::DataSource;
use crate::world::World;

/// The settings of every strategy, so one config file serves whichever is chosen.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StrategyConfigs {
    /// Settings of [`Single`].
    pub single: SingleConfig,
    /// Settings of [`DataParallel`].
    pub dp: DataParallelConfig,
    /// Settings of [`Ddp`].
    pub ddp: DdpConfig,
}

impl StrategyConfigs {
    /// Sets the gradient accumulation of every strategy.
    pub fn set_grad_accumulation(&mut self, micro_batches: usize) {
        self.single.grad_accumulation = micro_batches;
        self.dp.grad_accumulation = micro_batches;
        self.ddp.grad_accumulation = micro_batches;
    }

    /// Sets the intra-op threads per rank of every strategy.
    pub fn set_threads_per_rank(&mut self, threads: usize) {
        self.single.threads = Some(threads);
        self.dp.threads_per_device = Some(threads);
        self.ddp.threads_per_rank = Some(threads);
    }

    /// The gradient accumulation `kind` runs with.
    pub fn grad_accumulation(&self, kind: StrategyKind) -> usize {
        match kind {
            StrategyKind::Single => self.single.grad_accumulation,
            StrategyKind::DataParallel => self.dp.grad_accumulation,
            StrategyKind::Ddp | StrategyKind::Auto => self.ddp.grad_accumulation,
        }
    }
}

/// Builds the strategy `kind` over `devices` (one rank each; `Auto` resolves from their number).
///
/// # Errors
/// What the chosen strategy's constructor reports, e.g. no devices or `Single` given several.
pub fn build<B, M, O, I>(
    kind: StrategyKind,
    devices: Vec<B::Device>,
    model: M,
    optim: O,
    data: DataSource<B, I, M::Input>,
    configs: &StrategyConfigs,
) -> Result<Box<dyn Strategy<B, M>>, StrategyError>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
    O: Optimizer<M, B> + 'static,
    I: Send + 'static,
{
    Ok(match kind.resolve(devices.len()).kind {
        StrategyKind::Single => {
            let [device] = <[_; 1]>::try_from(devices).map_err(|devices| {
                super::ConfigError::SingleWithMany {
                    devices: devices.len(),
                }
            })?;
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
            configs.dp.clone(),
        )?),
        // `resolve` never returns `Auto`; it shares Ddp's arm rather than a panic.
        StrategyKind::Ddp | StrategyKind::Auto => {
            let world = World::local(devices).map_err(|_| super::ConfigError::NoDevices)?;
            Box::new(Ddp::new(&world, model, optim, data, configs.ddp.clone())?)
        }
    })
}
