//! `Tensor`: tensor parallelism, Megatron-LM's way — every sharded layer's weight split over
//! the ranks of a `tp` group, the communication inside the autodiff graph — times data
//! parallelism over `dp`, and optionally pipeline stages over `pp`: the world is
//! `dp × pp × tp`, as torchtitan composes them.
//!
//! The model says how it shards ([`TensorParallelModel`]): each rank of the mesh holds its
//! shard (built from the whole model, slices of its weights) with its `tp` group inside the
//! sharded layers. The ranks then run as Ddp's (without stages) or the pipeline's (with
//! them): the replicas of a shard all-reduce its gradients over `dp`, the stages of a shard
//! pass activations over `pp`, and the guard agrees on its facts over the world, counting
//! each replicated parameter once. All `tp` ranks of a replica see the same batch.
//! [`Strategy::model`] gathers the first replica's shards into the whole model, which saves
//! and loads as the ordinary model.
//!
//! The replicated parameters (norms, embeddings, a head) get bit-identical gradients on every
//! shard, as in Megatron-LM: their inputs and output gradients are the same on every rank,
//! because every join of the shards is an all-reduce that adds the parts in rank order. So
//! they need no synchronisation, and every shard's copy stays the same.

mod shard;
mod support;

use std::marker::PhantomData;

use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

use super::launch::materialise;
use super::pipeline::PipelineSupport;
use super::{
    ConfigError, Engine, OptimizerSpec, PipelineConfig, RankStats, StepOutput, Strategy,
    StrategyError,
};
use crate::World;
use crate::data::DataSource;
use crate::model::{ParallelModel, TensorParallelModel};
use crate::optim::OptimizerState;
use crate::plan::TensorConfig;
use crate::tensor_parallel::{TpBackend, disconnect};
use crate::world::Mesh;

pub use support::TensorSupport;

/// Tensor parallelism (times data parallelism and pipeline stages) over the ranks of a
/// [`World`]. See the [module docs](self).
pub struct Tensor<B, M>
where
    B: AutodiffBackend + TpBackend,
    M: TensorParallelModel<B>,
{
    engine: Box<dyn Engine<B, M::Sharded>>,
    mesh: Mesh,
    model: PhantomData<M>,
}

impl<B, M> Tensor<B, M>
where
    B: AutodiffBackend + TpBackend,
    M: TensorParallelModel<B>,
{
    /// Shards `model` over `config.tp` ranks and starts one worker per rank of `world`
    /// (`dp × tp` ranks, or `dp × stages × tp`), each with its shard (or its stage of its
    /// shard) and an optimizer from `optim`. With stages, `pipeline` gives their schedule and
    /// micro-batches.
    ///
    /// # Errors
    /// [`ConfigError`] for an impossible configuration: a world that is not a multiple of
    /// `stages × tp`, a width that does not divide by `tp`, stages of a model whose shards do
    /// not split into stages, processes that cannot be connected.
    pub fn new<S, I>(
        world: &World<B::Device>,
        model: M,
        optim: &S,
        data: DataSource<B, I, M::Input>,
        config: TensorConfig,
        pipeline: &PipelineConfig,
    ) -> Result<Self, StrategyError>
    where
        S: OptimizerSpec<B>,
        I: Send + 'static,
        M::Sharded: ParallelModel<B, Pipeline: PipelineSupport<B, M::Sharded>>,
    {
        config.validate()?;
        let mesh = config.mesh(world.world_size())?;
        // Materialised before anything reads it: a lazily initialised parameter would draw
        // new values in every clone that the checks and the shards make.
        let model = materialise(model, &world.devices()[0])?;
        model.check_shards(config.tp).map_err(ConfigError::from)?;
        let launch = shard::launch(world, &mesh, &model, config.timeout())?;
        let engine: Box<dyn Engine<B, M::Sharded>> = if config.stages == 1 {
            Box::new(super::Ddp::launch(
                launch,
                optim.init::<M::Sharded>(),
                data,
                config.ddp(),
                "kiln-tensor",
            )?)
        } else {
            <<M::Sharded as ParallelModel<B>>::Pipeline as PipelineSupport<B, M::Sharded>>::launch(
                launch,
                optim,
                data,
                config.pipeline(pipeline),
                "kiln-tensor",
            )?
        };
        tracing::debug!(
            mesh = %mesh,
            "Applied Tensor: {} shards per layer, mesh {mesh}",
            config.tp
        );
        Ok(Self {
            engine,
            mesh,
            model: PhantomData,
        })
    }

    /// The `dp × pp × tp` mesh the ranks form.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The model of every shard of the first replica, in shard order: what
    /// [`Strategy::model`] gathers.
    ///
    /// # Errors
    /// When a rank holding one has failed.
    ///
    /// The shards are disconnected from their ranks' groups (see
    /// [`disconnect`](crate::tensor_parallel::disconnect)): they can be inspected and saved,
    /// not run.
    pub fn shards(&self) -> Result<Vec<M::Sharded>, StrategyError> {
        Ok(self
            .engine
            .shard_models()?
            .into_iter()
            .map(disconnect)
            .collect())
    }
}

impl<B, M> Strategy<B, M> for Tensor<B, M>
where
    B: AutodiffBackend + TpBackend,
    M: TensorParallelModel<B>,
{
    fn name(&self) -> &'static str {
        "tensor"
    }

    fn world_size(&self) -> usize {
        self.mesh.size()
    }

    fn step(&mut self, batch: &[usize], lr: f64) -> Result<StepOutput, StrategyError> {
        self.engine.step(batch, lr)
    }

    fn step_with_items(
        &mut self,
        batch: &[usize],
        lr: f64,
    ) -> Result<(StepOutput, Vec<<M as TrainStep>::Output>), StrategyError> {
        self.engine.step_with_items(batch, lr)
    }

    fn model(&self) -> Result<M, StrategyError> {
        Ok(M::gather(self.engine.shard_models()?))
    }

    fn spans_processes(&self) -> bool {
        self.engine.spans_processes()
    }

    fn ask_stop(&mut self) -> bool {
        self.engine.ask_stop()
    }

    fn stats(&self) -> Vec<RankStats> {
        self.engine.stats()
    }

    fn optimizer_state(&self) -> Result<OptimizerState, StrategyError> {
        self.engine.optimizer_state()
    }

    fn load_optimizer_state(&mut self, state: &OptimizerState) -> Result<(), StrategyError> {
        self.engine.load_optimizer_state(state)
    }
}
