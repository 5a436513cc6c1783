//! `DataParallel`: one process, parameters and optimizer on a main device, the batch split
//! over devices each step (like PyTorch's `DataParallel`).
//!
//! Each step: replicate the model to every device → each device computes the gradients of its
//! part of the batch → gradients are summed onto the main device (in device order) → one
//! optimizer step there. The next step's replicas are forked from the updated model, which is
//! the broadcast of the new parameters.

use std::time::{Duration, Instant};

use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

use super::handover::sync_device;
use super::micro_batch::{LocalGradients, local_gradients};
use super::threads::{RankPool, rank_pool};
use super::{ConfigError, RankError, RankFailure, RankStats, StepOutput, Strategy, StrategyError};
use crate::data::{DataSource, ShardPolicy};
use crate::grads::add_weighted;
use crate::model::TrainModel;
use crate::optim::step::{Findings, Sync, guarded_step};
use crate::optim::{GuardedOptimizer, OptimizerState, StateLayout, decode, encode, total_squares};
use crate::plan::DataParallelConfig;

/// A device's gradients and output items, and the guard's finding code for them.
type DeviceResult<M> = (LocalGradients<<M as TrainStep>::Output>, Option<f32>);

/// Single-process data parallelism with a main device.
pub struct DataParallel<B: AutodiffBackend, M: TrainModel<B>, O, I> {
    model: Option<M>,
    optim: O,
    data: DataSource<B, I, M::Input>,
    devices: Vec<B::Device>,
    pools: Vec<RankPool>,
    accumulation: usize,
    stats: Vec<RankStats>,
    steps: u64,
}

impl<B, M, O, I> DataParallel<B, M, O, I>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
    O: GuardedOptimizer<M, B>,
{
    /// Trains `model` over `devices` (the first is the main device; a device may repeat, as
    /// the CPU does when several ranks share it).
    ///
    /// # Errors
    /// [`ConfigError`] for an impossible configuration; an empty device list is rejected too.
    pub fn new(
        model: M,
        optim: O,
        data: DataSource<B, I, M::Input>,
        devices: Vec<B::Device>,
        config: DataParallelConfig,
    ) -> Result<Self, StrategyError> {
        if devices.is_empty() {
            return Err(ConfigError::NoDevices.into());
        }
        if config.grad_accumulation == 0 {
            return Err(ConfigError::ZeroAccumulation.into());
        }
        let pools = (0..devices.len())
            .map(|rank| rank_pool(rank, devices.len(), config.threads_per_rank))
            .collect::<Result<Vec<_>, _>>()?;
        tracing::debug!(
            devices = devices.len(),
            accumulation = config.grad_accumulation,
            "Applied DataParallel: {} devices, optimizer on the main device",
            devices.len()
        );
        let stats = (0..devices.len())
            .map(|rank| {
                crate::memory::restart_rank_peak(rank);
                RankStats {
                    rank,
                    ..Default::default()
                }
            })
            .collect();
        // Forking materialises lazily initialised parameters; replica threads read them next.
        let model = model.fork(&devices[0]);
        sync_device::<B>(&devices[0])
            .map_err(|error| StrategyError::from_failures(vec![RankFailure { rank: 0, error }]))?;
        Ok(Self {
            model: Some(model),
            optim,
            data,
            devices,
            pools,
            accumulation: config.grad_accumulation,
            stats,
            steps: 0,
        })
    }

    /// Forward and backward of every device's shard, in parallel.
    fn compute(
        &self,
        model: &M,
        shards: &[Vec<usize>],
        global_samples: usize,
        keep_items: bool,
    ) -> Vec<Result<DeviceResult<M>, RankError>> {
        let guard = self.optim.guard();
        std::thread::scope(|scope| {
            let jobs: Vec<_> = shards
                .iter()
                .enumerate()
                .map(|(rank, shard)| {
                    let device = &self.devices[rank];
                    let replica = model.clone();
                    let (pool, data, accumulation) =
                        (&self.pools[rank], &self.data, self.accumulation);
                    scope.spawn(move || {
                        pool.install(move || {
                            // The main device computes on the model itself, the others on a
                            // detached copy, made here so a cross-device copy is queued by the
                            // thread that reads it.
                            let replica = if rank == 0 {
                                replica
                            } else {
                                replica.fork(device)
                            };
                            let local = local_gradients(
                                &replica,
                                data,
                                shard,
                                global_samples,
                                accumulation,
                                device,
                                keep_items,
                            )?;
                            // Each device's findings, so a NaN names the device it came from.
                            let code = guard.map(|g| {
                                let squares = total_squares::<B, M>(&replica, &local.grads, None);
                                g.inspect::<B, M>(
                                    &replica,
                                    &local.grads,
                                    local.loss_sum.is_finite(),
                                    squares,
                                )
                                .code
                            });
                            // Pool 0's thread reduces these gradients next.
                            sync_device::<B>(device)?;
                            // Watched from the thread that queues the replica's work, where
                            // its device has memory of its own.
                            let _ = crate::memory::device::rank_peak(rank, device);
                            Ok((local, code))
                        })
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|job| job.join().unwrap_or(Err(RankError::Gone)))
                .collect()
        })
    }

    /// One step over every device; with `keep_items`, each device's output items too.
    fn step_devices(
        &mut self,
        batch: &[usize],
        lr: f64,
        keep_items: bool,
    ) -> Result<(StepOutput, Vec<<M as TrainStep>::Output>), StrategyError> {
        let shards = ShardPolicy::Uneven.shard(batch, self.devices.len())?;
        let model = self
            .model
            .take()
            .ok_or(StrategyError::Broken { culprit: 0 })?;
        let results = self.compute(&model, &shards, batch.len(), keep_items);
        let mut failures = Vec::new();
        let mut locals = Vec::new();
        let mut codes = Vec::new();
        for (rank, result) in results.into_iter().enumerate() {
            match result {
                Ok((local, code)) => {
                    locals.push(local);
                    codes.push(code.unwrap_or(0.0));
                }
                Err(error) => failures.push(RankFailure { rank, error }),
            }
        }
        if !failures.is_empty() {
            self.model = Some(model);
            return Err(StrategyError::from_failures(failures));
        }

        // Reduce onto the main device in device order, so the sum is deterministic, then step
        // the optimizer: both on pool 0's thread, which must also be the one to synchronise
        // (devices may queue work per thread) before the next replicas read the parameters.
        let main = &self.devices[0];
        let (mut loss_sum, mut compute) = (0.0, Duration::ZERO);
        for (stats, local) in self.stats.iter_mut().zip(&locals) {
            loss_sum += local.loss_sum;
            compute = local.compute.max(compute);
            stats.steps += 1;
            stats.samples += local.samples as u64;
            stats.compute += local.compute;
            stats.peak_bytes = crate::memory::device::watched_peak(stats.rank)
                .or_else(|| crate::memory::rank(stats.rank).map(|c| c.peak));
        }
        let items = locals
            .iter_mut()
            .flat_map(|local| std::mem::take(&mut local.items))
            .collect();
        let optim = &mut self.optim;
        let step = self.steps + 1;
        let (result, communication, optim_time) = self.pools[0].install(move || {
            let reduce_start = Instant::now();
            let mut grads = GradientsParams::new();
            for local in locals {
                grads = add_weighted(&model, grads, local.grads, 1.0, main);
            }
            let communication = reduce_start.elapsed();
            let sync = Sync {
                dp: None,
                split: None,
                owners: None,
                device: main,
            };
            let findings = Findings::Given(codes);
            let result = guarded_step(optim, model, grads, findings, sync, lr, step)
                .map_err(RankError::from)
                .and_then(|stepped| sync_device::<B>(main).map(|()| stepped));
            let optim_time = result.as_ref().map_or(Duration::ZERO, |s| s.compute);
            (
                result.map(|s| (s.model, s.guard)),
                communication,
                optim_time,
            )
        });
        // A halt leaves the model with the failed step: the strategy is broken, as after any
        // rank failure.
        let (model, guard) = result
            .map_err(|error| StrategyError::from_failures(vec![RankFailure { rank: 0, error }]))?;
        self.model = Some(model);
        self.steps += 1;
        self.stats[0].communication += communication;
        let compute = compute + optim_time;
        let output = StepOutput {
            loss: loss_sum / batch.len() as f64,
            samples: batch.len(),
            compute,
            communication,
            guard,
            stop: false,
        };
        Ok((output, items))
    }
}

impl<B, M, O, I> Strategy<B, M> for DataParallel<B, M, O, I>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
    O: GuardedOptimizer<M, B>,
    I: Send,
{
    fn name(&self) -> &'static str {
        "data_parallel"
    }

    fn world_size(&self) -> usize {
        self.devices.len()
    }

    fn step(&mut self, batch: &[usize], lr: f64) -> Result<StepOutput, StrategyError> {
        Ok(self.step_devices(batch, lr, false)?.0)
    }

    fn step_with_items(
        &mut self,
        batch: &[usize],
        lr: f64,
    ) -> Result<(StepOutput, Vec<<M as TrainStep>::Output>), StrategyError> {
        self.step_devices(batch, lr, true)
    }

    fn model(&self) -> Result<M, StrategyError> {
        self.model
            .clone()
            .ok_or(StrategyError::Broken { culprit: 0 })
    }

    fn stats(&self) -> Vec<RankStats> {
        self.stats.clone()
    }

    fn optimizer_state(&self) -> Result<OptimizerState, StrategyError> {
        let bytes = encode(&self.optim)?;
        Ok(OptimizerState::new(StateLayout::Replica, vec![bytes]))
    }

    fn load_optimizer_state(&mut self, state: &OptimizerState) -> Result<(), StrategyError> {
        let part = &state.parts(StateLayout::Replica)?[0];
        // Decoded on pool 0's thread, which steps the optimizer on the main device.
        let main = &self.devices[0];
        let optim = self.optim.clone();
        self.optim = self.pools[0].install(move || decode(&optim, part, main))?;
        Ok(())
    }
}
