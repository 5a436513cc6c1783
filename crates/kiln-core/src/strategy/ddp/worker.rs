//! One Ddp rank: its replica (or tensor-parallel shard), optimizer and collectives, driven by
//! commands.

use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::collective::MeshCollectives;
use crate::data::DataSource;
use crate::grads::{BucketPlan, Owners, ParamSelection, broadcast_parameters, lend};
use crate::model::TrainModel;
use crate::optim::step::{Findings, Split, Sync, guarded_step};
use crate::optim::{GuardedOptimizer, decode, encode, tensor_bytes};
use crate::params::{
    fingerprints_except, floats_to_hashes, hashes_to_floats, param_bytes, param_path, signature,
};
use crate::plan::{DdpConfig, ShardState};
use crate::strategy::agree::{Fact, agree, dtype_fact};
use crate::strategy::exchange::{self, Share, encode_module};
use crate::strategy::handover::sync_device;
use crate::strategy::launch::ShardPlace;
use crate::strategy::micro_batch::local_gradients;
use crate::strategy::ranks::{RankDone, RankWork, Shard};
use crate::strategy::{RankError, RankStats};
use crate::world::Mesh;

pub(super) struct Worker<B: AutodiffBackend, M: TrainModel<B>, O, I> {
    /// Replicas: ranks of the `dp` axis.
    pub replicas: usize,
    pub device: B::Device,
    pub model: Option<M>,
    pub optim: O,
    pub data: DataSource<B, I, M::Input>,
    /// The world and the `dp` axis.
    pub groups: MeshCollectives<B::InnerBackend>,
    pub shard: Option<ShardPlace>,
    pub config: DdpConfig,
    pub plan: Option<BucketPlan>,
    /// Which replica steps which parameters (and, under ZeRO-2, receives their reduced
    /// gradients), under a split optimizer state with more than one replica; set at start.
    /// Shared with the units' gathers under ZeRO-3 (`gather_units`).
    pub owners: Option<Arc<Owners>>,
    pub stats: RankStats,
    pub steps: u64,
    /// What the ranks check they agree on at start-up (with the model and the settings).
    pub facts: Vec<Fact>,
}

impl<B, M, O, I> RankWork for Worker<B, M, O, I>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
    O: GuardedOptimizer<M, B>,
{
    type Held = M;

    fn start(&mut self) -> Result<RankDone, RankError> {
        self.start_rank()
    }

    fn step(&mut self, shard: &Shard, lr: f64) -> Result<RankDone, RankError> {
        self.step_rank(shard, lr)
    }

    fn hand(&mut self) -> Option<M> {
        // The caller's thread reads this replica next.
        sync_device::<B>(&self.device).ok()?;
        self.model.clone()
    }

    fn gather(&mut self) -> Result<M, RankError> {
        let model = self.gathered()?;
        sync_device::<B>(&self.device)?;
        Ok(model)
    }

    fn save_optimizer(&mut self) -> Result<Vec<u8>, RankError> {
        Ok(encode(&self.optim)?)
    }

    fn load_optimizer(&mut self, bytes: &[u8]) -> Result<(), RankError> {
        let whole = decode(&self.optim, bytes, &self.device)?;
        // A state is saved whole; a replica that owns a part keeps only that part.
        self.optim = match &self.owners {
            Some(owners) => whole
                .retain_state(owners.mine())
                .expect("Ddp checks at start that the optimizer splits its state"),
            None => whole,
        };
        Ok(())
    }

    fn share(&mut self, what: Share) -> Result<Vec<Vec<u8>>, RankError> {
        let mine = match what {
            Share::Module => {
                let model = self.gathered()?;
                sync_device::<B>(&self.device)?;
                encode_module::<B, M>(&model)
            }
            Share::Optimizer => encode(&self.optim),
        };
        exchange::share(self.groups.world(), mine, &self.device)
    }

    fn abort(&mut self, reason: &str) {
        self.groups.abort(reason);
        if let Some(shard) = &self.shard {
            shard.group.abort(reason);
        }
    }
}

impl<B, M, O, I> Worker<B, M, O, I>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
    O: GuardedOptimizer<M, B>,
{
    /// Moves the replica to this rank's device and makes it the first replica's.
    fn start_rank(&mut self) -> Result<RankDone, RankError> {
        let start = Instant::now();
        let model = self.model.take().ok_or(RankError::Gone)?.fork(&self.device);
        let mut facts = std::mem::take(&mut self.facts);
        facts.push(("model layout".into(), format!("{:?}", signature(&model))));
        facts.push(dtype_fact::<B>());
        facts.push(("ddp settings".into(), format!("{:?}", self.config)));
        agree(self.groups.world(), &facts, &self.device)?;
        let cap = self.config.bucket_cap_bytes();
        let mut model = if self.replicas > 1 {
            let every_param = BucketPlan::new(&model, cap, ParamSelection::All);
            let dp = self.groups.axis(Mesh::DP).expect("a Ddp mesh has dp");
            broadcast_parameters(model, &every_param, dp, 0)?
        } else {
            model
        };
        let bytes = param_bytes(&model);
        self.stats.param_bytes = bytes.params;
        self.stats.grad_bytes = bytes.grads;
        let plan = BucketPlan::new(&model, cap, ParamSelection::Trainable);
        let stage = self.config.shard_state;
        if stage.splits_optimizer() && self.replicas > 1 {
            let dp = self.groups.axis(Mesh::DP).expect("a Ddp mesh has dp");
            let owners = Owners::new(&plan, self.replicas, dp.rank(), cap)
                .reducing_gradients(stage.splits_gradients())
                .releasing_parameters(stage.splits_parameters())
                .holding_others_in(self.config.compute_dtype);
            if dp.rank() == 0 {
                // Under mixed precision the owners send the copies the forward reads, and
                // keep the f32 master weights of their own parameters alone.
                let sent = match owners.others_dtype() {
                    Some(dtype) => &format!(
                        "broadcasts them in {dtype:?} after the step (the f32 master weights \
                         split too)"
                    ),
                    None => "broadcasts them after the step",
                };
                let (what, when) = match stage {
                    ShardState::Optimizer => ("optimizer state", sent),
                    ShardState::Gradients => ("optimizer state and reduced gradients", sent),
                    _ if self.config.gather_units => (
                        "optimizer state, reduced gradients and parameters",
                        "the others gather them one unit at a time, as the model runs it",
                    ),
                    _ => (
                        "optimizer state, reduced gradients and parameters",
                        "the others gather them before each forward",
                    ),
                };
                tracing::info!(
                    "ddp: {what} split over {} replicas (ZeRO-{}): each keeps those of its own \
                     parameters, {:?} elements, steps them, and {when}",
                    self.replicas,
                    stage.zero_stage(),
                    owners.elements()
                );
            }
            if owners.reduces_gradients() {
                // The reduced gradients this replica holds for the optimizer: its own part.
                self.stats.grad_bytes = owners.my_grad_bytes() as u64;
            }
            if owners.releases_parameters() {
                model = owners.release(model);
            }
            model = owners.lower(model);
            // What the replica holds between steps: its own part of the trainable parameters
            // in f32, the others released or in the compute dtype, the frozen ones whole.
            self.stats.param_bytes -= owners.freed_bytes() as u64;
            self.owners = Some(Arc::new(owners));
        }
        self.plan = Some(plan);
        self.model = Some(model);
        self.stats.communication += start.elapsed();
        self.record_traffic();
        RankDone::new(
            (0.0, 0),
            (Duration::ZERO, start.elapsed()),
            self.plan.as_ref(),
            &self.stats,
        )
        .shared(self.groups.world(), &self.device)
    }

    /// Forward/backward over the shard → the guarded step (all-reduce over `dp`) → replica
    /// check → stats.
    fn step_rank(&mut self, shard: &Shard, lr: f64) -> Result<RankDone, RankError> {
        // Under ZeRO-3 with `gather_units`, the owners the model's units gather from.
        let by_units = (self.releasing().cloned()).filter(|_| self.config.gather_units);
        let gather_start = Instant::now();
        let model = match (&by_units, self.releasing()) {
            // The model gathers each unit as it runs it.
            (Some(_), _) | (None, None) => self.model.clone().ok_or(RankError::Gone)?,
            (None, Some(_)) => self.gathered()?,
        };
        // A released part's placeholders are dropped with the old handle.
        self.model = None;
        let gather = gather_start.elapsed();
        let local = |model: &M| {
            local_gradients(
                model,
                &self.data,
                &shard.indices,
                shard.global_samples,
                self.config.grad_accumulation,
                &self.device,
                shard.keep_items,
            )
        };
        let local = match by_units {
            Some(owners) => step_by_units::<B, M, _>(&mut self.groups, owners, &model, local)?,
            None => local(&model)?,
        };
        let plan = self.plan.as_ref().expect("a started rank has a plan");
        let (world, dp) = self
            .groups
            .world_and_axis(Mesh::DP)
            .expect("a Ddp mesh has dp");
        let replica = dp.rank();
        let sync = Sync {
            dp: (self.replicas > 1).then_some((dp, plan)),
            split: self.shard.as_ref().map(|s| Split {
                world,
                stage: 0,
                shard: s.shard,
                shards: s.shards,
                first_replica: replica == 0,
                replicated: &s.replicated,
            }),
            owners: self.owners.as_deref(),
            device: &self.device,
        };
        let findings = Findings::Inspect {
            loss_finite: local.loss_sum.is_finite(),
        };
        let stepped = guarded_step(
            &mut self.optim,
            model,
            local.grads,
            findings,
            sync,
            lr,
            self.steps + 1,
        )?;
        let mut communication = stepped.communication + gather;
        self.steps += 1;
        if self.steps == 1 {
            self.stats.optimizer_bytes = tensor_bytes(&encode(&self.optim)?);
        }
        if let Some(every) = self.config.check_replicas_every
            && self.steps.is_multiple_of(every.max(1))
        {
            let check_start = Instant::now();
            self.check_replicas(&stepped.model)?;
            communication += check_start.elapsed();
        }
        let model = match self.releasing() {
            Some(owners) => owners.release(stepped.model),
            None => stepped.model,
        };
        self.model = Some(model);

        let compute = local.compute + stepped.compute;
        self.stats.steps += 1;
        self.stats.samples += local.samples as u64;
        self.stats.compute += compute;
        self.stats.communication += communication;
        self.record_traffic();
        RankDone::new(
            (local.loss_sum, local.samples),
            (compute, communication),
            self.plan.as_ref(),
            &self.stats,
        )
        .with_guard(stepped.guard)
        .with_items(local.items)
        .with_stop(shard.stop)
        .shared(self.groups.world(), &self.device)
    }

    /// The owners, when the replica holds its own parameters alone between steps (ZeRO-3).
    fn releasing(&self) -> Option<&Arc<Owners>> {
        self.owners.as_ref().filter(|o| o.releases_parameters())
    }

    /// The owners, when the replica holds a part of the trainable parameters as they train
    /// (released under ZeRO-3, or the others' in the compute dtype).
    fn holding_part(&self) -> Option<&Arc<Owners>> {
        self.owners
            .as_ref()
            .filter(|_| self.config.replicas_hold_parts())
    }

    /// The model whole, as it trains: this replica's own, or its part with every other
    /// parameter gathered from its owner (every replica of `dp` makes this call together).
    fn gathered(&mut self) -> Result<M, RankError> {
        let model = self.model.clone().ok_or(RankError::Gone)?;
        match self.holding_part().cloned() {
            Some(owners) => {
                let dp = self.groups.axis(Mesh::DP).expect("a Ddp mesh has dp");
                Ok(owners.broadcast::<B, M>(model, dp)?)
            }
            None => Ok(model),
        }
    }

    fn record_traffic(&mut self) {
        self.stats.collective = self.groups.counters();
        if let Some(shard) = &self.shard {
            self.stats.shard_traffic = shard.group.traffic();
        }
    }

    /// Compares this replica's parameters with the first replica's, bit for bit: every
    /// parameter's fingerprint (its exact bits, hashed on the host) against the first
    /// replica's, the first that differs named. Where a replica holds a part (ZeRO-3, or the
    /// others in the compute dtype) a trainable parameter has one f32 holder, and the owners'
    /// broadcasts give every replica its bits: the frozen ones, which every replica holds
    /// alike, are compared.
    fn check_replicas(&mut self, model: &M) -> Result<(), RankError> {
        let skip = match (self.holding_part(), &self.plan) {
            (Some(_), Some(plan)) => plan.index.keys().copied().collect(),
            _ => Default::default(),
        };
        let mine = fingerprints_except::<B, M>(model, skip);
        let floats = hashes_to_floats(mine.iter().map(|f| f.hash));
        let floats = Tensor::<B::InnerBackend, 1>::from_floats(floats.as_slice(), &self.device);
        let dp = self.groups.axis(Mesh::DP).expect("a Ddp mesh has dp");
        let theirs = dp
            .broadcast(floats, 0)?
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .expect("f32 fingerprints");
        let theirs = floats_to_hashes(&theirs);
        match mine.iter().zip(theirs).find(|(m, t)| m.hash != *t) {
            Some((differs, _)) => Err(RankError::ReplicasDiverged {
                step: self.steps,
                param: differs.path.clone(),
            }),
            None => Ok(()),
        }
    }
}

/// `step` on `model`, whose units gather their parameters from their owners as they run
/// (`gather_units`), the replica's `dp` group lent to them; fails if a released parameter
/// was left ungathered.
fn step_by_units<B: AutodiffBackend, M: TrainModel<B>, R>(
    groups: &mut MeshCollectives<B::InnerBackend>,
    owners: Arc<Owners>,
    model: &M,
    step: impl FnOnce(&M) -> Result<R, RankError>,
) -> Result<R, RankError> {
    let group = groups.take_axis(Mesh::DP).expect("a Ddp mesh has dp");
    let returned = lend::<B, _>(owners.clone(), group, || step(model));
    // The group back before anything else, so that a failure aborts it too.
    groups.push_axis(Mesh::DP, returned.group);
    if let Some(error) = returned.error {
        return Err(error.into());
    }
    let result = match returned.result {
        Ok(result) => result?,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    let ungathered = (owners.parts().iter())
        .flat_map(|part| part.slots.iter().map(|slot| slot.id))
        .find(|id| owners.is_others(*id) && !returned.gathered.contains(id));
    match ungathered {
        Some(id) => Err(RankError::Ungathered {
            param: param_path::<B, M>(model, id),
        }),
        None => Ok(result),
    }
}
