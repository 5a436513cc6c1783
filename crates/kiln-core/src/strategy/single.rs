//! `Single`: training on one device, through the same interface as the others.
//!
//! It is [`Ddp`] over a one-rank world: one persistent worker thread (so all device work is
//! queued from one thread, which devices with per-thread streams need), no collective calls,
//! and the same micro-batching. Kept as its own name because "one device" is the reference
//! every other strategy is compared with, and what `auto` picks for one rank.

use crate::optim::{GuardedOptimizer, OptimizerState};
use crate::plan::SingleConfig;
use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

use super::{Ddp, DdpConfig, RankStats, StepOutput, Strategy, StrategyError};
use crate::World;
use crate::data::DataSource;
use crate::model::TrainModel;

/// Training on one device: the reference every other strategy must match.
///
/// A one-rank [`Ddp`] under its own name (see the module docs).
pub struct Single<B: AutodiffBackend, M: TrainModel<B>> {
    one_rank_ddp: Ddp<B, M>,
}

impl<B: AutodiffBackend, M: TrainModel<B>> Single<B, M> {
    /// Trains `model` on `device` with `optim`, reading samples from `data`.
    ///
    /// # Errors
    /// [`StrategyError`] for an impossible configuration.
    pub fn new<O, I>(
        model: M,
        optim: O,
        data: DataSource<B, I, M::Input>,
        device: B::Device,
        config: SingleConfig,
    ) -> Result<Self, StrategyError>
    where
        O: GuardedOptimizer<M, B> + 'static,
        I: Send + 'static,
    {
        let world = World::local(vec![device]).expect("one device is a valid world");
        let config = DdpConfig {
            grad_accumulation: config.grad_accumulation,
            threads_per_rank: config.threads_per_rank,
            ..DdpConfig::default()
        };
        Ok(Self {
            one_rank_ddp: Ddp::new(&world, model, optim, data, config)?,
        })
    }
}

impl<B: AutodiffBackend, M: TrainModel<B>> Strategy<B, M> for Single<B, M> {
    fn name(&self) -> &'static str {
        "single"
    }

    fn world_size(&self) -> usize {
        1
    }

    fn step(&mut self, batch: &[usize], lr: f64) -> Result<StepOutput, StrategyError> {
        self.one_rank_ddp.step(batch, lr)
    }

    fn step_with_items(
        &mut self,
        batch: &[usize],
        lr: f64,
    ) -> Result<(StepOutput, Vec<<M as TrainStep>::Output>), StrategyError> {
        self.one_rank_ddp.step_with_items(batch, lr)
    }

    fn model(&self) -> Result<M, StrategyError> {
        self.one_rank_ddp.model()
    }

    fn stats(&self) -> Vec<RankStats> {
        self.one_rank_ddp.stats()
    }

    fn optimizer_state(&self) -> Result<OptimizerState, StrategyError> {
        self.one_rank_ddp.optimizer_state()
    }

    fn load_optimizer_state(&mut self, state: &OptimizerState) -> Result<(), StrategyError> {
        self.one_rank_ddp.load_optimizer_state(state)
    }
}
