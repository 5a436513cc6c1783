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
//! The same ranks run [`Tensor`](super::Tensor) with stages (`dp × pp × tp`): each rank then
//! holds its stage of a tensor-parallel shard of the model, and the stages of a shard pass
//! activations among themselves.
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
mod support;
mod worker;

use std::collections::HashSet;
use std::sync::Arc;

use burn::tensor::backend::AutodiffBackend;

pub use schedule::{Action, peak_live};
pub use support::PipelineSupport;

use super::exchange::{Share, decode_module};
use super::launch::{Launch, ShardPlace, check_processes};
use super::ranks::{RankThreads, Shard, step_output};
use super::{ConfigError, RankStats, StepOutput, Strategy, StrategyError, StrategyKind};
use crate::World;
use crate::data::DataSource;
use crate::model::PipelineModel;
use crate::optim::{GuardedOptimizer, OptimizerState, StateLayout};
use crate::plan::PipelineConfig;
use crate::stages::assemble;
use crate::world::Mesh;
use worker::{Place, Worker};

/// Pipeline parallelism (times data parallelism) over the ranks of a [`World`].
pub struct Pipeline<B: AutodiffBackend, M: PipelineModel<B>> {
    threads: RankThreads<M::Stage>,
    mesh: Mesh,
    config: PipelineConfig,
    /// The model each tensor-parallel shard started from (the one model without shards), into
    /// which [`Strategy::model`] puts the stages' parameters.
    templates: Vec<M>,
    /// The blocks of each stage, to cut a template into stages.
    ranges: Vec<std::ops::Range<usize>>,
    device: B::Device,
    stats: Vec<RankStats>,
    /// This process asked to stop: the next step tells the others.
    stop_asked: bool,
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
        let mesh = config.mesh(world.mesh(), world.world_size())?;
        check_blocks(&model, config.stages)?;
        check_processes(world, StrategyKind::Pipeline)?;
        let world = world
            .clone()
            .with_mesh(mesh)
            .map_err(|_| ConfigError::NoDevices)?;
        let launch = Launch::whole(&world, model, config.timeout())?;
        Self::launch(launch, optim, data, config, "kiln-pipeline")
    }

    /// Starts the ranks of `launch` (a `dp × pp` mesh, or `dp × pp × tp` with each rank's
    /// shard), each with its stage of its model and a clone of `optim`, as threads named
    /// `name-rank<r>`.
    pub(crate) fn launch<O, I>(
        launch: Launch<B, M>,
        optim: O,
        data: DataSource<B, I, <M as burn::train::TrainStep>::Input>,
        config: PipelineConfig,
        name: &str,
    ) -> Result<Self, StrategyError>
    where
        O: GuardedOptimizer<M::Stage, B> + 'static,
        I: Send + 'static,
    {
        config.validate()?;
        let Launch {
            mesh,
            first_rank,
            sharing,
            ranks,
            shards,
            mut facts,
            templates,
        } = launch;
        let local_ranks = ranks.len();
        let device = ranks[0].device.clone();
        let blocks = ranks[0].model.num_blocks();
        check_blocks(&ranks[0].model, config.stages)?;
        let ranges = config.ranges(blocks)?;
        // What every rank checks at start-up that the others hold too: the whole model's
        // layout (each rank then holds only its stage), the dtype, the settings.
        facts.push((
            "model layout".into(),
            format!("{:?}", crate::params::signature(&ranks[0].model)),
        ));
        facts.push(super::agree::dtype_fact::<B>());
        facts.push(("pipeline settings".into(), format!("{config:?}")));
        // Across processes each cuts its stages from its own copy of the whole model (a
        // sharded model's values are checked before sharding).
        if local_ranks < mesh.size() && shards.is_none() {
            facts.push(super::agree::values_fact::<B, M>(&ranks[0].model));
        }
        let mut workers = Vec::with_capacity(local_ranks);
        for (i, start) in ranks.into_iter().enumerate() {
            let rank = first_rank + i;
            let stage = mesh.coord(rank, Mesh::PP);
            let sharers = local_ranks * sharing;
            let pool = super::threads::rank_pool(rank, sharers, config.threads_per_rank)?;
            let shard = ShardPlace::of(shards.as_ref(), start.shard_group, &mesh, rank);
            let module = start.model.split(&ranges).swap_remove(stage);
            let worker = Worker::<B, M, O, I> {
                place: Place {
                    stage,
                    stages: config.stages,
                    replicas: mesh.degree(Mesh::DP),
                    shard,
                    none: HashSet::new(),
                },
                device: start.device,
                module: Some(module),
                optim: optim.clone(),
                data: data.clone(),
                groups: start.groups,
                config: config.clone(),
                plan: None,
                stats: RankStats {
                    rank,
                    ..Default::default()
                },
                facts: facts.clone(),
            };
            workers.push((worker, pool));
        }
        let (threads, ready) = RankThreads::spawn(name, first_rank, workers, config.timeout())?;
        let mut stats = Vec::new();
        step_output(&mut stats, ready, &mesh);
        let pipeline = Self {
            threads,
            config,
            templates,
            ranges,
            device,
            stats,
            mesh,
            stop_asked: false,
        };
        tracing::debug!(
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

    /// The mesh the ranks form: `dp × pp`, or `dp × pp × tp`.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The model of every tensor-parallel shard of the first replica, stages assembled, in
    /// shard order (the one model without shards).
    ///
    /// Across processes every process must ask at the same point: the stages of other
    /// processes come through the collective.
    pub(crate) fn shard_models(&self) -> Result<Vec<M>, StrategyError> {
        let gathered = match self.spans_processes() {
            true => Some(self.threads.share(Share::Module)?),
            false => None,
        };
        (0..self.mesh.degree(Mesh::TP))
            .map(|t| {
                let stages = (0..self.config.stages)
                    .map(|s| {
                        let rank = self.mesh.rank_at(&[(Mesh::PP, s), (Mesh::TP, t)]);
                        match &gathered {
                            None => self.threads.hand(rank),
                            Some(all) => {
                                let template = self.templates[t].clone().split(&self.ranges);
                                let template = template.into_iter().nth(s).expect("a stage");
                                decode_module(template, &all[rank], &self.device)
                                    .map_err(StrategyError::from)
                            }
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(assemble(self.templates[t].clone(), &stages, &self.device))
            })
            .collect()
    }

    /// The world's ranks this process holds.
    fn local_ranks(&self) -> std::ops::Range<usize> {
        let first = self.threads.first();
        first..first + self.threads.len()
    }

    /// The layout of the optimizer state: one state per stage, or per stage and shard.
    fn layout(&self) -> StateLayout {
        match self.mesh.degree(Mesh::TP) {
            1 => StateLayout::Stages(self.config.stages),
            shards => StateLayout::Sharded {
                stages: self.config.stages,
                shards,
            },
        }
    }
}

/// More stages than the model has blocks cannot work, nor a split the model refuses.
fn check_blocks<B: AutodiffBackend, M: PipelineModel<B>>(
    model: &M,
    stages: usize,
) -> Result<(), ConfigError> {
    let blocks = model.num_blocks();
    if stages > blocks {
        return Err(ConfigError::TooManyStages { stages, blocks });
    }
    model
        .check_split(stages)
        .map_err(|reason| ConfigError::SplitRefused { stages, reason })
}

impl<B: AutodiffBackend, M: PipelineModel<B>> Strategy<B, M> for Pipeline<B, M> {
    fn name(&self) -> &'static str {
        "pipeline"
    }

    fn world_size(&self) -> usize {
        self.mesh.size()
    }

    fn step(&mut self, batch: &[usize], lr: f64) -> Result<StepOutput, StrategyError> {
        let replicas = self.mesh.degree(Mesh::DP);
        self.config.check_micro_batches(batch.len(), replicas)?;
        let shards = self.config.shard_policy.shard(batch, replicas)?;
        // Every stage (and shard) of replica d trains on shard d.
        let mut shards = Shard::of_replicas(shards);
        for shard in &mut shards {
            shard.stop = self.stop_asked;
        }
        let per_rank = self
            .local_ranks()
            .map(|rank| shards[self.mesh.coord(rank, Mesh::DP)].clone())
            .collect();
        let done = self.threads.step(per_rank, lr)?;
        Ok(step_output(&mut self.stats, done, &self.mesh))
    }

    fn spans_processes(&self) -> bool {
        self.threads.len() < self.mesh.size()
    }

    fn ask_stop(&mut self) -> bool {
        // Ranks in other processes would wait for this process's next step: tell them with it.
        self.stop_asked = true;
        !self.spans_processes()
    }

    fn model(&self) -> Result<M, StrategyError> {
        Ok(self.shard_models()?.swap_remove(0))
    }

    fn stats(&self) -> Vec<RankStats> {
        self.stats.clone()
    }

    fn optimizer_state(&self) -> Result<OptimizerState, StrategyError> {
        // The replicas of a stage hold the same state; the first replica's stands for all.
        let shards = self.mesh.degree(Mesh::TP);
        let gathered = match self.spans_processes() {
            true => Some(self.threads.share(Share::Optimizer)?),
            false => None,
        };
        let parts = (0..self.config.stages)
            .flat_map(|s| (0..shards).map(move |t| (s, t)))
            .map(|(s, t)| {
                let rank = self.mesh.rank_at(&[(Mesh::PP, s), (Mesh::TP, t)]);
                match &gathered {
                    None => self.threads.save_optimizer(rank),
                    Some(all) => Ok(all[rank].clone()),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(OptimizerState::new(self.layout(), parts))
    }

    fn load_optimizer_state(&mut self, state: &OptimizerState) -> Result<(), StrategyError> {
        let parts: Vec<Arc<[u8]>> = state
            .parts(self.layout())?
            .iter()
            .map(|p| p.as_slice().into())
            .collect();
        let shards = self.mesh.degree(Mesh::TP);
        let per_rank = self
            .local_ranks()
            .map(|rank| {
                let (s, t) = (
                    self.mesh.coord(rank, Mesh::PP),
                    self.mesh.coord(rank, Mesh::TP),
                );
                parts[s * shards + t].clone()
            })
            .collect();
        self.threads.load_optimizer(per_rank)
    }
}
