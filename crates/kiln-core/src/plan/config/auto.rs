//! The settings of `auto`: the degrees a user fixes, which the planner keeps while it lays
//! out the rest.

use std::collections::BTreeMap;

use super::ConfigError;
use crate::plan::cost::{parse_bytes, parse_limits};

/// Settings of `auto` (`[parallel.auto]`, or `--stages`, `--tp`, `--micro-batches`,
/// `--recompute` and `--max-memory` with `--strategy auto`). Each setting left unset is the planner's to choose;
/// one that is set, every layout `auto` considers keeps.
///
/// The other sections' `stages`, `tp`, `micro_batches` and `recompute` are what `pipeline`
/// and `tensor` run with when they are named: one file serves every strategy, so `auto` does
/// not read them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoConfig {
    /// Pipeline stages of each replica (1: none).
    pub stages: Option<usize>,
    /// Tensor-parallel shards of every sharded layer (1: none).
    pub tp: Option<usize>,
    /// Micro-batches each replica cuts its share of a step into: the pipeline's micro-batches
    /// where the layout has stages, gradient accumulation where it has none.
    pub micro_batches: Option<usize>,
    /// Whether pipeline stages recompute their forward in the backward (activation
    /// checkpointing), in every layout with stages `auto` considers (those without have
    /// nothing to recompute).
    pub recompute: Option<bool>,
    /// What the planner may fill of some devices, by rank, as Accelerate's `max_memory`:
    /// `"0=10GiB,1=8GiB"` (each other device keeps 90 % of its memory). Not a degree: every
    /// layout is still considered, against these limits.
    pub max_memory: Option<String>,
    /// What the planner leaves free on every device without a `max_memory` limit, as a size
    /// (`"2GiB"`), instead of 10 % of it: on CUDA, of the memory free at start.
    pub memory_margin: Option<String>,
}

impl AutoConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// [`ConfigError::ZeroStages`], [`ConfigError::ZeroShards`] or
    /// [`ConfigError::ZeroMicroBatches`] for a setting of zero.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.stages == Some(0) {
            return Err(ConfigError::ZeroStages);
        }
        if self.tp == Some(0) {
            return Err(ConfigError::ZeroShards);
        }
        if self.micro_batches == Some(0) {
            return Err(ConfigError::ZeroMicroBatches);
        }
        self.limits()?;
        self.margin()?;
        Ok(())
    }

    /// [`AutoConfig::memory_margin`] in bytes (none when unset).
    ///
    /// # Errors
    /// [`ConfigError::MemoryMargin`] for text that is not a size.
    pub fn margin(&self) -> Result<Option<u64>, ConfigError> {
        self.memory_margin
            .as_deref()
            .map(|text| {
                parse_bytes(text).map_err(|why| ConfigError::MemoryMargin {
                    text: text.to_string(),
                    why,
                })
            })
            .transpose()
    }

    /// The per-device limits of [`AutoConfig::max_memory`], by rank (none when unset).
    ///
    /// # Errors
    /// [`ConfigError::MaxMemory`] for text that is not `index=size,…`.
    pub fn limits(&self) -> Result<BTreeMap<usize, u64>, ConfigError> {
        match &self.max_memory {
            None => Ok(BTreeMap::new()),
            Some(text) => parse_limits(text).map_err(|why| ConfigError::MaxMemory {
                text: text.clone(),
                why,
            }),
        }
    }

    /// Whether it fixes nothing of the layout (memory limits are not a layout).
    pub fn is_free(&self) -> bool {
        self.stages.is_none()
            && self.tp.is_none()
            && self.micro_batches.is_none()
            && self.recompute.is_none()
    }
}
