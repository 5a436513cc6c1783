//! The in-process collective: ranks are threads of one process, on any Burn backend.
//!
//! One mutex and one condition variable serve two kinds of call:
//! - group operations ([`round`]) are *rounds* of a rendezvous. Ranks deposit their tensor and
//!   wait with a deadline; the last rank to arrive combines the inputs in rank order (so every
//!   rank gets bit-identical results), publishes the output, and wakes the others. A round's
//!   output cannot be overwritten before every rank has read it, because the next round needs
//!   every rank to arrive.
//! - point-to-point messages ([`mailbox`]) go through one FIFO queue per (sender, receiver)
//!   pair: a send deposits and returns, a receive waits with a deadline for the head of its
//!   queue. Message `k` from a rank to another is that pair's `k`-th send and receive.
//!
//! Tensors cross threads here, and a device may queue each thread's work separately (CubeCL
//! keeps a stream per thread): a rank synchronises its device before depositing its tensor,
//! and the combining rank before publishing the output, so nobody reads unfinished data.
//! Nor may a rank keep a tensor another thread's stream made ([`own`](InProcess::own)): on
//! CubeCL's wgpu runtime a buffer goes back to the stream that allocated it as soon as its last
//! handle drops, and Burn writes in place into any tensor whose handle is the only one, neither
//! waiting for reads that other streams have queued but not yet run. So each rank copies what
//! it receives on its own stream, waits for the copy, and only then lets go of the shared
//! handle. (Without the copy, tensor parallelism with both ranks on one wgpu device trained
//! 0.3–1.6 % away from single-device training, a different amount each run.) On CPU
//! backends, which run each operation as it is called, a rank keeps what it receives and
//! synchronising is free.
//!
//! Failure handling keeps the "never a hang" invariant: a waiting rank past its deadline
//! records which ranks are missing and poisons the group; [`Collective::abort`], a panic
//! unwinding through the handle, or a dropped handle poison it too, and every rank checks the
//! poison before and while waiting.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use burn::tensor::{Tensor, backend::Backend};

use super::{Collective, CollectiveCounters, CollectiveError, CollectiveOp, ReduceOp};

mod mailbox;
mod round;

/// One rank's handle on a group of threads of this process.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use kiln_collective::collective::{Collective, InProcess, ReduceOp};
///
/// let handles = InProcess::<Flex>::group(2, Duration::from_secs(10));
/// let sums: Vec<f32> = std::thread::scope(|s| {
///     let jobs: Vec<_> = handles
///         .into_iter()
///         .map(|mut c| {
///             s.spawn(move || {
///                 let x = Tensor::<Flex, 1>::from_floats([c.rank() as f32 + 1.0], &Default::default());
///                 c.all_reduce(x, ReduceOp::Sum).unwrap().into_scalar()
///             })
///         })
///         .collect();
///     jobs.into_iter().map(|j| j.join().unwrap()).collect()
/// });
/// assert_eq!(sums, vec![3.0, 3.0]);
/// ```
pub struct InProcess<B: Backend> {
    rank: usize,
    shared: Arc<Shared<B>>,
    seq: u64,
    /// Messages sent to each rank so far.
    sent: Vec<u64>,
    /// Messages received from each rank so far.
    received: Vec<u64>,
    counters: CollectiveCounters,
}

struct Shared<B: Backend> {
    world_size: usize,
    /// The rank in the whole world of each rank of this group, for errors: a sub-group of a
    /// mesh numbers its ranks from 0, but a user looks for the failed rank in the world.
    members: Vec<usize>,
    timeout: Duration,
    state: Mutex<State<B>>,
    wake: Condvar,
}

/// The failure that poisoned a group: the rank blamed and why.
#[derive(Clone)]
struct Failure {
    rank: usize,
    reason: String,
    /// The world's rank to blame when it is not the group rank `rank`'s: a failure that
    /// `rank` only passes on from outside the group.
    blamed: Option<usize>,
}

/// What the first rank to arrive in a round called; later ranks must match it.
#[derive(Clone, Copy)]
struct Call {
    op: CollectiveOp,
    elements: usize,
    rank: usize,
}

/// Whether `device` runs each operation as it is called (Burn's CPU backends) rather than
/// queueing it on the calling thread's stream (CubeCL's wgpu and CUDA, fused or not). A device
/// Kiln does not know is taken to queue: copying what a rank receives is then only slower.
fn runs_eagerly<D: std::any::Any>(device: &D) -> bool {
    let device = device as &dyn std::any::Any;
    device.is::<burn::backend::flex::FlexDevice>()
        || device.is::<burn::backend::ndarray::NdArrayDevice>()
}

struct State<B: Backend> {
    /// Sequence number of the round being gathered; rounds before it are complete.
    round: u64,
    call: Option<Call>,
    inputs: Vec<Option<Tensor<B, 1>>>,
    arrived: Vec<bool>,
    arrivals: usize,
    /// Output of round `round - 1`, kept until every rank has taken it.
    output: Option<Tensor<B, 1>>,
    output_readers: usize,
    failure: Option<Failure>,
    /// Point-to-point messages in flight, queue `from · world_size + to`.
    mail: Vec<std::collections::VecDeque<Tensor<B, 1>>>,
}

impl<B: Backend> InProcess<B> {
    /// `tensor` (made on another thread's stream) as this rank's own on `device`: on a device
    /// that queues each thread's work, a copy made and finished on this thread's stream before
    /// the shared handle goes (see the [module docs](self)); elsewhere the tensor moved to
    /// `device`, which is itself when it is already there.
    fn own(
        &self,
        op: CollectiveOp,
        seq: u64,
        tensor: Tensor<B, 1>,
        device: &B::Device,
    ) -> Result<Tensor<B, 1>, CollectiveError> {
        if runs_eagerly(device) {
            return Ok(tensor.to_device(device));
        }
        // The shared handle is held until the copy has run: it cannot be written in place,
        // nor its memory reused, before then. × 1 is exact for every value, NaN and −0 too.
        let mine = if tensor.device() == *device {
            tensor.clone().mul_scalar(1.0)
        } else {
            tensor.clone().to_device(device)
        };
        self.sync(op, seq, device)?;
        drop(tensor);
        Ok(mine)
    }

    /// Creates a group of `world_size` ranks whose calls time out after `timeout`; hand
    /// element `r` of the result to the thread of rank `r`.
    ///
    /// # Panics
    /// When `world_size` is 0.
    pub fn group(world_size: usize, timeout: Duration) -> Vec<Self> {
        Self::subgroup((0..world_size).collect(), timeout)
    }

    /// Creates a group of the world's ranks `members` (in group-rank order); errors name the
    /// world's ranks. Hand element `i` of the result to the thread of rank `members[i]`.
    ///
    /// # Panics
    /// When `members` is empty.
    pub fn subgroup(members: Vec<usize>, timeout: Duration) -> Vec<Self> {
        let world_size = members.len();
        assert!(world_size > 0, "a collective group needs at least one rank");
        let shared = Arc::new(Shared {
            world_size,
            members,
            timeout,
            state: Mutex::new(State {
                round: 0,
                call: None,
                inputs: vec![None; world_size],
                arrived: vec![false; world_size],
                arrivals: 0,
                output: None,
                output_readers: 0,
                failure: None,
                mail: (0..world_size * world_size)
                    .map(|_| Default::default())
                    .collect(),
            }),
            wake: Condvar::new(),
        });
        (0..world_size)
            .map(|rank| Self {
                rank,
                shared: shared.clone(),
                seq: 0,
                sent: vec![0; world_size],
                received: vec![0; world_size],
                counters: CollectiveCounters::default(),
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State<B>> {
        // A panic while holding the lock can only come from a Burn op in `combine`; the state
        // is still consistent enough to report failures, so keep going.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The world's rank of this group's rank `rank`.
    /// Waits for the work this thread queued on `device`; a failure names the call and rank.
    fn sync(&self, op: CollectiveOp, seq: u64, device: &B::Device) -> Result<(), CollectiveError> {
        B::sync(device).map_err(|e| CollectiveError::Device {
            op,
            seq,
            rank: self.global(self.rank),
            reason: format!("{e:?}"),
        })
    }

    fn global(&self, rank: usize) -> usize {
        self.shared.members[rank]
    }

    fn peer_failed(&self, op: CollectiveOp, seq: u64, failure: &Failure) -> CollectiveError {
        CollectiveError::PeerFailed {
            op,
            seq,
            rank: self.global(self.rank),
            failed_rank: failure.blamed.unwrap_or_else(|| self.global(failure.rank)),
            reason: failure.reason.clone(),
        }
    }

    /// Poisons the group on behalf of the world's rank `culprit`, which failed outside it:
    /// every rank then reports `culprit` with `reason`.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn fail_for(&self, culprit: usize, reason: String) {
        let mut state = self.lock();
        if state.failure.is_none() {
            state.failure = Some(Failure {
                rank: self.rank,
                reason,
                blamed: Some(culprit),
            });
        }
        self.shared.wake.notify_all();
    }

    fn poison(&self, reason: String) {
        let mut state = self.lock();
        self.record_failure(&mut state, self.rank, reason);
    }

    /// Poisons the group, blaming `rank`, unless it already is, and wakes every waiter.
    fn record_failure(&self, state: &mut State<B>, rank: usize, reason: String) {
        if state.failure.is_none() {
            state.failure = Some(Failure {
                rank,
                reason,
                blamed: None,
            });
        }
        self.shared.wake.notify_all();
    }
}

impl<B: Backend> Collective<B> for InProcess<B> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world_size
    }

    fn all_reduce(
        &mut self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, CollectiveError> {
        let output = self.rendezvous(CollectiveOp::AllReduce(op), Some(tensor))?;
        Ok(output.expect("an all-reduce produces a tensor"))
    }

    fn reduce(
        &mut self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
        root: usize,
    ) -> Result<Option<Tensor<B, 1>>, CollectiveError> {
        CollectiveError::check_root(root, self.shared.world_size)?;
        let output = self.rendezvous(CollectiveOp::Reduce { op, root }, Some(tensor))?;
        Ok(output.filter(|_| self.rank == root))
    }

    fn broadcast(
        &mut self,
        tensor: Tensor<B, 1>,
        root: usize,
    ) -> Result<Tensor<B, 1>, CollectiveError> {
        CollectiveError::check_root(root, self.shared.world_size)?;
        let output = self.rendezvous(CollectiveOp::Broadcast { root }, Some(tensor))?;
        Ok(output.expect("a broadcast produces a tensor"))
    }

    fn all_gather(&mut self, tensor: Tensor<B, 1>) -> Result<Tensor<B, 1>, CollectiveError> {
        let output = self.rendezvous(CollectiveOp::AllGather, Some(tensor))?;
        Ok(output.expect("an all-gather produces a tensor"))
    }

    fn reduce_scatter(
        &mut self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, CollectiveError> {
        let (elements, world_size) = (tensor.dims()[0], self.shared.world_size);
        if !elements.is_multiple_of(world_size) {
            // Poison the group too: the other ranks would otherwise wait for this one.
            let error = CollectiveError::Indivisible {
                rank: self.global(self.rank),
                elements,
                world_size,
            };
            self.poison(error.to_string());
            return Err(error);
        }
        let reduced = self.rendezvous(CollectiveOp::ReduceScatter(op), Some(tensor))?;
        let chunk = elements / world_size;
        let start = self.rank * chunk;
        Ok(reduced
            .expect("a reduce-scatter produces a tensor")
            .slice(start..start + chunk))
    }

    fn send(&mut self, tensor: Tensor<B, 1>, to: usize) -> Result<(), CollectiveError> {
        self.post(tensor, to)
    }

    fn recv(
        &mut self,
        from: usize,
        elements: usize,
        device: &B::Device,
    ) -> Result<Tensor<B, 1>, CollectiveError> {
        self.take(from, elements, device)
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.rendezvous(CollectiveOp::Barrier, None).map(drop)
    }

    fn abort(&mut self, reason: &str) {
        self.poison(reason.to_string());
    }

    fn counters(&self) -> CollectiveCounters {
        self.counters
    }
}

impl<B: Backend> Drop for InProcess<B> {
    fn drop(&mut self) {
        // A rank that is gone can never arrive again: tell the others now rather than let
        // them wait for the timeout. After a clean finish nobody is waiting, so this is moot.
        let reason = if std::thread::panicking() {
            "panicked".to_string()
        } else {
            format!("left the group after {} calls", self.seq)
        };
        self.poison(reason);
    }
}

#[cfg(test)]
mod tests;
