//! `Single`: plain training on one device, through the same interface as the others.

use std::time::Instant;

use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use rayon::ThreadPool;

use super::micro_batch::local_gradients;
use super::threads::rank_pool;
use super::{ConfigError, RankFailure, RankStats, StepOutput, Strategy, StrategyError, TrainModel};
use crate::data::{DataError, DataSource};

/// Configuration of [`Single`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SingleConfig {
    /// Micro-batches per global batch (1 means no accumulation).
    pub grad_accumulation: usize,
    /// Intra-op threads; `None` uses every core.
    pub threads: Option<usize>,
}

impl Default for SingleConfig {
    fn default() -> Self {
        Self {
            grad_accumulation: 1,
            threads: None,
        }
    }
}

/// Training on one device: the reference every other strategy must match.
pub struct Single<B: AutodiffBackend, M: TrainModel<B>, O, I> {
    model: Option<M>,
    optim: O,
    data: DataSource<B, I, M::Input>,
    device: B::Device,
    accumulation: usize,
    pool: ThreadPool,
    stats: RankStats,
}

impl<B, M, O, I> Single<B, M, O, I>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
    O: Optimizer<M, B>,
{
    /// Trains `model` on `device` with `optim`, reading samples from `data`.
    ///
    /// # Errors
    /// [`ConfigError`] for an impossible configuration.
    pub fn new(
        model: M,
        optim: O,
        data: DataSource<B, I, M::Input>,
        device: B::Device,
        config: SingleConfig,
    ) -> Result<Self, StrategyError> {
        if config.grad_accumulation == 0 {
            return Err(ConfigError::ZeroAccumulation.into());
        }
        let pool = rank_pool(0, 1, config.threads)?;
        tracing::info!(
            accumulation = config.grad_accumulation,
            "Applied Single: one device"
        );
        Ok(Self {
            model: Some(model.fork(&device)),
            optim,
            data,
            device,
            accumulation: config.grad_accumulation,
            pool,
            stats: RankStats::default(),
        })
    }
}

impl<B, M, O, I> Strategy<B, M> for Single<B, M, O, I>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
    O: Optimizer<M, B>,
    I: Send,
{
    fn name(&self) -> &'static str {
        "single"
    }

    fn world_size(&self) -> usize {
        1
    }

    fn step(&mut self, batch: &[usize], lr: f64) -> Result<StepOutput, StrategyError> {
        if batch.is_empty() {
            return Err(DataError::EmptyBatch.into());
        }
        let model = self
            .model
            .take()
            .ok_or(StrategyError::Broken { culprit: 0 })?;
        let (data, device, accumulation) = (&self.data, &self.device, self.accumulation);
        // Modules are `Send` but not `Sync`: the model travels into the pool and back.
        let (model, local) = self.pool.install(move || {
            let local = local_gradients(&model, data, batch, batch.len(), accumulation, device);
            (model, local)
        });
        let local = match local {
            Ok(local) => local,
            Err(error) => {
                // The model is intact: a failed forward never reached the optimizer.
                self.model = Some(model);
                return Err(StrategyError::from_failures(vec![RankFailure {
                    rank: 0,
                    error,
                }]));
            }
        };
        let start = Instant::now();
        let model = self
            .pool
            .install(|| self.optim.step(lr, model, local.grads));
        self.model = Some(model);
        let compute = local.compute + start.elapsed();

        self.stats.steps += 1;
        self.stats.samples += local.samples as u64;
        self.stats.compute += compute;
        Ok(StepOutput {
            loss: local.loss_sum / local.samples as f64,
            samples: local.samples,
            compute,
            communication: Default::default(),
        })
    }

    fn model(&self) -> Result<M, StrategyError> {
        self.model
            .clone()
            .ok_or(StrategyError::Broken { culprit: 0 })
    }

    fn stats(&self) -> Vec<RankStats> {
        vec![self.stats.clone()]
    }
}
