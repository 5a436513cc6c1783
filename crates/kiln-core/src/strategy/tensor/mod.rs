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

use std::marker::PhantomData;
use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

use super::ddp::DdpConfig;
use super::launch::materialise;
use super::{
    ConfigError, Engine, OptimizerSpec, PipelineConfig, RankStats, StepOutput, Strategy,
    StrategyError,
};
use crate::World;
use crate::data::{DataSource, ShardPolicy};
use crate::model::{ParallelModel, PipelineSupport, TensorParallelModel};
use crate::optim::OptimizerState;
use crate::tensor_parallel::{TpBackend, disconnect};
use crate::world::Mesh;

/// Configuration of [`Tensor`] (`[parallel.tensor]`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TensorConfig {
    /// Shards of every sharded layer: the `tp` degree.
    pub tp: usize,
    /// Pipeline stages of each shard (1: none); their schedule and micro-batches are
    /// `[parallel.pipeline]`'s.
    pub stages: usize,
    /// Micro-batches per rank and global batch (1 means no accumulation); with stages, flushes
    /// per step.
    pub grad_accumulation: usize,
    /// Largest gradient bucket of the `dp` all-reduce, in MiB.
    pub bucket_cap_mb: f64,
    /// How a global batch that does not divide by the replicas is sharded.
    pub shard_policy: ShardPolicy,
    /// Seconds any collective call may wait (the `tp` group's inside a forward too).
    pub collective_timeout_s: f64,
    /// Check every this many steps that the replicas of each shard are identical (`None`:
    /// off; without stages only).
    pub check_replicas_every: Option<u64>,
    /// Intra-op threads per rank; `None` shares the cores evenly among the ranks.
    pub threads_per_rank: Option<usize>,
}

impl Default for TensorConfig {
    fn default() -> Self {
        Self {
            tp: 2,
            stages: 1,
            grad_accumulation: 1,
            bucket_cap_mb: 25.0,
            shard_policy: ShardPolicy::Uneven,
            collective_timeout_s: 300.0,
            check_replicas_every: None,
            threads_per_rank: None,
        }
    }
}

impl TensorConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.tp == 0 {
            return Err(ConfigError::ZeroShards);
        }
        if self.stages == 0 {
            return Err(ConfigError::ZeroStages);
        }
        if self.stages > 1 && self.check_replicas_every.is_some() {
            // The pipeline's ranks have no replica check.
            return Err(ConfigError::Ignored {
                setting: "check_replicas_every",
                when: "with pipeline stages",
                fix: "leave it unset, or use stages = 1",
            });
        }
        super::error::check_shared_settings(
            self.grad_accumulation,
            self.bucket_cap_mb,
            self.collective_timeout_s,
            self.threads_per_rank,
        )
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.collective_timeout_s)
    }

    /// What the ranks run as without stages: Ddp's settings.
    fn ddp(&self) -> DdpConfig {
        DdpConfig {
            bucket_cap_mb: self.bucket_cap_mb,
            grad_accumulation: self.grad_accumulation,
            shard_policy: self.shard_policy,
            collective_timeout_s: self.collective_timeout_s,
            check_replicas_every: self.check_replicas_every,
            threads_per_rank: self.threads_per_rank,
        }
    }

    /// What the ranks run as with stages: `pipeline`'s schedule and micro-batches, this
    /// config's stages and everything else.
    pub(crate) fn pipeline(&self, pipeline: &PipelineConfig) -> PipelineConfig {
        PipelineConfig {
            stages: self.stages,
            grad_accumulation: self.grad_accumulation,
            bucket_cap_mb: self.bucket_cap_mb,
            shard_policy: self.shard_policy,
            collective_timeout_s: self.collective_timeout_s,
            threads_per_rank: self.threads_per_rank,
            ..pipeline.clone()
        }
    }

    /// The `dp × pp × tp` mesh of `world_size` ranks (`pp` left out without stages).
    fn mesh(&self, world_size: usize) -> Result<Mesh, ConfigError> {
        let model_parallel = self.stages * self.tp;
        if !world_size.is_multiple_of(model_parallel) {
            return Err(ConfigError::WorldNotMesh {
                world: world_size,
                dp: 0,
                model_parallel,
            });
        }
        let mut axes = vec![(Mesh::DP, world_size / model_parallel)];
        if self.stages > 1 {
            axes.push((Mesh::PP, self.stages));
        }
        axes.push((Mesh::TP, self.tp));
        Ok(Mesh::new(&axes).expect("positive degrees, distinct names"))
    }
}

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
