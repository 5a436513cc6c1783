//! One pipeline rank: a stage of one data-parallel replica, on its own thread.
//!
//! A step reads top-down: shard the global batch over the replicas → cut this replica's shard
//! into flushes (gradient accumulation) of `m` micro-batches → run the schedule's actions,
//! receiving activations from the previous stage and gradients from the next → the guarded
//! step: all-reduce the stage's gradients over the `dp` axis, agree on the guard's facts over
//! the world, step the optimizer.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use burn::module::{AutodiffModule, Module, ModuleMapper, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};

use super::schedule::Action;
use crate::collective::MeshCollectives;
use crate::data::{DataSource, split_even};
use crate::grads::{BucketPlan, ParamSelection, add_weighted};
use crate::model::PipelineModel;
use crate::optim::step::{Findings, Split, Sync, guarded_step};
use crate::optim::{GuardedOptimizer, decode, encode, tensor_bytes};
use crate::params::param_bytes;
use crate::plan::PipelineConfig;
use crate::stages::{Activation, recv_activation, send_activation};
use crate::strategy::agree::{Fact, agree};
use crate::strategy::exchange::{self, Share, encode_module};
use crate::strategy::handover::sync_device;
use crate::strategy::launch::ShardPlace;
use crate::strategy::ranks::{RankDone, RankWork, Shard};
use crate::strategy::{RankError, RankStats};
use crate::world::Mesh;

/// Where a stage sits: its stage, the replicas of it, and its tensor-parallel shard.
pub(super) struct Place {
    pub stage: usize,
    pub stages: usize,
    pub replicas: usize,
    pub shard: Option<ShardPlace>,
    /// The empty set of replicated parameters of an unsharded stage.
    pub none: HashSet<ParamId>,
}

impl Place {
    fn first(&self) -> bool {
        self.stage == 0
    }

    fn last(&self) -> bool {
        self.stage + 1 == self.stages
    }
}

pub(super) struct Worker<B: AutodiffBackend, M: PipelineModel<B>, O, I> {
    pub place: Place,
    pub device: B::Device,
    pub module: Option<M::Stage>,
    pub optim: O,
    pub data: DataSource<B, I, <M as burn::train::TrainStep>::Input>,
    pub groups: MeshCollectives<B::InnerBackend>,
    pub config: PipelineConfig,
    /// What the ranks check they agree on at start-up.
    pub facts: Vec<Fact>,
    pub plan: Option<BucketPlan>,
    pub stats: RankStats,
}

/// What a stage keeps of a micro-batch between its forward and its backward.
struct Held<B: AutodiffBackend, M: PipelineModel<B>> {
    kept: Kept<B, M>,
    /// Bytes of the boundary tensors held.
    bytes: u64,
}

enum Kept<B: AutodiffBackend, M: PipelineModel<B>> {
    /// The forward's autodiff graph, hanging from a copy of the stage whose parameters are
    /// fresh leaves (see [`fresh_leaves`]).
    Graph {
        stage: M::Stage,
        /// The received input as a tracked leaf (every stage but the first).
        leaf: Option<M::Activation>,
        root: Root<B, M>,
    },
    /// Only the input, the context and (last stage) the target: the backward recomputes the
    /// forward.
    Checkpoint {
        input: Input<B, M>,
        context: M::Context,
        target: Option<M::Target>,
    },
}

/// Where a held graph's backward starts.
enum Root<B: AutodiffBackend, M: PipelineModel<B>> {
    /// The last stage's loss, already weighted by the micro-batch's share of the batch.
    Loss(Tensor<B, 1>),
    /// The stage's output, to be seeded with the gradient the next stage sends back.
    Output(M::Activation),
}

/// Where a stage's input of a micro-batch comes from.
enum Input<B: AutodiffBackend, M: PipelineModel<B>> {
    /// The first stage's batch, embedded at each use.
    Batch(M::FirstInput),
    /// What the previous stage sent: the values, flat, and their shape.
    Received(Tensor<B::InnerBackend, 1>, Vec<usize>),
}

/// Time spent in one flush, split by what the rank was doing.
#[derive(Default)]
struct Times {
    compute: Duration,
    idle: Duration,
}

impl<B, M, O, I> RankWork for Worker<B, M, O, I>
where
    B: AutodiffBackend,
    M: PipelineModel<B>,
    O: GuardedOptimizer<M::Stage, B>,
{
    type Held = M::Stage;

    fn start(&mut self) -> Result<RankDone, RankError> {
        self.start_rank()
    }

    fn step(&mut self, shard: &Shard, lr: f64) -> Result<RankDone, RankError> {
        self.step_rank(shard, lr)
    }

    fn hand(&mut self) -> Option<M::Stage> {
        // The caller's thread reads this stage next.
        sync_device::<B>(&self.device).ok()?;
        self.module.clone()
    }

    fn save_optimizer(&mut self) -> Result<Vec<u8>, RankError> {
        Ok(encode(&self.optim)?)
    }

    fn load_optimizer(&mut self, bytes: &[u8]) -> Result<(), RankError> {
        self.optim = decode(&self.optim, bytes, &self.device)?;
        Ok(())
    }

    fn share(&mut self, what: Share) -> Result<Vec<Vec<u8>>, RankError> {
        let mine = match what {
            Share::Module => {
                sync_device::<B>(&self.device)?;
                encode_module::<B, M::Stage>(self.module.as_ref().ok_or(RankError::Gone)?)
            }
            Share::Optimizer => encode(&self.optim),
        };
        exchange::share(self.groups.world(), mine, &self.device)
    }

    fn abort(&mut self, reason: &str) {
        self.groups.abort(reason);
        if let Some(shard) = &self.place.shard {
            shard.group.abort(reason);
        }
    }
}

impl<B, M, O, I> Worker<B, M, O, I>
where
    B: AutodiffBackend,
    M: PipelineModel<B>,
    O: GuardedOptimizer<M::Stage, B>,
{
    /// Moves the stage to this rank's device and plans its gradient buckets.
    fn start_rank(&mut self) -> Result<RankDone, RankError> {
        agree(self.groups.world(), &self.facts, &self.device)?;
        let module = self
            .module
            .take()
            .ok_or(RankError::Gone)?
            .fork(&self.device);
        let cap = (self.config.bucket_cap_mb * 1024.0 * 1024.0) as usize;
        self.plan = Some(BucketPlan::new(&module, cap, ParamSelection::Trainable));
        let bytes = param_bytes(&module);
        self.stats.param_bytes = bytes.params;
        self.stats.grad_bytes = bytes.grads;
        self.module = Some(module);
        RankDone::new(
            (0.0, 0),
            (Duration::ZERO, Duration::ZERO),
            self.plan.as_ref(),
            &self.stats,
        )
        .shared(self.groups.world(), &self.device)
    }

    fn step_rank(&mut self, shard: &Shard, lr: f64) -> Result<RankDone, RankError> {
        let stop = shard.stop;
        let global_samples = shard.global_samples;
        let shard = &shard.indices[..];
        let shard_len = shard.len();
        let module = self.module.take().ok_or(RankError::Gone)?;

        let mut grads = GradientsParams::new();
        let (mut loss_sum, mut times) = (0.0, Times::default());
        for part in split_even(shard.len(), self.config.grad_accumulation) {
            // Every stage cuts the same way and skips the same empty micro-batches.
            let micro: Vec<&[usize]> = split_even(part.len(), self.config.micro_batches)
                .into_iter()
                .filter(|r| !r.is_empty())
                .map(|r| &shard[part.start + r.start..part.start + r.end])
                .collect();
            let (flush_grads, flush_loss) =
                self.flush(&module, &micro, global_samples, &mut times)?;
            grads = add_weighted(&module, grads, flush_grads, 1.0, &self.device);
            loss_sum += flush_loss;
        }

        let plan = self.plan.as_ref().expect("a started rank has a plan");
        let (world, dp) = self
            .groups
            .world_and_axis(Mesh::DP)
            .expect("a pipeline mesh has dp");
        let first_replica = dp.rank() == 0;
        let shard = self.place.shard.as_ref();
        let sync = Sync {
            dp: (self.place.replicas > 1).then_some((dp, plan)),
            split: Some(Split {
                world,
                stage: self.place.stage,
                shard: shard.map_or(0, |s| s.shard),
                shards: shard.map_or(1, |s| s.shards),
                first_replica,
                replicated: shard.map_or(&self.place.none, |s| &s.replicated),
            }),
            owners: None,
            device: &self.device,
        };
        let findings = Findings::Inspect {
            loss_finite: loss_sum.is_finite(),
        };
        let stepped = guarded_step(
            &mut self.optim,
            module,
            grads,
            findings,
            sync,
            lr,
            self.stats.steps + 1,
        )?;
        self.module = Some(stepped.model);
        times.compute += stepped.compute;
        if self.stats.steps == 0 {
            self.stats.optimizer_bytes = tensor_bytes(&encode(&self.optim)?);
        }

        let scored = if self.place.last() { shard_len } else { 0 };
        self.stats.steps += 1;
        self.stats.samples += scored as u64;
        self.stats.compute += times.compute;
        self.stats.idle += times.idle;
        self.stats.communication += stepped.communication;
        self.record_traffic();
        RankDone::new(
            (loss_sum, scored),
            (times.compute, stepped.communication),
            self.plan.as_ref(),
            &self.stats,
        )
        .with_guard(stepped.guard)
        .with_stop(stop)
        .shared(self.groups.world(), &self.device)
    }

    fn record_traffic(&mut self) {
        self.stats.collective = self.groups.counters();
        if let Some(shard) = &self.place.shard {
            self.stats.shard_traffic = shard.group.traffic();
        }
    }

    /// One flush of the pipeline over `micro`: the schedule's forwards and backwards, each
    /// micro-batch weighted by its share of the global batch. Returns the stage's gradients
    /// and (last stage) `Σ n_j · loss_j`.
    fn flush(
        &mut self,
        module: &M::Stage,
        micro: &[&[usize]],
        global_samples: usize,
        times: &mut Times,
    ) -> Result<(GradientsParams, f64), RankError> {
        let actions =
            self.config
                .schedule
                .actions(self.place.stage, self.place.stages, micro.len());
        let mut held: Vec<Option<Held<B, M>>> = (0..micro.len()).map(|_| None).collect();
        let (mut live, mut live_bytes) = (0usize, 0u64);
        let mut grads = GradientsParams::new();
        let mut loss_sum = 0.0;
        // Micro-batch j's share of the global batch weights its loss.
        let weight = |j: usize| micro[j].len() as f64 / global_samples as f64;
        for action in actions {
            match action {
                Action::Forward(j) => {
                    let (h, loss) = self.forward(module, micro[j], weight(j), times)?;
                    loss_sum += loss;
                    live += 1;
                    live_bytes += h.bytes;
                    held[j] = Some(h);
                    if live > self.stats.peak_live_micro_batches
                        || (live == self.stats.peak_live_micro_batches
                            && live_bytes > self.stats.peak_activation_bytes)
                    {
                        self.stats.peak_live_micro_batches = live;
                        self.stats.peak_activation_bytes = live_bytes;
                    }
                }
                Action::Backward(j) => {
                    let h = held[j]
                        .take()
                        .expect("a schedule runs forward before backward");
                    live -= 1;
                    live_bytes -= h.bytes;
                    let g = self.backward(module, h, weight(j), times)?;
                    let start = Instant::now();
                    grads = add_weighted(module, grads, g, 1.0, &self.device);
                    times.compute += start.elapsed();
                }
            }
        }
        Ok((grads, loss_sum))
    }

    /// The stage's input as a tensor: the first stage embeds its batch, the others rebuild
    /// what they received as a leaf that tracks its gradient (returned too).
    fn activate(module: &M::Stage, input: &Input<B, M>) -> (Option<M::Activation>, M::Activation) {
        match input {
            Input::Batch(first) => (None, M::embed(module, first.clone())),
            Input::Received(flat, dims) => {
                let leaf = M::Activation::leaf(flat.clone(), dims);
                (Some(leaf.clone()), leaf)
            }
        }
    }

    /// The forward of micro-batch `indices`, whose share of the global batch is `weight`:
    /// send the output on (the last stage scores it instead and returns `n · loss`), and keep
    /// the graph, or with recomputation only the input and target.
    fn forward(
        &mut self,
        module: &M::Stage,
        indices: &[usize],
        weight: f64,
        times: &mut Times,
    ) -> Result<(Held<B, M>, f64), RankError> {
        let received = if self.place.first() {
            None
        } else {
            let pp = self.groups.axis(Mesh::PP).expect("pp");
            let wait = Instant::now();
            let received =
                recv_activation::<B, M::Activation>(pp, self.place.stage - 1, &self.device)?;
            times.idle += wait.elapsed();
            Some(received)
        };
        let start = Instant::now();
        // The batch is read once per micro-batch, by the stages that need it: the first for
        // its input, the last for its target, every stage for a context that is not `()`.
        let needs_batch =
            received.is_none() || self.place.last() || std::mem::size_of::<M::Context>() > 0;
        let (first, context, target) = match needs_batch {
            true => {
                let (first, context, target) =
                    M::split_input(self.data.load(indices, &self.device)?);
                (Some(first), context, self.place.last().then_some(target))
            }
            false => (None, M::Context::default(), None),
        };
        let input = match received {
            None => Input::Batch(first.expect("the first stage reads its batch")),
            Some((flat, dims)) => Input::Received(flat, dims),
        };
        let mut bytes = match &input {
            Input::Received(_, dims) => boundary_bytes(dims),
            Input::Batch(_) => 0,
        };
        let recompute = self.config.recompute;
        // A held graph hangs from its own parameter leaves; a recomputed one is dropped here.
        let stage = if recompute {
            module.clone()
        } else {
            fresh_leaves(module)
        };
        let (leaf, x) = Self::activate(&stage, &input);
        let y = M::blocks(&stage, x, &context);
        let (root, loss) = match &target {
            Some(target) => {
                let loss = M::loss(&stage, y, target.clone());
                let value: f64 = loss.clone().into_scalar().elem();
                (
                    Root::Loss(loss.mul_scalar(weight)),
                    value * indices.len() as f64,
                )
            }
            None => {
                bytes += boundary_bytes(&y.dims());
                (Root::Output(y), 0.0)
            }
        };
        times.compute += start.elapsed();
        if let Root::Output(y) = &root {
            let pp = self.groups.axis(Mesh::PP).expect("pp");
            send_activation::<B, M::Activation>(pp, y, self.place.stage + 1)?;
        }
        let kept = if recompute {
            Kept::Checkpoint {
                input,
                context,
                target,
            }
        } else {
            Kept::Graph { stage, leaf, root }
        };
        Ok((Held { kept, bytes }, loss))
    }

    /// The backward of a held micro-batch whose share of the global batch is `weight`: from
    /// its graph (or a recomputed one), seeded with the weighted loss (last stage) or the
    /// gradient received from the next stage; the input's gradient is sent back.
    fn backward(
        &mut self,
        module: &M::Stage,
        held: Held<B, M>,
        weight: f64,
        times: &mut Times,
    ) -> Result<GradientsParams, RankError> {
        let start = Instant::now();
        let (stage, leaf, root) = match held.kept {
            Kept::Graph { stage, leaf, root } => (stage, leaf, root),
            Kept::Checkpoint {
                input,
                context,
                target,
            } => {
                let (leaf, x) = Self::activate(module, &input);
                let y = M::blocks(module, x, &context);
                let root = match target {
                    Some(target) => Root::Loss(M::loss(module, y, target).mul_scalar(weight)),
                    None => Root::Output(y),
                };
                (module.clone(), leaf, root)
            }
        };
        times.compute += start.elapsed();
        let seed = match root {
            Root::Loss(loss) => loss,
            Root::Output(y) => {
                let elements = y.dims().iter().product();
                let pp = self.groups.axis(Mesh::PP).expect("pp");
                let wait = Instant::now();
                let grad = pp.recv(self.place.stage + 1, elements, &self.device)?;
                times.idle += wait.elapsed();
                y.dot(grad)
            }
        };
        let start = Instant::now();
        let grads = seed.backward();
        let input_grad = leaf.as_ref().map(|leaf| leaf.grad_flat(&grads));
        let params = GradientsParams::from_grads(grads, &stage);
        times.compute += start.elapsed();
        if let Some(grad) = input_grad {
            let pp = self.groups.axis(Mesh::PP).expect("pp");
            pp.send(grad, self.place.stage - 1)?;
        }
        Ok(params)
    }
}

/// Bytes of one boundary activation of shape `dims`, at 4 bytes per value (the f32 it
/// travels as).
fn boundary_bytes(dims: &[usize]) -> u64 {
    4 * dims.iter().product::<usize>() as u64
}

/// A copy of `stage` whose trainable parameters are new autodiff leaves over the same values
/// (no data is copied), with the same `ParamId`s.
///
/// Each held micro-batch's graph then shares no node with another's. Burn 0.21's graph memory
/// management, run after every backward, can free nodes of other live graphs that hang from
/// the same parameter leaves, which made their later backwards lose gradients; graphs over
/// distinct leaves are independent, and `GradientsParams::from_grads` still finds each
/// gradient by `ParamId` through the copy.
fn fresh_leaves<B: AutodiffBackend, S: AutodiffModule<B>>(stage: &S) -> S {
    stage.clone().map(&mut FreshLeaves)
}

struct FreshLeaves;

impl<B: AutodiffBackend> ModuleMapper<B> for FreshLeaves {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let tensor = if tensor.is_require_grad() {
            tensor.detach().require_grad()
        } else {
            tensor
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}
