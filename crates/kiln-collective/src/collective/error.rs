//! Errors of collective operations; each names the ranks involved and what to do.

use std::time::Duration;

use super::CollectiveOp;

/// Why a collective operation did not complete.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CollectiveError {
    /// Some ranks did not make the call within the group's timeout.
    #[error(
        "{op} #{seq} on rank {rank} timed out after {timeout:?}: rank(s) {missing:?} never \
         arrived. A rank is stuck or far slower than the others; if steps legitimately take \
         longer, raise the collective timeout"
    )]
    Timeout {
        /// The operation.
        op: CollectiveOp,
        /// Its sequence number in this group (0-based).
        seq: u64,
        /// The rank reporting.
        rank: usize,
        /// The ranks that did not arrive.
        missing: Vec<usize>,
        /// The group's timeout.
        timeout: Duration,
    },
    /// Another rank failed, so the group can no longer communicate.
    #[error("{op} #{seq} on rank {rank} aborted: rank {failed_rank} failed: {reason}")]
    PeerFailed {
        /// The operation that was aborted.
        op: CollectiveOp,
        /// Its sequence number in this group.
        seq: u64,
        /// The rank reporting.
        rank: usize,
        /// The rank that failed first.
        failed_rank: usize,
        /// What happened to it.
        reason: String,
    },
    /// Ranks made different calls at the same point of the sequence.
    #[error(
        "collective #{seq}: rank {rank} called {op} with {elements} elements but rank \
         {other_rank} called {other_op} with {other_elements}; every rank must make the same \
         calls in the same order with the same shapes"
    )]
    Mismatch {
        /// Sequence number of the call.
        seq: u64,
        /// The rank reporting.
        rank: usize,
        /// Its operation.
        op: CollectiveOp,
        /// Its element count.
        elements: usize,
        /// The rank it disagrees with.
        other_rank: usize,
        /// That rank's operation.
        other_op: CollectiveOp,
        /// That rank's element count.
        other_elements: usize,
    },
    /// The device could not finish the work queued before a hand-over.
    #[error("{op} #{seq} on rank {rank}: the device failed to synchronise: {reason}")]
    Device {
        /// The operation.
        op: CollectiveOp,
        /// Its sequence number in this group.
        seq: u64,
        /// The rank reporting.
        rank: usize,
        /// The backend's message.
        reason: String,
    },
    /// A broadcast or reduction root outside the group.
    #[error("root {root} is not a rank of this group of {world_size}: name a rank below it")]
    InvalidRoot {
        /// The requested root.
        root: usize,
        /// Size of the group.
        world_size: usize,
    },
    /// A send or receive naming a rank outside the group.
    #[error("{op}: rank {peer} is not a rank of this group of {world_size}")]
    InvalidPeer {
        /// The operation.
        op: CollectiveOp,
        /// The rank named.
        peer: usize,
        /// Size of the group.
        world_size: usize,
    },
    /// A reduce-scatter whose input does not split into equal chunks.
    #[error(
        "reduce_scatter on rank {rank}: {elements} elements do not split into {world_size} \
         equal chunks; pad the input to a multiple of the group's size"
    )]
    Indivisible {
        /// The rank reporting.
        rank: usize,
        /// The input's length.
        elements: usize,
        /// Size of the group.
        world_size: usize,
    },
}

impl CollectiveError {
    /// [`CollectiveError::InvalidRoot`] unless `root` is a rank of a group of `world_size`.
    pub(crate) fn check_root(root: usize, world_size: usize) -> Result<(), Self> {
        match root < world_size {
            true => Ok(()),
            false => Err(Self::InvalidRoot { root, world_size }),
        }
    }

    /// The rank this error blames: the one that failed, did not arrive, or disagreed.
    pub fn culprit(&self) -> Option<usize> {
        match self {
            CollectiveError::Timeout { missing, .. } => missing.first().copied(),
            CollectiveError::PeerFailed { failed_rank, .. } => Some(*failed_rank),
            CollectiveError::Mismatch { other_rank, .. } => Some(*other_rank),
            CollectiveError::InvalidRoot { .. }
            | CollectiveError::InvalidPeer { .. }
            | CollectiveError::Indivisible { .. }
            | CollectiveError::Device { .. } => None,
        }
    }
}
