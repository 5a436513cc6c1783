//! `Ddp`: distributed data parallelism — a persistent replica per rank on its own thread.
//!
//! Every rank owns a replica and an optimizer. At start, rank 0's parameters are broadcast so
//! all replicas begin identical. Each step, every rank reads its own shard of the global batch
//! (the same deterministic sharding on every rank), accumulates the weighted gradients of its
//! micro-batches locally (no communication on the non-final micro-steps, PyTorch's `no_sync`),
//! all-reduces them in buckets of at most `bucket_cap_mb`, and steps its optimizer. Identical
//! gradients and identical optimizer states keep the replicas identical, which the optional
//! replica check verifies.
//!
//! With `shard_state = "optimizer"` (ZeRO-1) the replicas split the optimizer state instead:
//! each owns whole parameters, about `1 / dp` of the elements, and after the same all-reduce
//! and the same guard over every gradient it steps only its own and broadcasts them, so the
//! replicas stay identical while each holds a part of the state. A checkpoint gathers the parts
//! into the state plain `ddp` saves. With `shard_state = "gradients"` (ZeRO-2) the all-reduce
//! becomes a reduction to each parameter's owner, so each replica also holds only its own
//! parameters' reduced gradients, and the guard's norm adds the owners' parts. With
//! `shard_state = "parameters"` (ZeRO-3) each replica also releases the others' parameters
//! after the step and gathers them from their owners before the next forward, so between steps
//! it holds its own part alone; [`Ddp::model`] then gathers with every replica.
//!
//! The ranks all-reduce over the `dp` axis of the world's mesh, which for Ddp is the whole
//! world (a mesh that also splits the model is refused). The calling thread only dispatches
//! steps and collects reports; rank 0's worker holds the canonical model.
//!
//! The same ranks run [`Tensor`](super::Tensor) without stages: each rank then holds a
//! tensor-parallel shard instead of a replica, the replicas of a shard all-reduce over `dp`,
//! and the guard agrees on its facts over the world.

mod worker;

use std::sync::Arc;

use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

use super::exchange::{Share, decode_module};
use super::launch::{Launch, ShardPlace};
use super::ranks::{RankThreads, Shard, step_output};
use super::{ConfigError, RankStats, StepOutput, Strategy, StrategyError};
use crate::World;
use crate::data::DataSource;
use crate::model::TrainModel;
use crate::optim::{GuardedOptimizer, OptimizerState, StateError, StateLayout, decode, encode};
use crate::plan::DdpConfig;
use crate::world::Mesh;
use worker::Worker;

/// Distributed data parallelism over the ranks of a [`World`].
pub struct Ddp<B: AutodiffBackend, M: TrainModel<B>> {
    threads: RankThreads<M>,
    mesh: Mesh,
    config: DdpConfig,
    stats: Vec<RankStats>,
    num_buckets: usize,
    /// This process asked to stop: the next step tells the others.
    stop_asked: bool,
    /// Every shard's template, when some shard lives only in other processes: its parameters
    /// then arrive as bytes (see [`Self::shard_models`]).
    elsewhere: Option<Vec<M>>,
    /// This process's first device: where gathered shards are decoded.
    device: B::Device,
    /// Under a split optimizer state with more than one replica: gathers the replicas'
    /// parts of the optimizer state into the whole state a checkpoint holds.
    merge_parts: Option<MergeParts>,
    backend: std::marker::PhantomData<B>,
}

/// Gathers every replica's encoded part of a split optimizer state into one encoded state.
type MergeParts = Box<dyn Fn(&[Vec<u8>]) -> Result<Vec<u8>, StateError> + Send>;

/// How `optim`'s replicas' parts become one state: each part decoded into a copy of `optim`,
/// their per-parameter states joined.
fn merge_parts<B, M, O>(optim: O, device: B::Device) -> MergeParts
where
    B: AutodiffBackend,
    M: TrainModel<B>,
    O: GuardedOptimizer<M, B> + 'static,
{
    Box::new(move |parts| {
        let mut whole: Option<O> = None;
        for part in parts {
            let part = decode(&optim, part, &device)?;
            whole = Some(match whole {
                None => part,
                Some(whole) => whole
                    .merge_state(part)
                    .expect("Ddp checks at start that the optimizer splits its state"),
            });
        }
        encode(&whole.expect("a world has at least one rank"))
    })
}

impl<B: AutodiffBackend, M: TrainModel<B>> Ddp<B, M> {
    /// Starts one worker per device of `world`, each with a replica of `model` and a clone of
    /// `optim`, reading from `data`; returns when every rank holds rank 0's parameters.
    ///
    /// # Errors
    /// [`ConfigError`] for an impossible configuration or a multi-process world;
    /// [`StrategyError::Failed`] when a rank fails while starting.
    pub fn new<O, I>(
        world: &World<B::Device>,
        model: M,
        optim: O,
        data: DataSource<B, I, M::Input>,
        config: DdpConfig,
    ) -> Result<Self, StrategyError>
    where
        O: GuardedOptimizer<M, B> + 'static,
        I: Send + 'static,
    {
        config.validate()?;
        let mesh = world.mesh();
        if mesh.degree(Mesh::DP) != world.world_size() {
            return Err(ConfigError::MeshSplitsTheModel {
                strategy: "ddp",
                mesh: mesh.to_string(),
            }
            .into());
        }
        let launch = Launch::whole(world, model, config.timeout())?;
        Self::launch(launch, optim, data, config, "kiln-ddp")
    }

    /// Starts the ranks of `launch` (a `dp` mesh, or `dp × tp` with each rank's shard), each
    /// with a clone of `optim`, as threads named `name-rank<r>`.
    pub(crate) fn launch<O, I>(
        launch: Launch<B, M>,
        optim: O,
        data: DataSource<B, I, M::Input>,
        config: DdpConfig,
        name: &str,
    ) -> Result<Self, StrategyError>
    where
        O: GuardedOptimizer<M, B> + 'static,
        I: Send + 'static,
    {
        config.validate()?;
        let split_state = config.shard_state.splits_optimizer();
        if split_state && optim.clone().retain_state(&Default::default()).is_none() {
            return Err(ConfigError::StateNotSplittable.into());
        }
        let Launch {
            mesh,
            first_rank,
            sharing,
            ranks,
            shards,
            facts,
            templates,
        } = launch;
        let world_size = mesh.size();
        let local_ranks = ranks.len();
        let device = ranks[0].device.clone();
        let local = first_rank..first_rank + local_ranks;
        // Consecutive ranks cover every shard once a process holds `tp` of them: then every
        // process holds all, else none does, and each process decides alike.
        let elsewhere = (0..mesh.degree(Mesh::TP))
            .any(|t| !local.clone().any(|rank| mesh.coord(rank, Mesh::TP) == t))
            .then_some(templates);
        let mut workers = Vec::with_capacity(local_ranks);
        for (i, start) in ranks.into_iter().enumerate() {
            let rank = first_rank + i;
            let sharers = local_ranks * sharing;
            let pool = super::threads::rank_pool(rank, sharers, config.threads_per_rank)?;
            let shard = ShardPlace::of(shards.as_ref(), start.shard_group, &mesh, rank);
            let worker = Worker {
                replicas: mesh.degree(Mesh::DP),
                device: start.device,
                model: Some(start.model),
                optim: optim.clone(),
                data: data.clone(),
                groups: start.groups,
                shard,
                config: config.clone(),
                plan: None,
                owners: None,
                stats: RankStats {
                    rank,
                    ..Default::default()
                },
                steps: 0,
                facts: facts.clone(),
            };
            workers.push((worker, pool));
        }
        let (threads, ready) = RankThreads::spawn(name, first_rank, workers, config.timeout())?;
        let mut stats = Vec::new();
        let num_buckets = ready.first().map_or(0, |r| r.num_buckets);
        // Start-up broadcast traffic and time belong to the ranks' totals.
        step_output(&mut stats, ready, &mesh);
        let merge_parts = (split_state && mesh.degree(Mesh::DP) > 1)
            .then(|| merge_parts::<B, M, O>(optim, device.clone()));
        let ddp = Self {
            threads,
            merge_parts,
            num_buckets,
            stop_asked: false,
            stats,
            mesh,
            config,
            elsewhere,
            device,
            backend: std::marker::PhantomData,
        };
        tracing::debug!(
            ranks = world_size,
            buckets = ddp.num_buckets,
            accumulation = ddp.config.grad_accumulation,
            "Applied Ddp: {world_size} ranks (mesh {}), {} gradient buckets of at most {} MiB",
            ddp.mesh,
            ddp.num_buckets,
            ddp.config.bucket_cap_mb
        );
        Ok(ddp)
    }

    /// Gradient buckets per step, hence all-reduce calls per step.
    pub fn num_buckets(&self) -> usize {
        self.num_buckets
    }

    /// One step on every rank; with `keep_items`, each rank's output items too.
    fn step_ranks(
        &mut self,
        batch: &[usize],
        lr: f64,
        keep_items: bool,
    ) -> Result<(StepOutput, Vec<<M as TrainStep>::Output>), StrategyError> {
        // Cut once, here: bad input is an error before any rank starts. Every rank of a
        // replica (its tensor-parallel shards) trains on the replica's shard.
        let replicas = self.mesh.degree(Mesh::DP);
        let shards = self.config.shard_policy.shard(batch, replicas)?;
        let mut shards = Shard::of_replicas(shards);
        for shard in &mut shards {
            shard.keep_items = keep_items;
            shard.stop = self.stop_asked;
        }
        let per_rank = self
            .local_ranks()
            .map(|rank| shards[self.mesh.coord(rank, Mesh::DP)].clone())
            .collect();
        let mut done = self.threads.step(per_rank, lr)?;
        // The items of the first shard of each replica (the shards' items are the same).
        let items = done
            .iter_mut()
            .zip(self.local_ranks())
            .filter(|(_, rank)| self.first_shard(*rank))
            .map(|(d, _)| d)
            .flat_map(|d| std::mem::take(&mut d.items))
            .map(|item| {
                *item
                    .downcast::<<M as TrainStep>::Output>()
                    .expect("a rank sends its model's output items")
            })
            .collect();
        Ok((step_output(&mut self.stats, done, &self.mesh), items))
    }

    /// The world's ranks this process holds.
    fn local_ranks(&self) -> std::ops::Range<usize> {
        let first = self.threads.first();
        first..first + self.threads.len()
    }

    fn first_shard(&self, rank: usize) -> bool {
        self.mesh.coord(rank, Mesh::TP) == 0
    }

    /// The model of every tensor-parallel shard, in shard order (the one model without
    /// shards): the replicas are identical, so this process's own stand for the first's.
    ///
    /// When shards live only in other processes every process must ask at the same point:
    /// they come through the collective.
    pub(crate) fn shard_models(&self) -> Result<Vec<M>, StrategyError> {
        let Some(templates) = &self.elsewhere else {
            return (0..self.mesh.degree(Mesh::TP))
                .map(|t| self.threads.hand(self.shard_rank(t)?))
                .collect();
        };
        let all = self.threads.share(Share::Module)?;
        templates
            .iter()
            .enumerate()
            .map(|(t, template)| {
                let rank = self.mesh.rank_at(&[(Mesh::TP, t)]);
                decode_module(template.clone(), &all[rank], &self.device)
                    .map_err(StrategyError::from)
            })
            .collect()
    }

    /// This process's first rank holding shard `t` (of any replica), as an index among its
    /// ranks.
    fn shard_rank(&self, t: usize) -> Result<usize, StrategyError> {
        match self
            .local_ranks()
            .position(|rank| self.mesh.coord(rank, Mesh::TP) == t)
        {
            Some(i) => Ok(i),
            None => Err(StrategyError::ElsewhereRank {
                rank: self.mesh.rank_at(&[(Mesh::TP, t)]),
                first: self.threads.first(),
                last: self.threads.first() + self.threads.len() - 1,
            }),
        }
    }

    /// The layout of the optimizer state: one state, or one per shard.
    fn layout(&self) -> StateLayout {
        match self.mesh.degree(Mesh::TP) {
            1 => StateLayout::Replica,
            shards => StateLayout::Sharded { stages: 1, shards },
        }
    }
}

impl<B: AutodiffBackend, M: TrainModel<B>> Strategy<B, M> for Ddp<B, M> {
    fn name(&self) -> &'static str {
        "ddp"
    }

    fn world_size(&self) -> usize {
        self.mesh.size()
    }

    fn step(&mut self, batch: &[usize], lr: f64) -> Result<StepOutput, StrategyError> {
        Ok(self.step_ranks(batch, lr, false)?.0)
    }

    fn step_with_items(
        &mut self,
        batch: &[usize],
        lr: f64,
    ) -> Result<(StepOutput, Vec<<M as TrainStep>::Output>), StrategyError> {
        self.step_ranks(batch, lr, true)
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
        // Under ZeRO-3, or with the others' parameters in the compute dtype, each replica
        // holds a part: every replica joins the gather (a replica alone holds the whole and
        // hands it over).
        if self.config.replicas_hold_parts() {
            return self.threads.gather();
        }
        // Every replica is the same: this process's first stands for rank 0's.
        self.threads.hand(0)
    }

    fn stats(&self) -> Vec<RankStats> {
        self.stats.clone()
    }

    fn optimizer_state(&self) -> Result<OptimizerState, StrategyError> {
        // Replicas that split the state hold a part each: the checkpoint holds them gathered,
        // the same state plain `ddp` and `single` save and resume from.
        if let Some(merge) = &self.merge_parts {
            let parts = self.threads.share(Share::Optimizer)?;
            return Ok(OptimizerState::new(
                StateLayout::Replica,
                vec![merge(&parts)?],
            ));
        }
        // The replicas of a shard hold the same state; the first replica's stands for all.
        let shards = self.mesh.degree(Mesh::TP);
        let parts = match self.elsewhere {
            Some(_) => {
                let all = self.threads.share(Share::Optimizer)?;
                (0..shards)
                    .map(|t| all[self.mesh.rank_at(&[(Mesh::TP, t)])].clone())
                    .collect()
            }
            None => (0..shards)
                .map(|t| self.threads.save_optimizer(self.shard_rank(t)?))
                .collect::<Result<_, _>>()?,
        };
        Ok(OptimizerState::new(self.layout(), parts))
    }

    fn load_optimizer_state(&mut self, state: &OptimizerState) -> Result<(), StrategyError> {
        let parts: Vec<Arc<[u8]>> = state
            .parts(self.layout())?
            .iter()
            .map(|p| p.as_slice().into())
            .collect();
        let per_rank = self
            .local_ranks()
            .map(|rank| parts[self.mesh.coord(rank, Mesh::TP)].clone())
            .collect();
        self.threads.load_optimizer(per_rank)
    }
}
