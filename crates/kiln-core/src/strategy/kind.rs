//! A strategy kind checked against the strategies' own error: the kind itself is the plan's
//! vocabulary ([`crate::plan::StrategyKind`]).

use super::ConfigError;
use crate::plan::StrategyKind;

impl StrategyKind {
    /// Refuses to span `processes` processes when this strategy cannot (one process is
    /// always fine).
    ///
    /// # Errors
    /// [`ConfigError::MultiProcess`], saying why and what to use instead.
    pub fn check_processes(self, processes: usize) -> Result<(), ConfigError> {
        match self.single_process_only() {
            Some(reason) if processes > 1 => Err(ConfigError::MultiProcess {
                strategy: self,
                processes,
                reason,
            }),
            _ => Ok(()),
        }
    }
}
