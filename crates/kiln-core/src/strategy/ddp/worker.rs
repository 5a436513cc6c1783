//! One Ddp rank: its replica, optimizer and collective handle, driven by commands.

use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;

use super::DdpConfig;
use crate::collective::Collective;
use crate::data::DataSource;
use crate::grads::{BucketPlan, ParamSelection, all_reduce_gradients, broadcast_parameters};
use crate::optim::{Guard, GuardedOptimizer, Settled, decode, encode};
use crate::params::checksum_tensor;
use crate::strategy::dispatch::{RankDone, RankWork, Shard};
use crate::strategy::handover::sync_device;
use crate::strategy::micro_batch::local_gradients;
use crate::strategy::{RankError, RankStats, TrainModel};

pub(super) struct Worker<B: AutodiffBackend, M: TrainModel<B>, O, I> {
    pub world_size: usize,
    pub device: B::Device,
    pub model: Option<M>,
    pub optim: O,
    pub data: DataSource<B, I, M::Input>,
    pub collective: Box<dyn Collective<B::InnerBackend>>,
    pub config: DdpConfig,
    pub plan: Option<BucketPlan>,
    pub stats: RankStats,
    pub steps: u64,
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

    fn save_optimizer(&mut self) -> Result<Vec<u8>, RankError> {
        Ok(encode(&self.optim)?)
    }

    fn load_optimizer(&mut self, bytes: &[u8]) -> Result<(), RankError> {
        self.optim = decode(&self.optim, bytes, &self.device)?;
        Ok(())
    }

    fn abort(&mut self, reason: &str) {
        self.collective.abort(reason);
    }
}

impl<B, M, O, I> Worker<B, M, O, I>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
    O: GuardedOptimizer<M, B>,
{
    /// Moves the replica to this rank's device and makes it rank 0's.
    fn start_rank(&mut self) -> Result<RankDone, RankError> {
        let start = Instant::now();
        let model = self.model.take().ok_or(RankError::Gone)?.fork(&self.device);
        let cap = self.config.bucket_cap_bytes();
        let model = if self.world_size > 1 {
            let every_param = BucketPlan::new(&model, cap, ParamSelection::All);
            broadcast_parameters(model, &every_param, self.collective.as_mut(), 0)?
        } else {
            model
        };
        let plan = BucketPlan::new(&model, cap, ParamSelection::Trainable);
        self.plan = Some(plan);
        self.model = Some(model);
        self.stats.communication += start.elapsed();
        self.stats.collective = self.collective.counters();
        Ok(RankDone::new(
            (0.0, 0),
            (Duration::ZERO, start.elapsed()),
            self.plan.as_ref(),
            &self.stats,
        ))
    }

    /// Forward/backward over the shard → all-reduce → optimizer → replica check → stats.
    fn step_rank(&mut self, shard: &Shard, lr: f64) -> Result<RankDone, RankError> {
        let global_samples = shard.global_samples;
        let shard_keeps_items = shard.keep_items;
        let shard = &shard.indices[..];
        let model = self.model.take().ok_or(RankError::Gone)?;
        let plan = self.plan.as_ref().expect("a started rank has a plan");

        let local = local_gradients(
            &model,
            &self.data,
            shard,
            global_samples,
            self.config.grad_accumulation,
            &self.device,
            shard_keeps_items,
        )?;

        // The guard's per-rank findings ride in the all-reduce (crate::optim's module docs).
        let guard = self.optim.guard().cloned();
        let inspect_start = Instant::now();
        let inspected = guard
            .as_ref()
            .map(|g| g.inspect::<B, M>(&model, &local.grads, local.loss_sum.is_finite()));
        let codes = inspected.as_ref().map_or_else(Vec::new, |l| {
            Guard::codes(l, self.collective.rank(), self.world_size)
        });
        let mut guard_time = inspect_start.elapsed();

        let sync_start = Instant::now();
        let (grads, codes, inspected) = if self.world_size > 1 {
            let (grads, codes) = all_reduce_gradients(
                &model,
                local.grads,
                plan,
                self.collective.as_mut(),
                &self.device,
                &codes,
            )?;
            // The summed gradients need a norm of their own.
            (grads, codes, None)
        } else {
            (local.grads, codes, inspected)
        };
        let mut communication = sync_start.elapsed();

        let settle_start = Instant::now();
        let settled = match &guard {
            Some(g) => {
                g.settle_replica::<B, M>(&model, grads, &codes, inspected, self.steps + 1)?
            }
            None => Settled::unguarded(grads),
        };
        guard_time += settle_start.elapsed();

        let optim_start = Instant::now();
        let model = match settled.grads {
            Some(grads) => self.optim.step(lr, model, grads),
            None => model,
        };
        let compute = local.compute + guard_time + optim_start.elapsed();
        self.steps += 1;

        if let Some(every) = self.config.check_replicas_every
            && self.steps.is_multiple_of(every.max(1))
        {
            let check_start = Instant::now();
            self.check_replicas(&model)?;
            communication += check_start.elapsed();
        }
        self.model = Some(model);

        self.stats.steps += 1;
        self.stats.samples += local.samples as u64;
        self.stats.compute += compute;
        self.stats.communication += communication;
        self.stats.collective = self.collective.counters();
        Ok(RankDone::new(
            (local.loss_sum, local.samples),
            (compute, communication),
            self.plan.as_ref(),
            &self.stats,
        )
        .with_guard(guard.map(|_| settled.report))
        .with_items(local.items))
    }

    /// Compares this replica's parameter checksum with rank 0's, bit for bit.
    fn check_replicas(&mut self, model: &M) -> Result<(), RankError> {
        let mine = checksum_tensor(&model.valid(), &self.device);
        let theirs = self.collective.broadcast(mine.clone(), 0)?;
        let read = |t: burn::tensor::Tensor<B::InnerBackend, 1>| -> [f32; 2] {
            let v = t
                .into_data()
                .convert::<f32>()
                .to_vec::<f32>()
                .expect("f32 checksum");
            [v[0], v[1]]
        };
        let (found, expected) = (read(mine), read(theirs));
        if found.map(f32::to_bits) != expected.map(f32::to_bits) {
            return Err(RankError::ReplicasDiverged {
                step: self.steps,
                expected,
                found,
            });
        }
        Ok(())
    }
}
