//! Collective communication between the ranks of a run.
//!
//! A [`Collective`] is one rank's handle on its group, like an MPI communicator. A group
//! operation (all-reduce, reduce, broadcast, all-gather, reduce-scatter, barrier) blocks until all
//! ranks of the group have made the same call; a point-to-point [`Collective::recv`] blocks
//! until its peer's matching [`Collective::send`]. Every blocking call is bounded by the
//! group's timeout: a rank that never arrives (or never sends) makes the others return
//! [`CollectiveError::Timeout`] naming it, and a rank that fails ([`Collective::abort`], a
//! panic, or dropping its handle) poisons the group so that every other rank returns
//! [`CollectiveError::PeerFailed`] at once instead of waiting.
//!
//! Tensors are flat (`Tensor<B, 1>`): strategies pack parameters and gradients into flat
//! buckets before communicating, which keeps the trait object-safe and the number of calls
//! small.
//!
//! Implementations: [`InProcess`] (ranks are threads of one process, any backend) and, with
//! the `mpi` feature, `mpi::Mpi` (ranks in several processes, through MPI).
//! [`MeshCollectives`] gives a rank its group along each axis of a [`crate::world::Mesh`].

mod connect;
mod error;
mod in_process;
mod link;
mod mesh;
#[cfg(feature = "mpi")]
pub mod mpi;

use std::fmt;

use burn::tensor::{Tensor, backend::Backend};

pub use connect::ConnectError;
pub use error::CollectiveError;
pub use in_process::InProcess;
pub use link::Link;
pub use mesh::MeshCollectives;

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
    /// [`Collective::reduce`] to the given root rank.
    Reduce {
        /// How the tensors combine.
        op: ReduceOp,
        /// The rank that receives the result.
        root: usize,
    },
    /// [`Collective::broadcast`] from the given root rank.
    Broadcast {
        /// The rank whose tensor every rank receives.
        root: usize,
    },
    /// [`Collective::barrier`].
    Barrier,
    /// [`Collective::all_gather`].
    AllGather,
    /// [`Collective::reduce_scatter`].
    ReduceScatter(ReduceOp),
    /// [`Collective::send`] to the given rank.
    Send {
        /// The receiving rank.
        to: usize,
    },
    /// [`Collective::recv`] from the given rank.
    Recv {
        /// The sending rank.
        from: usize,
    },
}

impl fmt::Display for CollectiveOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CollectiveOp::AllReduce(op) => write!(f, "all_reduce({op:?})"),
            CollectiveOp::Reduce { op, root } => write!(f, "reduce({op:?}, root {root})"),
            CollectiveOp::Broadcast { root } => write!(f, "broadcast(root {root})"),
            CollectiveOp::Barrier => f.write_str("barrier"),
            CollectiveOp::AllGather => f.write_str("all_gather"),
            CollectiveOp::ReduceScatter(op) => write!(f, "reduce_scatter({op:?})"),
            CollectiveOp::Send { to } => write!(f, "send(to rank {to})"),
            CollectiveOp::Recv { from } => write!(f, "recv(from rank {from})"),
        }
    }
}

/// Counters of one rank's collective traffic, for statistics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CollectiveCounters {
    /// Calls made (all operations).
    pub calls: u64,
    /// Elements this rank contributed: its input to group operations, and what it sent.
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

    /// Concatenates every rank's `tensor` (`[n]`, the same `n` everywhere) in rank order:
    /// `[world_size · n]`, identical on every rank, on the device of the input.
    ///
    /// # Errors
    /// As [`Collective::all_reduce`].
    fn all_gather(&mut self, tensor: Tensor<B, 1>) -> Result<Tensor<B, 1>, CollectiveError>;

    /// Combines the ranks' `tensor`s (`[world_size · n]`) as [`Collective::all_reduce`] does
    /// and returns this rank's chunk of the result: elements `rank·n .. (rank+1)·n`.
    ///
    /// # Errors
    /// As [`Collective::all_reduce`], and [`CollectiveError::Indivisible`] when the length is
    /// not a multiple of the group's size.
    fn reduce_scatter(
        &mut self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, CollectiveError>;

    /// Combines the ranks' `tensor`s as [`Collective::all_reduce`] does (in rank order, the
    /// same bits) and returns the result on `root` alone, on the device of its input; the
    /// others get `None` and receive nothing: a gradient bucket reduced to the one rank that
    /// steps its parameters (ZeRO-2).
    ///
    /// # Errors
    /// As [`Collective::all_reduce`], and [`CollectiveError::InvalidRoot`] when `root` is not
    /// a rank.
    fn reduce(
        &mut self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
        root: usize,
    ) -> Result<Option<Tensor<B, 1>>, CollectiveError>;

    /// Sends `tensor` to rank `to`, where the matching [`Collective::recv`] takes it. Returns
    /// once the tensor is handed over, without waiting for the receiver (a buffered send):
    /// messages between two ranks arrive in the order they were sent.
    ///
    /// # Errors
    /// [`CollectiveError::InvalidPeer`] for a rank outside the group, and
    /// [`CollectiveError::PeerFailed`] when the group has failed.
    fn send(&mut self, tensor: Tensor<B, 1>, to: usize) -> Result<(), CollectiveError>;

    /// Receives the next tensor that rank `from` sent to this rank; it must have `elements`
    /// elements (the receiver knows the shape it expects, as with an MPI or NCCL buffer) and
    /// arrives on `device`.
    ///
    /// # Errors
    /// [`CollectiveError::Timeout`] naming `from` when nothing arrives in time,
    /// [`CollectiveError::Mismatch`] when the message has another length,
    /// [`CollectiveError::PeerFailed`] when the group fails while waiting, and
    /// [`CollectiveError::InvalidPeer`] for a rank outside the group.
    fn recv(
        &mut self,
        from: usize,
        elements: usize,
        device: &B::Device,
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
