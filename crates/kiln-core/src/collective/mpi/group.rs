//! The processes of one collective group, as an MPI communicator: each call stages its data in
//! host memory, starts MPI's non-blocking operation and waits for it with the group's timeout.

use std::time::Duration;

use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::Equivalence;
use mpi::point_to_point::Source;

use mpi::request::{Request, StaticScope};
use mpi::topology::Communicator;

use super::runtime::{Comm, Failure, Pending, Runtime, State, Waiting, wait};

/// How a group's processes combine their buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Combine {
    Sum,
    Max,
}

/// The processes taking part in one group, in the group's rank order.
pub(super) struct ProcessGroup {
    runtime: &'static Runtime,
    comm: Comm,
    /// The group's id, the same in every process.
    pub id: u64,
    /// World process ranks, in communicator order.
    pub processes: Vec<usize>,
    /// This process's index in `processes`.
    pub index: usize,
    pub timeout: Duration,
}

/// A buffer lent to MPI for one non-blocking call: leaked so that the request may outlive
/// the call when it times out (the process is then failing), reclaimed when it completes.
struct Lent<T: 'static> {
    ptr: *mut [T],
}

impl<T: 'static> Lent<T> {
    fn new(values: Vec<T>) -> (Self, &'static mut [T]) {
        let slice: &'static mut [T] = Box::leak(values.into_boxed_slice());
        let ptr: *mut [T] = slice;
        (Self { ptr }, slice)
    }

    /// The values back, once the request using them has completed.
    ///
    /// # Safety
    /// Every request that borrowed the buffer must have completed.
    unsafe fn take(self) -> Vec<T> {
        // SAFETY: `ptr` came from `Box::leak` in `new`, and (the caller promises) no request
        // refers to it any more.
        unsafe { Box::from_raw(self.ptr) }.into_vec()
    }
}

impl ProcessGroup {
    pub fn new(
        runtime: &'static Runtime,
        comm: Comm,
        id: u64,
        processes: Vec<usize>,
        timeout: Duration,
    ) -> Self {
        let index = comm.0.rank() as usize;
        Self {
            runtime,
            comm,
            id,
            processes,
            index,
            timeout,
        }
    }

    fn waiting(&self, seq: u64) -> Waiting<'_> {
        Waiting {
            group: self.id,
            seq,
            processes: &self.processes,
            timeout: self.timeout,
        }
    }

    /// Starts call `seq` with `start` (under the lock) and waits for its request.
    fn run<D: ?Sized + 'static>(
        &self,
        seq: u64,
        start: impl FnOnce(&SimpleComm<'_>) -> Request<'static, D>,
    ) -> Result<(), Failure> {
        let mut request = {
            let mut state = self.runtime.lock();
            state.start(self.id, seq);
            Some(start(&SimpleComm(&self.comm)))
        };
        let result = wait(
            self.runtime,
            &self.waiting(seq),
            |_: &mut State| match request.take()?.test() {
                Ok(_) => Some(()),
                Err(still) => {
                    request = Some(still);
                    None
                }
            },
        );
        if let Some(request) = request.take() {
            // Timed out or aborted: MPI may still use the buffers, which stay leaked.
            std::mem::forget(request);
        }
        result
    }

    /// Element-wise combination of every process's `values`.
    pub fn all_reduce<T: Equivalence + Copy + Default + 'static>(
        &self,
        values: Vec<T>,
        combine: Combine,
        seq: u64,
    ) -> Result<Vec<T>, Failure> {
        let n = values.len();
        let (send, input) = Lent::new(values);
        let (recv, output) = Lent::new(vec![T::default(); n]);
        self.run(seq, |c| {
            let op = match combine {
                Combine::Sum => SystemOperation::sum(),
                Combine::Max => SystemOperation::max(),
            };
            c.0.0
                .immediate_all_reduce_into(StaticScope, &*input, output, op)
        })?;
        // SAFETY: the request completed.
        unsafe {
            drop(send.take());
            Ok(recv.take())
        }
    }

    /// The root process's `bytes` on every process (the same length everywhere).
    pub fn broadcast(&self, bytes: Vec<u8>, root: usize, seq: u64) -> Result<Vec<u8>, Failure> {
        let (lent, buffer) = Lent::new(bytes);
        self.run(seq, |c| {
            c.0.0
                .process_at_rank(root as i32)
                .immediate_broadcast_into(StaticScope, buffer)
        })?;
        // SAFETY: the request completed.
        Ok(unsafe { lent.take() })
    }

    /// Every process's `bytes` (the same length everywhere), concatenated in process order.
    pub fn all_gather(&self, bytes: Vec<u8>, seq: u64) -> Result<Vec<u8>, Failure> {
        let n = bytes.len();
        let (send, input) = Lent::new(bytes);
        let (recv, output) = Lent::new(vec![0u8; n * self.processes.len()]);
        self.run(seq, |c| {
            c.0.0
                .immediate_all_gather_into(StaticScope, &*input, output)
        })?;
        // SAFETY: the request completed.
        unsafe {
            drop(send.take());
            Ok(recv.take())
        }
    }

    /// Waits until every process has arrived.
    pub fn barrier(&self, seq: u64) -> Result<(), Failure> {
        self.run(seq, |c| c.0.0.immediate_barrier())
    }

    /// Sends `bytes` to the group's process `to` with `tag`, without waiting for it.
    pub fn send(&self, bytes: Vec<u8>, to: usize, tag: i32) {
        let mut state = self.runtime.lock();
        let pending = Pending::send(&self.comm.0, to, tag, bytes);
        state.keep(pending);
    }

    /// The next message with `tag` from the group's process `from`.
    pub fn recv(&self, from: usize, tag: i32, seq: u64) -> Result<Vec<u8>, Failure> {
        let comm = &self.comm.0;
        wait(self.runtime, &self.waiting(seq), |_: &mut State| {
            let (message, status) = comm
                .process_at_rank(from as i32)
                .immediate_matched_probe_with_tag(tag)?;
            let mut bytes = vec![0u8; status.count(u8::equivalent_datatype()) as usize];
            message.matched_receive_into(&mut bytes[..]);
            Some(bytes)
        })
    }
}

/// The communicator as the start closures see it (borrowed under the lock).
struct SimpleComm<'a>(&'a Comm);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // `MPI_Comm_free` is an MPI call like any other: under the lock.
        let _state = self.runtime.lock();
        let comm = std::mem::replace(
            &mut self.comm,
            Comm(mpi::topology::SimpleCommunicator::self_comm()),
        );
        drop(comm);
    }
}
