//! The settings of `tensor`.

use std::time::Duration;

use super::{ConfigError, DdpConfig, PipelineConfig};
use crate::data::ShardPolicy;
use crate::plan::ShardState;
use crate::world::Mesh;

/// Configuration of [`Tensor`](crate::strategy::Tensor) (`[parallel.tensor]`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TensorConfig {
    /// Shards of every sharded layer: the `tp` degree.
    pub tp: usize,
    /// Pipeline stages of each shard (1: none); their schedule and micro-batches are
    /// `[parallel.pipeline]`'s.
    pub stages: usize,
    /// Micro-batches per rank and global batch (1 means no accumulation); with stages, flushes
    /// per step.
    pub grad_accumulation: usize,
    /// Largest gradient bucket of the `dp` all-reduce, in MiB.
    pub bucket_cap_mb: f64,
    /// How a global batch that does not divide by the replicas is sharded.
    pub shard_policy: ShardPolicy,
    /// Seconds any collective call may wait (the `tp` group's inside a forward too).
    pub collective_timeout_s: f64,
    /// Check every this many steps that the replicas of each shard are identical (`None`:
    /// off; without stages only).
    pub check_replicas_every: Option<u64>,
    /// Intra-op threads per rank; `None` shares the cores evenly among the ranks.
    pub threads_per_rank: Option<usize>,
}

impl Default for TensorConfig {
    fn default() -> Self {
        Self {
            tp: 2,
            stages: 1,
            grad_accumulation: 1,
            bucket_cap_mb: 25.0,
            shard_policy: ShardPolicy::Uneven,
            collective_timeout_s: 300.0,
            check_replicas_every: None,
            threads_per_rank: None,
        }
    }
}

impl TensorConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.tp == 0 {
            return Err(ConfigError::ZeroShards);
        }
        if self.stages == 0 {
            return Err(ConfigError::ZeroStages);
        }
        if self.stages > 1 && self.check_replicas_every.is_some() {
            // The pipeline's ranks have no replica check.
            return Err(ConfigError::Ignored {
                setting: "check_replicas_every",
                when: "with pipeline stages",
                fix: "leave it unset, or use stages = 1",
            });
        }
        super::error::check_shared_settings(
            self.grad_accumulation,
            self.bucket_cap_mb,
            self.collective_timeout_s,
            self.threads_per_rank,
        )
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.collective_timeout_s)
    }

    /// What the ranks run as without stages: Ddp's settings.
    pub(crate) fn ddp(&self) -> DdpConfig {
        DdpConfig {
            bucket_cap_mb: self.bucket_cap_mb,
            grad_accumulation: self.grad_accumulation,
            shard_policy: self.shard_policy,
            collective_timeout_s: self.collective_timeout_s,
            check_replicas_every: self.check_replicas_every,
            threads_per_rank: self.threads_per_rank,
            // Tensor shards' replicas hold their state whole: ZeRO over `dp` under `tensor`
            // is not built.
            shard_state: ShardState::None,
            gather_units: false,
            compute_dtype: None,
        }
    }

    /// What the ranks run as with stages: `pipeline`'s schedule and micro-batches, this
    /// config's stages and everything else.
    pub(crate) fn pipeline(&self, pipeline: &PipelineConfig) -> PipelineConfig {
        PipelineConfig {
            stages: self.stages,
            grad_accumulation: self.grad_accumulation,
            bucket_cap_mb: self.bucket_cap_mb,
            shard_policy: self.shard_policy,
            collective_timeout_s: self.collective_timeout_s,
            threads_per_rank: self.threads_per_rank,
            ..pipeline.clone()
        }
    }

    /// The `dp × pp × tp` mesh of `world_size` ranks (`pp` left out without stages).
    pub(crate) fn mesh(&self, world_size: usize) -> Result<Mesh, ConfigError> {
        let model_parallel = self.stages * self.tp;
        if !world_size.is_multiple_of(model_parallel) {
            return Err(ConfigError::WorldNotMesh {
                world: world_size,
                dp: 0,
                model_parallel,
            });
        }
        let mut axes = vec![(Mesh::DP, world_size / model_parallel)];
        if self.stages > 1 {
            axes.push((Mesh::PP, self.stages));
        }
        axes.push((Mesh::TP, self.tp));
        Ok(Mesh::new(&axes).expect("positive degrees, distinct names"))
    }
}
