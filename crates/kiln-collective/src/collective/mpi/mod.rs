//! The MPI collective: ranks in several processes, on one machine or many, through the
//! system's MPI (Open MPI) by way of rsmpi. Built with the `mpi` feature.
//!
//! A process holds one rank per local device (threads, as in one process). Every group is
//! therefore *hierarchical*: a rank's group is split into this process's members, which
//! meet in an [`InProcess`] group, and the group's processes, which meet in an MPI
//! communicator. A group operation combines in the process first, the process's first member
//! (its *leader*) runs one MPI call across the processes on a host copy in the tensor's own
//! dtype (reductions of half-precision tensors in f32, which MPI can sum), and the result is
//! broadcast back in the process. One gradient bucket is one MPI call, whatever the number of
//! ranks per process. Sends between processes go straight from the sending rank's thread.
//!
//! Every wait is bounded by the group's timeout ([`runtime`] says how without MPI timeouts),
//! a failure is told to every process, and a timed-out rank names the processes' ranks that
//! never arrived.

mod buffers;
mod connect;
mod group;
mod meet;
mod runtime;
mod staging;

use std::sync::Arc;
use std::time::Duration;

use burn::tensor::{Tensor, backend::Backend};

use super::{Collective, CollectiveCounters, CollectiveError, CollectiveOp, InProcess, ReduceOp};
pub use connect::{axis_collectives, mesh_collectives};
use group::{Combine, ProcessGroup};
pub use meet::Processes;
pub use runtime::finalize;
use runtime::{Failure, runtime};

/// How much longer than the group's timeout the members of one process wait for their leader:
/// the leader's own timeout, plus the time it takes to ask the other processes who is missing,
/// must end first so that its error (naming the missing ranks) is the one reported.
const LEADER_GRACE: Duration = Duration::from_secs(5);

/// One rank's handle on a group whose ranks live in several processes.
pub struct Mpi<B: Backend> {
    /// This rank in the group, and the group's size.
    rank: usize,
    size: usize,
    /// The world's rank of each of the group's ranks.
    members: Vec<usize>,
    /// Index (in `procs.processes`) of the process holding each of the group's ranks.
    process_of: Vec<usize>,
    /// The group rank of this process's first member.
    first_local: usize,
    /// This process's members of the group.
    local: InProcess<B>,
    /// The group's processes; `None` when all of them are this process.
    procs: Option<Arc<ProcessGroup>>,
    /// Calls so far.
    seq: u64,
    counters: CollectiveCounters,
}

impl<B: Backend> Mpi<B> {
    /// Whether this rank runs the group's MPI calls for its process.
    fn leader(&self) -> Option<&ProcessGroup> {
        (self.rank == self.first_local)
            .then_some(self.procs.as_deref())
            .flatten()
    }

    fn next(&mut self, elements: usize) -> u64 {
        let seq = self.seq;
        self.seq += 1;
        self.counters.calls += 1;
        self.counters.elements += elements as u64;
        seq
    }

    /// The error for an MPI wait that failed, after telling this process's other members.
    fn fail(&mut self, op: CollectiveOp, seq: u64, failure: Failure) -> CollectiveError {
        let me = self.members[self.rank];
        let error = match failure {
            Failure::Aborted { rank, reason } => CollectiveError::PeerFailed {
                op,
                seq,
                rank: me,
                failed_rank: rank,
                reason,
            },
            Failure::Timeout { missing } => {
                let procs = self.procs.as_deref().expect("a wait across processes");
                let missing = self
                    .process_of
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| missing.contains(&procs.processes[**p]))
                    .map(|(r, _)| self.members[r])
                    .collect();
                CollectiveError::Timeout {
                    op,
                    seq,
                    rank: me,
                    missing,
                    timeout: procs.timeout,
                }
            }
        };
        // The process's other members are waiting for this leader: they fail too, blaming
        // the rank that caused it.
        let culprit = error.culprit().unwrap_or(me);
        let reason = match &error {
            CollectiveError::PeerFailed { reason, .. } => reason.clone(),
            other => other.to_string(),
        };
        self.local.fail_for(culprit, reason);
        error
    }

    /// The local group rank of the group's rank `rank` (which must be in this process).
    fn local_rank(&self, rank: usize) -> usize {
        rank - self.first_local
    }

    fn check_peer(&self, op: CollectiveOp, peer: usize) -> Result<(), CollectiveError> {
        if peer >= self.size {
            return Err(CollectiveError::InvalidPeer {
                op,
                peer,
                world_size: self.size,
            });
        }
        Ok(())
    }

    /// Tag of the messages from group rank `from` to `to`: MPI keeps the messages of one tag
    /// between two processes in order, as the trait promises per pair of ranks.
    fn tag(&self, from: usize, to: usize) -> i32 {
        (from * self.size + to) as i32
    }
}

impl<B: Backend> Collective<B> for Mpi<B> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce(
        &mut self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, CollectiveError> {
        let seq = self.next(tensor.dims()[0]);
        let (local_op, combine) = match op {
            ReduceOp::Sum | ReduceOp::Mean => (ReduceOp::Sum, Combine::Sum),
            ReduceOp::Max => (ReduceOp::Max, Combine::Max),
        };
        let partial = self.local.all_reduce(tensor, local_op)?;
        let combined = match self.leader() {
            Some(procs) => {
                // `into_data`: a tensor the process alone holds reaches MPI without a copy.
                let device = partial.device();
                match staging::all_reduce(procs, partial.into_data(), combine, seq) {
                    Ok(data) => Tensor::from_data(data, &device),
                    Err(failure) => {
                        return Err(self.fail(CollectiveOp::AllReduce(op), seq, failure));
                    }
                }
            }
            None => partial,
        };
        let out = if self.procs.is_some() {
            self.local.broadcast(combined, 0)?
        } else {
            combined
        };
        Ok(match op {
            ReduceOp::Mean => out.div_scalar(self.size as f64),
            _ => out,
        })
    }

    fn reduce(
        &mut self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
        root: usize,
    ) -> Result<Option<Tensor<B, 1>>, CollectiveError> {
        CollectiveError::check_root(root, self.size)?;
        let Some(procs) = self.procs.clone() else {
            self.next(tensor.dims()[0]);
            let root = self.local_rank(root);
            return self.local.reduce(tensor, op, root);
        };
        let (elements, device) = (tensor.dims()[0], tensor.device());
        let seq = self.next(elements);
        let (local_op, combine) = match op {
            ReduceOp::Sum | ReduceOp::Mean => (ReduceOp::Sum, Combine::Sum),
            ReduceOp::Max => (ReduceOp::Max, Combine::Max),
        };
        // This process's sum at its leader, then the processes' sum at the root's process.
        let partial = self.local.reduce(tensor, local_op, 0)?;
        let root_process = self.process_of[root];
        let mut total = match (self.leader(), partial) {
            (Some(procs), Some(partial)) => {
                match staging::reduce(procs, partial.into_data(), combine, root_process, seq) {
                    Ok(data) => data.map(|data| Tensor::from_data(data, &device)),
                    Err(failure) => {
                        let op = CollectiveOp::Reduce { op, root };
                        return Err(self.fail(op, seq, failure));
                    }
                }
            }
            _ => None,
        };
        // In the root's process, its leader hands the sum to the root.
        if root_process == procs.index && root != self.first_local {
            if self.rank == self.first_local {
                let sum = total
                    .take()
                    .expect("the root process's leader holds the sum");
                self.local.send(sum, self.local_rank(root))?;
            } else if self.rank == root {
                total = Some(self.local.recv(0, elements, &device)?);
            }
        }
        Ok(total.filter(|_| self.rank == root).map(|sum| match op {
            ReduceOp::Mean => sum.div_scalar(self.size as f64),
            _ => sum,
        }))
    }

    fn broadcast(
        &mut self,
        tensor: Tensor<B, 1>,
        root: usize,
    ) -> Result<Tensor<B, 1>, CollectiveError> {
        CollectiveError::check_root(root, self.size)?;
        let seq = self.next(tensor.dims()[0]);
        let op = CollectiveOp::Broadcast { root };
        let Some(procs) = self.procs.clone() else {
            return self.local.broadcast(tensor, root);
        };
        let root_process = self.process_of[root];
        if root_process == procs.index {
            let value = self.local.broadcast(tensor, self.local_rank(root))?;
            if self.leader().is_some()
                && let Err(failure) = staging::broadcast(&procs, value.to_data(), root_process, seq)
            {
                return Err(self.fail(op, seq, failure));
            }
            return Ok(value);
        }
        let value = match self.leader() {
            Some(procs) => {
                let device = tensor.device();
                match staging::broadcast(procs, tensor.into_data(), root_process, seq) {
                    Ok(data) => Tensor::from_data(data, &device),
                    Err(failure) => return Err(self.fail(op, seq, failure)),
                }
            }
            None => tensor,
        };
        self.local.broadcast(value, 0)
    }

    fn all_gather(&mut self, tensor: Tensor<B, 1>) -> Result<Tensor<B, 1>, CollectiveError> {
        let n = tensor.dims()[0];
        let seq = self.next(n);
        let gathered = self.local.all_gather(tensor)?;
        let Some(_) = &self.procs else {
            return Ok(gathered);
        };
        let device = gathered.device();
        let whole = match self.leader() {
            Some(procs) => match staging::all_gather(procs, gathered.into_data(), seq) {
                Ok(data) => Tensor::from_data(data, &device),
                Err(failure) => return Err(self.fail(CollectiveOp::AllGather, seq, failure)),
            },
            None => Tensor::zeros([n * self.size], &device),
        };
        self.local.broadcast(whole, 0)
    }

    fn reduce_scatter(
        &mut self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, CollectiveError> {
        let elements = tensor.dims()[0];
        if !elements.is_multiple_of(self.size) {
            let error = CollectiveError::Indivisible {
                rank: self.members[self.rank],
                elements,
                world_size: self.size,
            };
            self.abort(&error.to_string());
            return Err(error);
        }
        let chunk = elements / self.size;
        let start = self.rank * chunk;
        Ok(self.all_reduce(tensor, op)?.slice(start..start + chunk))
    }

    fn send(&mut self, tensor: Tensor<B, 1>, to: usize) -> Result<(), CollectiveError> {
        let op = CollectiveOp::Send { to };
        self.check_peer(op, to)?;
        match self.procs.clone() {
            Some(procs) if self.process_of[to] != procs.index => {
                self.next(tensor.dims()[0]);
                let bytes = staging::to_message(tensor.into_data());
                procs.send(bytes, self.process_of[to], self.tag(self.rank, to));
                Ok(())
            }
            _ => {
                let to = self.local_rank(to);
                self.local.send(tensor, to)
            }
        }
    }

    fn recv(
        &mut self,
        from: usize,
        elements: usize,
        device: &B::Device,
    ) -> Result<Tensor<B, 1>, CollectiveError> {
        let op = CollectiveOp::Recv { from };
        self.check_peer(op, from)?;
        let procs = match &self.procs {
            Some(procs) if self.process_of[from] != procs.index => procs.clone(),
            _ => {
                let from = self.local_rank(from);
                return self.local.recv(from, elements, device);
            }
        };
        let seq = self.next(0);
        let tag = self.tag(from, self.rank);
        let bytes = match procs.recv(self.process_of[from], tag, seq) {
            Ok(bytes) => bytes,
            Err(failure) => return Err(self.fail(op, seq, failure)),
        };
        let data = staging::from_message(bytes);
        let got = data.num_elements();
        if got != elements {
            let me = self.members[self.rank];
            return Err(CollectiveError::Mismatch {
                seq,
                rank: me,
                op,
                elements,
                other_rank: self.members[from],
                other_op: CollectiveOp::Send { to: self.rank },
                other_elements: got,
            });
        }
        Ok(Tensor::from_data(data, device))
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        let seq = self.next(0);
        self.local.barrier()?;
        if let Some(procs) = self.leader()
            && let Err(failure) = procs.barrier(seq)
        {
            return Err(self.fail(CollectiveOp::Barrier, seq, failure));
        }
        if self.procs.is_some() {
            self.local.barrier()?;
        }
        Ok(())
    }

    fn abort(&mut self, reason: &str) {
        self.local.abort(reason);
        if let Ok(runtime) = runtime() {
            runtime.lock().abort(self.members[self.rank], reason);
            runtime.flush(Duration::from_secs(1));
        }
    }

    fn counters(&self) -> CollectiveCounters {
        self.counters
    }
}

/// Why the MPI groups of a world cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpiError {
    /// MPI could not start.
    #[error(
        "MPI could not start: {0}. Multi-process runs need Open MPI (Debian: openmpi-bin, \
         libopenmpi-dev) and a launcher: kiln launch, mpirun or srun"
    )]
    Init(String),
    /// The processes do not see the same world, or did not all start.
    #[error("the processes cannot form one world: {0}")]
    Layout(String),
    /// The processes could not exchange what they plan with.
    #[error("the processes could not plan together: {0}")]
    Meeting(String),
    /// MPI's world disagrees with the launcher's variables.
    #[error(
        "the launcher says process {rank} of {processes} but MPI says {mpi_rank} of \
         {mpi_processes}; launch every process with the same mpirun or srun"
    )]
    NotTheLaunchersWorld {
        /// Process rank from the environment.
        rank: usize,
        /// Processes from the environment.
        processes: usize,
        /// MPI's rank of this process.
        mpi_rank: usize,
        /// MPI's number of processes.
        mpi_processes: usize,
    },
}
