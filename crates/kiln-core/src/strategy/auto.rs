//! The settings of `auto`: the degrees a user fixes, which the planner keeps while it lays
//! out the rest.

use super::ConfigError;

/// Settings of `auto` (`[parallel.auto]`, or `--stages` and `--tp` with `--strategy auto`).
/// Each degree left unset is the planner's to choose; one that is set, every layout `auto`
/// considers keeps.
///
/// The other sections' `stages` and `tp` are what `pipeline` and `tensor` run with when they
/// are named: one file serves every strategy, so `auto` does not read them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoConfig {
    /// Pipeline stages of each replica (1: none).
    pub stages: Option<usize>,
    /// Tensor-parallel shards of every sharded layer (1: none).
    pub tp: Option<usize>,
}

impl AutoConfig {
    /// Checks the degrees.
    ///
    /// # Errors
    /// [`ConfigError::ZeroStages`] or [`ConfigError::ZeroShards`] for a degree of zero.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.stages == Some(0) {
            return Err(ConfigError::ZeroStages);
        }
        if self.tp == Some(0) {
            return Err(ConfigError::ZeroShards);
        }
        Ok(())
    }

    /// Whether it fixes no degree.
    pub fn is_free(&self) -> bool {
        self.stages.is_none() && self.tp.is_none()
    }
}
