//! `[checkpoint]`: how often a run saves, and how many saves it keeps.

use super::CheckpointError;

/// How often a run saves into its checkpoint folder, and how many steps the folder keeps
/// (`[checkpoint]` in a TOML config; `--save-every`, `--keep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Save every this many optimizer steps, besides the save at the end; `None` saves only
    /// at the end (and on SIGINT / SIGTERM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every: Option<usize>,
    /// The newest saves kept; older ones are removed once a newer one is in place.
    pub keep: usize,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            every: None,
            // Two, so that a save found damaged on disk still has a predecessor.
            keep: 2,
        }
    }
}

impl CheckpointConfig {
    /// Checks that both numbers are positive.
    ///
    /// # Errors
    /// [`CheckpointError::Setting`] naming the setting.
    pub fn validate(&self) -> Result<(), CheckpointError> {
        if self.every == Some(0) {
            return Err(CheckpointError::Setting(
                "checkpoint.every (--save-every) must be at least 1 step",
            ));
        }
        if self.keep == 0 {
            return Err(CheckpointError::Setting(
                "checkpoint.keep (--keep) must be at least 1: a folder that keeps no save \
                 resumes nothing",
            ));
        }
        Ok(())
    }

    /// Whether a save is due after `step` (1-based) of a run of `steps`: a multiple of
    /// [`Self::every`] before the last step (the last step's save is the run's own).
    pub fn due(&self, step: usize, steps: usize) -> bool {
        self.every
            .is_some_and(|every| step.is_multiple_of(every) && step < steps)
    }
}
