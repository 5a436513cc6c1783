//! The caller's side of strategies whose ranks are worker threads: one report per rank per
//! command, collected so that a failed or wedged rank can never hang the caller.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use super::{RankError, RankFailure, StrategyError};

/// A rank's answer to one command.
pub(crate) struct Report<D> {
    /// The rank answering (an index into this process's ranks).
    pub rank: usize,
    /// What it did, or why it could not.
    pub result: Result<D, RankError>,
}

/// Waits for one report from each of `ranks` ranks. Once any rank has failed, the others get
/// at most `grace` to report (their collectives time out before that), so the caller returns
/// with every failure named.
pub(crate) fn collect<D>(
    reports: &Receiver<Report<D>>,
    ranks: usize,
    grace: Duration,
) -> Result<Vec<D>, StrategyError> {
    let mut done: Vec<Option<D>> = (0..ranks).map(|_| None).collect();
    let mut failures = Vec::new();
    let mut pending = ranks;
    while pending > 0 {
        let report = if failures.is_empty() {
            reports.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            reports.recv_timeout(grace)
        };
        match report {
            Ok(Report { rank, result }) => {
                pending -= 1;
                match result {
                    Ok(d) => done[rank] = Some(d),
                    Err(error) => failures.push(RankFailure { rank, error }),
                }
            }
            Err(reason) => {
                let error = match reason {
                    RecvTimeoutError::Timeout => RankError::Silent(grace),
                    RecvTimeoutError::Disconnected => RankError::Gone,
                };
                for (rank, _) in done.iter().enumerate().filter(|(_, d)| d.is_none()) {
                    if !failures.iter().any(|f: &RankFailure| f.rank == rank) {
                        failures.push(RankFailure {
                            rank,
                            error: error.clone(),
                        });
                    }
                }
                break;
            }
        }
    }
    if failures.is_empty() {
        Ok(done
            .into_iter()
            .map(|d| d.expect("every rank reported"))
            .collect())
    } else {
        Err(StrategyError::from_failures(failures))
    }
}
