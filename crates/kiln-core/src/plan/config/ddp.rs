//! The settings of `ddp`.

use std::time::Duration;

use super::ConfigError;
use crate::data::ShardPolicy;
use crate::plan::ShardState;

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
    /// Which training state the replicas split among themselves instead of each holding it
    /// whole (ZeRO's stages). Default none.
    pub shard_state: ShardState,
    /// Under ZeRO-3, the model gathers its units' parameters one unit at a time
    /// ([`gather_unit`](crate::grads::gather_unit)), each before it runs and again for its
    /// backward, instead of the strategy gathering the whole model before the step: the
    /// step's peak holds the replica's part and one unit. For a model that does (kiln-nn's
    /// LLMs with gradient checkpointing); a step whose model leaves a released parameter
    /// ungathered fails before its update. Default off.
    pub gather_units: bool,
    /// The dtype the model computes in under mixed precision (its
    /// [`MixedPrecision`](crate::optim::MixedPrecision)'s bf16 or f16), which
    /// [`fit`](crate::fit::fit) sets from the run's precision. Under ZeRO-1 and ZeRO-2 each
    /// replica then keeps the f32 parameters (the master weights) of its own part only, and
    /// holds every other trainable parameter in this dtype as its owner sends it after each
    /// step, the copy its forward reads: DeepSpeed's split of the master weights, bit for bit
    /// plain `ddp`'s training. Set it only to the model's own compute dtype. `None` (the
    /// default, and always in f32): every replica holds every parameter in f32.
    #[serde(skip)]
    pub compute_dtype: Option<burn::tensor::FloatDType>,
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
            shard_state: ShardState::None,
            gather_units: false,
            compute_dtype: None,
        }
    }
}

impl DdpConfig {
    /// Whether each replica holds a part of the trainable parameters as they train (the
    /// others released under ZeRO-3, or held in the compute dtype under ZeRO-1 and -2 with
    /// [`Self::compute_dtype`]), so that the whole model is gathered from their owners.
    pub(crate) fn replicas_hold_parts(&self) -> bool {
        let stage = self.shard_state;
        stage.splits_parameters() || (stage.splits_optimizer() && self.compute_dtype.is_some())
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.gather_units && !self.shard_state.splits_parameters() {
            return Err(ConfigError::GatherUnitsWithoutZero3(
                self.shard_state.name(),
            ));
        }
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
