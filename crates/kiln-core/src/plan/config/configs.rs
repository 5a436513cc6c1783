//! Every strategy's settings in one value, as a config file holds them.

use super::{
    AutoConfig, ConfigError, DataParallelConfig, DdpConfig, PipelineConfig, SingleConfig,
    TensorConfig,
};
use crate::plan::StrategyKind;

/// The settings of every strategy, so one config file serves whichever is chosen.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StrategyConfigs {
    /// Settings of [`Single`](crate::strategy::Single).
    pub single: SingleConfig,
    /// Settings of [`DataParallel`](crate::strategy::DataParallel).
    pub data_parallel: DataParallelConfig,
    /// Settings of [`Ddp`](crate::strategy::Ddp).
    pub ddp: DdpConfig,
    /// Settings of [`Pipeline`](crate::strategy::Pipeline) (and the schedule of [`Tensor`](crate::strategy::Tensor)'s stages).
    pub pipeline: PipelineConfig,
    /// Settings of [`Tensor`](crate::strategy::Tensor).
    pub tensor: TensorConfig,
    /// Settings of `auto`: the degrees it keeps.
    pub auto: AutoConfig,
}

impl StrategyConfigs {
    /// Sets the gradient accumulation of every strategy.
    pub fn set_grad_accumulation(&mut self, micro_batches: usize) {
        self.single.grad_accumulation = micro_batches;
        self.data_parallel.grad_accumulation = micro_batches;
        self.ddp.grad_accumulation = micro_batches;
        self.pipeline.grad_accumulation = micro_batches;
        self.tensor.grad_accumulation = micro_batches;
    }

    /// Sets the gradient bucket cap of every strategy that all-reduces in buckets (Ddp,
    /// Pipeline and Tensor: `single` and `data_parallel` do not bucket).
    pub fn set_bucket_cap_mb(&mut self, mib: f64) {
        self.ddp.bucket_cap_mb = mib;
        self.pipeline.bucket_cap_mb = mib;
        self.tensor.bucket_cap_mb = mib;
    }

    /// Sets the intra-op threads per rank of every strategy.
    pub fn set_threads_per_rank(&mut self, threads: usize) {
        self.single.threads_per_rank = Some(threads);
        self.data_parallel.threads_per_rank = Some(threads);
        self.ddp.threads_per_rank = Some(threads);
        self.pipeline.threads_per_rank = Some(threads);
        self.tensor.threads_per_rank = Some(threads);
    }

    /// The gradient accumulation `kind` runs with.
    pub fn grad_accumulation(&self, kind: StrategyKind) -> usize {
        match kind {
            StrategyKind::Single => self.single.grad_accumulation,
            StrategyKind::DataParallel => self.data_parallel.grad_accumulation,
            StrategyKind::Ddp | StrategyKind::Auto => self.ddp.grad_accumulation,
            StrategyKind::Pipeline => self.pipeline.grad_accumulation,
            StrategyKind::Tensor => self.tensor.grad_accumulation,
        }
    }

    /// Checks the settings of `kind` (and of the pipeline, whose schedule `tensor` uses).
    ///
    /// # Errors
    /// The first setting that cannot work.
    pub fn validate(&self, kind: StrategyKind) -> Result<(), ConfigError> {
        let accumulation = |n: usize| {
            if n == 0 {
                Err(ConfigError::ZeroAccumulation)
            } else {
                Ok(())
            }
        };
        match kind {
            StrategyKind::Single => accumulation(self.single.grad_accumulation),
            StrategyKind::DataParallel => accumulation(self.data_parallel.grad_accumulation),
            StrategyKind::Ddp => self.ddp.validate(),
            StrategyKind::Auto => {
                // Ddp's first: under `auto` its accumulation is the micro-batches too, and a
                // zero there is named as the flag or setting that gave it.
                self.ddp.validate()?;
                if let Some(blocks) = &self.pipeline.stage_blocks {
                    return Err(ConfigError::StageBlocksUnderAuto {
                        blocks: blocks.clone(),
                    });
                }
                self.auto.validate()
            }
            StrategyKind::Pipeline => self.pipeline.validate(),
            StrategyKind::Tensor => {
                self.tensor.validate()?;
                if self.tensor.stages > 1 {
                    self.tensor.pipeline(&self.pipeline).validate()?;
                }
                Ok(())
            }
        }
    }
}
