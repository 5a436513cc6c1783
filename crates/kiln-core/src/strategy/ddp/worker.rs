//! One Ddp rank: its replica, optimizer and collective handle, driven by commands.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;

use super::DdpConfig;
use crate::collective::Collective;
use crate::data::DataSource;
use crate::grads::{BucketPlan, ParamSelection, all_reduce_gradients, broadcast_parameters};
use crate::params::checksum_tensor;
use crate::strategy::dispatch::Report;
use crate::strategy::error::{panic_message, sync_device};
use crate::strategy::micro_batch::local_gradients;
use crate::strategy::{RankError, RankStats, TrainModel};

/// What the dispatcher asks of a rank.
pub(super) enum Command<M> {
    /// Train on this global batch.
    Step { batch: Arc<[usize]>, lr: f64 },
    /// Send back the replica (rank 0's is the canonical model).
    Model(Sender<Option<M>>),
    /// Leave the loop.
    Stop,
}

/// A finished start-up or step.
pub(super) struct Done {
    pub loss_sum: f64,
    pub samples: usize,
    pub compute: Duration,
    pub communication: Duration,
    pub num_buckets: usize,
    pub stats: RankStats,
}

pub(super) struct Worker<B: AutodiffBackend, M: TrainModel<B>, O, I> {
    pub rank: usize,
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

impl<B, M, O, I> Worker<B, M, O, I>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
    O: Optimizer<M, B>,
{
    /// Starts, then serves commands until `Stop` or until the dispatcher is gone.
    pub fn run(mut self, inbox: Receiver<Command<M>>, reports: Sender<Report<Done>>) {
        let rank = self.rank;
        // A send fails only when the dispatcher is gone, and then there is nobody to serve.
        let report = |result| reports.send(Report { rank, result }).is_ok();
        let result = self.guarded(Self::start);
        let mut failed = result.is_err();
        if !report(result) {
            return;
        }
        for command in inbox {
            match command {
                Command::Step { batch, lr } => {
                    let result = if failed {
                        Err(RankError::Gone)
                    } else {
                        self.guarded(|w| w.step(&batch, lr))
                    };
                    failed |= result.is_err();
                    if !report(result) {
                        return;
                    }
                }
                Command::Model(reply) => {
                    // The caller's thread reads this replica next.
                    let model = match sync_device::<B>(&self.device) {
                        Ok(()) => self.model.clone(),
                        Err(_) => None,
                    };
                    let _ = reply.send(model);
                }
                Command::Stop => return,
            }
        }
    }

    /// Runs `f`; a panic or error poisons the group so the other ranks stop waiting at once.
    fn guarded(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<Done, RankError>,
    ) -> Result<Done, RankError> {
        let result = catch_unwind(AssertUnwindSafe(|| f(self)))
            .unwrap_or_else(|payload| Err(RankError::Panicked(panic_message(payload.as_ref()))));
        if let Err(error) = &result {
            self.collective.abort(&error.to_string());
        }
        result
    }

    /// Moves the replica to this rank's device and makes it rank 0's.
    fn start(&mut self) -> Result<Done, RankError> {
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
        Ok(self.done(0.0, 0, Duration::ZERO, start.elapsed()))
    }

    /// Shard → forward/backward → all-reduce → optimizer → replica check → stats.
    fn step(&mut self, batch: &[usize], lr: f64) -> Result<Done, RankError> {
        let shards = self.config.shard_policy.shard(batch, self.world_size)?;
        let global_samples = shards.iter().map(Vec::len).sum();
        let shard = &shards[self.rank];
        let model = self.model.take().ok_or(RankError::Gone)?;
        let plan = self.plan.as_ref().expect("a started rank has a plan");

        let local = local_gradients(
            &model,
            &self.data,
            shard,
            global_samples,
            self.config.grad_accumulation,
            &self.device,
        )?;

        let sync_start = Instant::now();
        let grads = if self.world_size > 1 {
            all_reduce_gradients(
                &model,
                local.grads,
                plan,
                self.collective.as_mut(),
                &self.device,
            )?
        } else {
            local.grads
        };
        let mut communication = sync_start.elapsed();

        let optim_start = Instant::now();
        let model = self.optim.step(lr, model, grads);
        let compute = local.compute + optim_start.elapsed();
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
        Ok(self.done(local.loss_sum, local.samples, compute, communication))
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

    fn done(
        &self,
        loss_sum: f64,
        samples: usize,
        compute: Duration,
        communication: Duration,
    ) -> Done {
        Done {
            loss_sum,
            samples,
            compute,
            communication,
            num_buckets: self.plan.as_ref().map_or(0, BucketPlan::num_buckets),
            stats: self.stats.clone(),
        }
    }
}
