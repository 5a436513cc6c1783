//! What a run did, and what stopped it.

use burn::module::Module;
use burn::tensor::backend::Backend;

use crate::checkpoint::{CheckpointError, Saver};
use crate::optim::OptimizerState;
use crate::plan::Plan;
use crate::strategy::{ConfigError, RankReport, StrategyError};

/// What stops a [`fit`](super::fit): the strategy (a plan the model cannot run, a failed rank, a halting
/// guard) or a checkpoint that could not be saved.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    /// The strategy's error.
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    /// A checkpoint could not be saved during training (boxed: it is rare, and large).
    #[error(transparent)]
    Checkpoint(Box<CheckpointError>),
}

impl From<CheckpointError> for FitError {
    fn from(e: CheckpointError) -> Self {
        Self::Checkpoint(Box::new(e))
    }
}

impl From<ConfigError> for FitError {
    fn from(e: ConfigError) -> Self {
        Self::Strategy(e.into())
    }
}

impl From<crate::data::DataError> for FitError {
    fn from(e: crate::data::DataError) -> Self {
        Self::Strategy(e.into())
    }
}

/// What a [`fit`](super::fit) did.
#[derive(Debug, Clone)]
pub struct FitRecord {
    /// The plan that ran.
    pub plan: Plan,
    /// The loss of every step this run trained (from the resumed step on).
    pub losses: Vec<f64>,
    /// The step the run started from (0, or the resumed step).
    pub first_step: usize,
    /// The last step trained: `first_step + losses.len()`.
    pub last_step: usize,
    /// Whether [`Training::stop`](super::Training::stop) ended the run before its last step.
    pub stopped: bool,
    /// The last step [`FitHooks::save`](super::FitHooks::save) was called for, if any.
    pub saved_step: Option<usize>,
    /// Steps the NaN guard skipped (`nan_policy = "skip"`).
    pub skipped_steps: usize,
    /// The optimizer state at the end, to checkpoint next to the model, when asked for
    /// ([`Training::keep_optimizer_state`](super::Training::keep_optimizer_state)).
    pub optimizer: Option<OptimizerState>,
    /// Seconds of the loop (building the strategy excluded).
    pub wall_s: f64,
    /// Each rank's totals.
    pub ranks: Vec<RankReport>,
}

impl FitRecord {
    /// Saves the end of the run through `saver`: its last step and `model`, unless its last
    /// periodic save already was that step or the record kept no optimizer state. Returns the
    /// folder of the run's last save, if any.
    ///
    /// # Errors
    /// As [`Saver::save`].
    pub fn save_end<B: Backend, M: Module<B>>(
        &self,
        saver: &mut Saver,
        model: M,
    ) -> Result<Option<std::path::PathBuf>, CheckpointError> {
        if let Some(optimizer) = &self.optimizer
            && self.saved_step != Some(self.last_step)
        {
            saver.save::<B, M>(self.last_step, model, optimizer)?;
        }
        Ok(saver.last().map(|(_, dir)| dir.clone()))
    }

    /// Mean loss of the last `n` steps (fewer when the run was shorter); NaN without steps.
    pub fn tail_loss(&self, n: usize) -> f64 {
        let tail = &self.losses[self.losses.len().saturating_sub(n)..];
        tail.iter().sum::<f64>() / tail.len() as f64
    }

    /// Milliseconds per optimizer step.
    pub fn ms_per_step(&self) -> f64 {
        1e3 * self.wall_s / self.losses.len().max(1) as f64
    }
}
