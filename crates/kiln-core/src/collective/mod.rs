//! Collective communication between the ranks of a run.
//!
//! A [`Collective`] is one rank's handle on its group, like an MPI communicator. Every call
//! blocks until all ranks of the group have made the same call, and every call is bounded by
//! the group's timeout: a rank that never arrives makes the others return
//! [`CollectiveError::Timeout`] naming it, and a rank that fails ([`Collective::abort`], a
//! panic, or dropping its handle) poisons the group so that every other rank returns
//! [`CollectiveError::PeerFailed`] at once instead of waiting.
//!
//! Tensors are flat (`Tensor<B, 1>`): strategies pack parameters and gradients into flat
//! buckets before communicating, which keeps the trait object-safe and the number of calls
//! small.
//!
//! Implementations: [`InProcess`] (ranks are threads of one process, any backend).

mod error;
mod in_process;

use std::fmt;

use burn::tensor::{Tensor, backend::Backend};

pub use error::CollectiveError;
pub use in_process::InProcess;

/// How an all-reduce combines the ranks' tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise mean (the sum divided by the world size).
    Mean,
    /// Element-wise maximum.
    Max,
}

/// One collective operation, as recorded in errors and checked across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectiveOp {
    /// [`Collective::all_reduce`].
    AllReduce(ReduceOp),
    /// [`Collective::broadcast`] from the given root rank.
    Broadcast {
        /// The rank whose tensor every rank receives.
        root: usize,
    },
    /// [`Collective::barrier`].
    Barrier,
}

impl fmt::Display for CollectiveOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CollectiveOp::AllReduce(op) => write!(f, "all_reduce({op:?})"),
            CollectiveOp::Broadcast { root } => write!(f, "broadcast(root {root})"),
            CollectiveOp::Barrier => f.write_str("barrier"),
        }
    }
}

/// Counters of one rank's collective traffic, for statistics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CollectiveCounters {
    /// Calls made (all operations).
    pub calls: u64,
    /// Elements sent by this rank in all-reduce and broadcast calls.
    pub elements: u64,
}

/// One rank's handle on a group of ranks.
///
/// All ranks must make the same sequence of calls with the same operations and shapes; a
/// mismatch is reported as an error on every rank rather than silently mixing data.
pub trait Collective<B: Backend>: Send {
    /// This rank, in `0..world_size`.
    fn rank(&self) -> usize;

    /// Number of ranks in the group.
    fn world_size(&self) -> usize;

    /// Combines `tensor` with the same-shaped tensors of every other rank. The result is
    /// identical on every rank (ranks are combined in rank order) and lies on the device of
    /// the input.
    ///
    /// # Errors
    /// [`CollectiveError`] when a rank fails, does not arrive in time, or passes a different
    /// operation or shape.
    fn all_reduce(
        &mut self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, CollectiveError>;

    /// Returns `root`'s tensor on every rank. Other ranks pass a tensor of the same shape (as
    /// with an MPI or NCCL buffer); its values are ignored and its device receives the result.
    ///
    /// # Errors
    /// As [`Collective::all_reduce`], and when `root` is not a rank.
    fn broadcast(
        &mut self,
        tensor: Tensor<B, 1>,
        root: usize,
    ) -> Result<Tensor<B, 1>, CollectiveError>;

    /// Waits until every rank has arrived.
    ///
    /// # Errors
    /// When a rank fails or does not arrive in time.
    fn barrier(&mut self) -> Result<(), CollectiveError>;

    /// Marks this rank as failed with `reason`: every rank blocked in, or later entering, a
    /// call of this group returns [`CollectiveError::PeerFailed`] naming this rank.
    fn abort(&mut self, reason: &str);

    /// Traffic counters of this rank so far.
    fn counters(&self) -> CollectiveCounters;
}
