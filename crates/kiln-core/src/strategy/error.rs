//! Errors of strategies: bad configuration, bad input, and failures on ranks.

use std::fmt;

use crate::collective::CollectiveError;
use crate::data::DataError;
use crate::optim::step::StepError;
use crate::optim::{NonFinite, StateError};
use crate::plan::ConfigError;

/// What went wrong on one rank.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RankError {
    /// The rank's code panicked.
    #[error("panicked: {0}")]
    Panicked(String),
    /// A collective call failed.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// The rank could not load its data.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The rank's parameters differ from rank 0's.
    #[error("replica diverged at step {step}: parameter {param} is not bit-identical to rank 0's")]
    ReplicasDiverged {
        /// Step at which the check ran.
        step: u64,
        /// The module path of the first parameter that differs.
        param: String,
    },
    /// A loss or gradient was NaN or infinite and the guard's policy is to halt. Every rank
    /// returns the same report; its `rank` is where the value first appeared.
    #[error(transparent)]
    NonFinite(#[from] NonFinite),
    /// The rank's optimizer state could not be encoded or decoded.
    #[error(transparent)]
    State(#[from] StateError),
    /// The rank's device failed to finish its queued work.
    #[error("device failed to synchronise: {0}")]
    Device(String),
    /// The rank's thread is gone.
    #[error("its worker thread is gone")]
    Gone,
    /// The rank runs another job than rank `other`: another mesh, model, dtype or setting.
    #[error(
        "its {fact} differs from rank {other}'s (this rank's: {value}); every process must run \
         the same command, config and model"
    )]
    Disagree {
        /// What differs.
        fact: String,
        /// The first rank that differs.
        other: usize,
        /// This rank's value.
        value: String,
    },
    /// Under ZeRO-3 with `gather_units`, the model ran without gathering a parameter the
    /// replica had released: the step is abandoned before its update.
    #[error(
        "parameter {param} is released between steps (ZeRO-3) but the model did not gather it \
         (kiln_core::grads::gather_unit): gather_units needs a model that gathers every unit \
         it runs, such as kiln-nn's LLMs with gradient checkpointing; leave it off otherwise"
    )]
    Ungathered {
        /// The module path of the first parameter left ungathered.
        param: String,
    },
    /// The rank did not report in time after another rank failed.
    #[error("did not report within {0:?} after another rank failed")]
    Silent(std::time::Duration),
}

impl From<StepError> for RankError {
    fn from(error: StepError) -> Self {
        match error {
            StepError::Collective(e) => Self::Collective(e),
            StepError::NonFinite(report) => Self::NonFinite(report),
        }
    }
}

impl RankError {
    /// Whether this error only reports another rank's failure.
    fn blames_other(&self, rank: usize) -> Option<usize> {
        match self {
            RankError::Collective(e) => e.culprit().filter(|&c| c != rank),
            RankError::NonFinite(report) => report.rank.filter(|&r| r != rank),
            _ => None,
        }
    }
}

/// A rank and what went wrong on it.
#[derive(Debug, Clone, PartialEq)]
pub struct RankFailure {
    /// The rank.
    pub rank: usize,
    /// The error.
    pub error: RankError,
}

impl fmt::Display for RankFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}: {}", self.rank, self.error)
    }
}

/// Why a strategy could not be built or could not step.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StrategyError {
    /// The configuration cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The batch is invalid for this strategy.
    #[error(transparent)]
    Data(#[from] DataError),
    /// An optimizer state that does not fit this strategy.
    #[error(transparent)]
    State(#[from] StateError),
    /// One or more ranks failed; `culprit` is the rank whose failure caused the others.
    #[error("rank {culprit} failed; {}", list(failures))]
    Failed {
        /// The rank that failed first.
        culprit: usize,
        /// What every failing rank reported, in rank order.
        failures: Vec<RankFailure>,
    },
    /// A previous step failed and left the ranks inconsistent.
    #[error(
        "this strategy is unusable since rank {culprit} failed; build a new one from the last \
         checkpoint"
    )]
    Broken {
        /// The rank that failed.
        culprit: usize,
    },
    /// Something only rank `rank` holds was asked of a process that does not hold it.
    #[error(
        "rank {rank} lives in another process (this one holds ranks {first}..={last}); ask the \
         process that holds it"
    )]
    ElsewhereRank {
        /// The rank asked for.
        rank: usize,
        /// This process's first rank.
        first: usize,
        /// Its last rank.
        last: usize,
    },
}

/// The failures, one per line of thought: ranks that report the same error share one entry
/// (`ranks 0, 1, 2: …`), as every rank does when the guard halts.
fn list(failures: &[RankFailure]) -> String {
    let mut groups: Vec<(Vec<usize>, &RankError)> = Vec::new();
    for f in failures {
        match groups.iter_mut().find(|(_, e)| **e == f.error) {
            Some((ranks, _)) => ranks.push(f.rank),
            None => groups.push((vec![f.rank], &f.error)),
        }
    }
    groups
        .into_iter()
        .map(|(ranks, error)| match ranks.as_slice() {
            [rank] => format!("rank {rank}: {error}"),
            _ => {
                let ranks: Vec<String> = ranks.iter().map(ToString::to_string).collect();
                format!("ranks {}: {error}", ranks.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl StrategyError {
    /// Builds [`StrategyError::Failed`] from per-rank failures, finding the culprit: the first
    /// rank whose error is its own rather than a report of another's.
    ///
    /// # Panics
    /// When `failures` is empty.
    pub fn from_failures(mut failures: Vec<RankFailure>) -> Self {
        assert!(!failures.is_empty(), "a failure needs a failing rank");
        failures.sort_by_key(|f| f.rank);
        let culprit = failures
            .iter()
            .find(|f| f.error.blames_other(f.rank).is_none())
            .map(|f| f.rank)
            .or_else(|| failures[0].error.blames_other(failures[0].rank))
            .unwrap_or(failures[0].rank);
        StrategyError::Failed { culprit, failures }
    }

    /// The rank blamed, if the error is a rank failure.
    pub fn culprit(&self) -> Option<usize> {
        match self {
            StrategyError::Failed { culprit, .. } | StrategyError::Broken { culprit } => {
                Some(*culprit)
            }
            _ => None,
        }
    }
}
