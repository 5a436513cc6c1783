//! The settings of `ddp`.

use std::time::Duration;

use super::ConfigError;
use crate::data::ShardPolicy;

/// Configuration of [`Ddp`](crate::strategy::Ddp).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DdpConfig {
    /// Largest gradient bucket, in MiB: one all-reduce per bucket. Default 25, as PyTorch.
    pub bucket_cap_mb: f64,
    /// Micro-batches per rank and global batch (1 means no accumulation).
    pub grad_accumulation: usize,
    /// How a global batch that does not divide by the world size is sharded.
    pub shard_policy: ShardPolicy,
    /// Seconds any collective call may wait for the other ranks before failing.
    pub collective_timeout_s: f64,
    /// Check every this many steps that all replicas hold identical parameters (`None`: off).
    pub check_replicas_every: Option<u64>,
    /// Intra-op threads per rank; `None` shares the cores evenly among the ranks.
    pub threads_per_rank: Option<usize>,
}

impl Default for DdpConfig {
    fn default() -> Self {
        Self {
            bucket_cap_mb: 25.0,
            grad_accumulation: 1,
            shard_policy: ShardPolicy::Uneven,
            collective_timeout_s: 300.0,
            check_replicas_every: None,
            threads_per_rank: None,
        }
    }
}

impl DdpConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        super::error::check_shared_settings(
            self.grad_accumulation,
            self.bucket_cap_mb,
            self.collective_timeout_s,
            self.threads_per_rank,
        )
    }

    pub(crate) fn bucket_cap_bytes(&self) -> usize {
        (self.bucket_cap_mb * 1024.0 * 1024.0) as usize
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.collective_timeout_s)
    }
}
