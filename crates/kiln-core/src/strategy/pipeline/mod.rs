//! `Pipeline`: the model split into stages on different ranks, micro-batches flowing through
//! them (GPipe or 1F1B), optionally times data parallelism (`dp × pp`).
//!
//! The world's ranks form a `dp × pp` mesh: rank `(d, s)` runs stage `s` of replica `d` on its
//! own thread. Every step, each replica takes its shard of the global batch (as Ddp shards),
//! cuts it into `m` micro-batches (times the gradient accumulation) and runs the schedule:
//! activations go forward and their gradients backward through the `pp` group's send and
//! receive; the backward of stage `s` starts from the gradient received from stage `s + 1`,
//! injected as the output gradient of its forward. Each micro-batch's loss is weighted by its
//! share of the global batch exactly as in Ddp, so after the stages' gradients are all-reduced
//! over `dp` (per stage, bucketed) and every stage steps its optimizer, the stages hold what
//! single-device training would. [`Strategy::model`] assembles the whole model from the
//! stages of replica 0 by `ParamId`.
//!
//! A stage keeps each micro-batch's autodiff graph from its forward to its backward, as
//! torch.distributed.pipelining does. Each graph hangs from its own copy of the stage whose
//! parameters are fresh autodiff leaves over the same values: Burn 0.21's graph memory
//! management, run after every backward, can free nodes of other live graphs that share
//! parameter leaves, and those graphs then lose gradients. With
//! [`PipelineConfig::recompute`], a stage keeps only the micro-batch's input and recomputes
//! the forward in the backward (activation checkpointing at stage granularity, as
//! Megatron-LM's full recompute): less memory, one more forward per micro-batch and stage.
//! A stochastic layer (dropout) then draws a new mask in the recomputed forward, so exact
//! equivalence with single-device training needs dropout off there.

mod schedule;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use crate::optim::{GuardedOptimizer, OptimizerState, StateLayout};
use burn::tensor::backend::AutodiffBackend;

pub use schedule::{Action, Schedule, peak_live};

use super::dispatch::{RankThreads, Shard, check_single_process, materialise, step_output};
use super::{ConfigError, RankStats, StepOutput, Strategy, StrategyError};
use crate::World;
use crate::collective::MeshCollectives;
use crate::data::{DataSource, ShardPolicy};
use crate::stages::{PipelineModel, assemble, even_ranges};
use crate::world::Mesh;
use worker::{Place, Worker};

/// Configuration of [`Pipeline`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PipelineConfig {
    /// Pipeline stages `p`: the world is `dp × p` ranks. At most the model's blocks.
    pub stages: usize,
    /// Micro-batches `m` per flush; each replica's shard is cut into this many.
    pub micro_batches: usize,
    /// The order of forwards and backwards.
    pub schedule: Schedule,
    /// Flushes per optimizer step (gradient accumulation).
    pub grad_accumulation: usize,
    /// Largest gradient bucket of the `dp` all-reduce, in MiB.
    pub bucket_cap_mb: f64,
    /// How a global batch that does not divide by the replicas is sharded.
    pub shard_policy: ShardPolicy,
    /// Seconds any collective call may wait before failing.
    pub collective_timeout_s: f64,
    /// Intra-op threads per rank; `None` shares the cores evenly among the ranks.
    pub threads_per_rank: Option<usize>,
    /// Activation checkpointing at stage granularity: keep only each micro-batch's stage
    /// input between its forward and backward, and recompute the forward in the backward.
    /// Saves the stage's inner activations for one extra forward per micro-batch.
    pub recompute: bool,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            stages: 2,
            micro_batches: 4,
            schedule: Schedule::OneFOneB,
            grad_accumulation: 1,
            bucket_cap_mb: 25.0,
            shard_policy: ShardPolicy::Uneven,
            collective_timeout_s: 300.0,
            threads_per_rank: None,
            recompute: false,
        }
    }
}

impl PipelineConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.stages == 0 {
            return Err(ConfigError::ZeroStages);
        }
        if self.micro_batches == 0 {
            return Err(ConfigError::ZeroMicroBatches);
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

    /// The `dp × pp` mesh for `world_size` ranks: the world's own when it has a `pp` axis,
    /// otherwise `dp = world_size / stages`.
    fn mesh(&self, world: &Mesh, world_size: usize) -> Result<Mesh, ConfigError> {
        let mismatch = || ConfigError::PipelineMesh {
            mesh: world.to_string(),
            stages: self.stages,
            world_size,
        };
        let pp = world.degree(Mesh::PP);
        if pp > 1 || world.axes().iter().any(|a| a.name == Mesh::PP) {
            let only_dp_pp = world
                .axes()
                .iter()
                .all(|a| a.name == Mesh::DP || a.name == Mesh::PP || a.degree == 1);
            if pp != self.stages || !only_dp_pp {
                return Err(mismatch());
            }
        } else if !world_size.is_multiple_of(self.stages) || world.degree(Mesh::TP) > 1 {
            return Err(mismatch());
        }
        Mesh::new(&[
            (Mesh::DP, world_size / self.stages),
            (Mesh::PP, self.stages),
        ])
        .map_err(|_| mismatch())
    }
}

/// Pipeline parallelism (times data parallelism) over the ranks of a [`World`].
pub struct Pipeline<B: AutodiffBackend, M: PipelineModel<B>> {
    threads: RankThreads<M::Stage>,
    mesh: Mesh,
    config: PipelineConfig,
    /// The whole model as given, into which [`Strategy::model`] puts the stages' parameters.
    template: M,
    device: B::Device,
    stats: Vec<RankStats>,
}

impl<B: AutodiffBackend, M: PipelineModel<B>> Pipeline<B, M> {
    /// Splits `model` into `config.stages` stages of nearly equal numbers of blocks and starts
    /// one worker per rank of `world`, each with its stage and a clone of `optim`.
    ///
    /// # Errors
    /// [`ConfigError`] for an impossible configuration: more stages than blocks, a mesh that
    /// is not `dp × stages`, a multi-process world.
    pub fn new<O, I>(
        world: &World<B::Device>,
        model: M,
        optim: O,
        data: DataSource<B, I, <M as burn::train::TrainStep>::Input>,
        config: PipelineConfig,
    ) -> Result<Self, StrategyError>
    where
        O: GuardedOptimizer<M::Stage, B> + 'static,
        I: Send + 'static,
    {
        config.validate()?;
        check_single_process(world)?;
        let world_size = world.world_size();
        let mesh = config.mesh(world.mesh(), world_size)?;
        let blocks = model.num_blocks();
        if config.stages > blocks {
            return Err(ConfigError::TooManyStages {
                stages: config.stages,
                blocks,
            }
            .into());
        }
        // Every stage and the template then hold the same values.
        let device = world.devices()[0].clone();
        let model = materialise(model, &device)?;
        let stages = model.split(&even_ranges(blocks, config.stages));

        let groups = MeshCollectives::<B::InnerBackend>::in_process(&mesh, config.timeout());
        let mut workers = Vec::with_capacity(world_size);
        for (rank, groups) in groups.into_iter().enumerate() {
            let stage = mesh.coord(rank, Mesh::PP);
            let pool = super::threads::rank_pool(rank, world_size, config.threads_per_rank)?;
            let worker = Worker::<B, M, O, I> {
                place: Place {
                    stage,
                    stages: config.stages,
                    replicas: mesh.degree(Mesh::DP),
                },
                device: world.devices()[rank].clone(),
                module: Some(stages[stage].clone()),
                optim: optim.clone(),
                data: data.clone(),
                groups,
                config: config.clone(),
                plan: None,
                stats: RankStats {
                    rank,
                    ..Default::default()
                },
            };
            workers.push((worker, pool));
        }
        let (threads, ready) = RankThreads::spawn("kiln-pipeline", workers, config.timeout())?;
        let pipeline = Self {
            threads,
            config,
            template: model,
            device,
            stats: ready.into_iter().map(|d| d.stats).collect(),
            mesh,
        };
        tracing::info!(
            mesh = %pipeline.mesh,
            schedule = %pipeline.config.schedule,
            "Applied Pipeline: {} stages of {blocks} blocks × {} replicas, {} micro-batches, {}",
            pipeline.config.stages,
            pipeline.mesh.degree(Mesh::DP),
            pipeline.config.micro_batches,
            pipeline.config.schedule
        );
        Ok(pipeline)
    }

    /// The `dp × pp` mesh the ranks form.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }
}

impl<B: AutodiffBackend, M: PipelineModel<B>> Strategy<B, M> for Pipeline<B, M> {
    fn name(&self) -> &'static str {
        "pipeline"
    }

    fn world_size(&self) -> usize {
        self.threads.len()
    }

    fn step(&mut self, batch: &[usize], lr: f64) -> Result<StepOutput, StrategyError> {
        let replicas = self.mesh.degree(Mesh::DP);
        let shards = self.config.shard_policy.shard(batch, replicas)?;
        let smallest = shards.iter().map(Vec::len).min().unwrap_or(0);
        if self.config.micro_batches > smallest {
            return Err(ConfigError::MicroBatchesExceedBatch {
                micro_batches: self.config.micro_batches,
                samples: smallest,
                batch: batch.len(),
                replicas,
            }
            .into());
        }
        // Every stage of replica d trains on shard d.
        let shards = Shard::of_replicas(shards);
        let per_rank = (0..self.threads.len())
            .map(|rank| shards[self.mesh.coord(rank, Mesh::DP)].clone())
            .collect();
        let done = self.threads.step(per_rank, lr)?;
        Ok(step_output(&mut self.stats, done))
    }

    fn model(&self) -> Result<M, StrategyError> {
        let mut stages = Vec::with_capacity(self.config.stages);
        for stage in 0..self.config.stages {
            stages.push(self.threads.hand(self.mesh.rank(&[0, stage]))?);
        }
        Ok(assemble(self.template.clone(), &stages, &self.device))
    }

    fn stats(&self) -> Vec<RankStats> {
        self.stats.clone()
    }

    fn optimizer_state(&self) -> Result<OptimizerState, StrategyError> {
        // The replicas of a stage hold the same state; the first replica's stands for all.
        let parts = (0..self.config.stages)
            .map(|stage| self.threads.save_optimizer(self.mesh.rank(&[0, stage])))
            .collect::<Result<_, _>>()?;
        Ok(OptimizerState::new(
            StateLayout::Stages(self.config.stages),
            parts,
        ))
    }

    fn load_optimizer_state(&mut self, state: &OptimizerState) -> Result<(), StrategyError> {
        let parts: Vec<Arc<[u8]>> = state
            .parts(StateLayout::Stages(self.config.stages))?
            .iter()
            .map(|p| p.as_slice().into())
            .collect();
        let per_rank = (0..self.threads.len())
            .map(|rank| parts[self.mesh.coord(rank, Mesh::PP)].clone())
            .collect();
        self.threads.load_optimizer(per_rank)
    }
}
