//! The processes of one collective group, as an MPI communicator with a thread of its own.
//!
//! A group operation is MPI's *blocking* call (its tuned algorithms: Open MPI's non-blocking
//! collectives measured two to three times slower on large buffers), made on the group's
//! thread, while the calling rank waits for its result with the group's timeout and serves the
//! control messages ([`super::runtime::wait`]). A call that times out stays blocked on its
//! thread, holding its buffers; the rank returns the error, and its process is failing.

use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::tensor::TensorData;
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::Equivalence;
use mpi::point_to_point::Source;
use mpi::topology::{Communicator, SimpleCommunicator};

use super::buffers::ReceiveBuffers;
use super::runtime::{Comm, Failure, Pending, Runtime, Waiting, wait};

/// How a group's processes combine their buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Combine {
    Sum,
    Max,
}

impl Combine {
    fn op(self) -> SystemOperation {
        match self {
            Combine::Sum => SystemOperation::sum(),
            Combine::Max => SystemOperation::max(),
        }
    }
}

/// A blocking MPI call for the group's thread.
type Job = Box<dyn FnOnce(&SimpleCommunicator) + Send>;

/// The processes taking part in one group, in the group's rank order.
pub(super) struct ProcessGroup {
    runtime: &'static Runtime,
    comm: Arc<Comm>,
    jobs: Mutex<Option<Sender<Job>>>,
    /// Says when the group's thread has ended (and let go of the communicator).
    ended: Mutex<Receiver<()>>,
    /// Spent inputs that receive later all-reduces of their size.
    buffers: Mutex<ReceiveBuffers>,
    /// The group's id, the same in every process.
    pub id: u64,
    /// World process ranks, in communicator order.
    pub processes: Vec<usize>,
    /// This process's index in `processes`.
    pub index: usize,
    pub timeout: Duration,
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
        let comm = Arc::new(comm);
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (end, ended) = mpsc::channel();
        let thread_comm = comm.clone();
        std::thread::Builder::new()
            .name(format!("kiln-mpi-group{id}"))
            .spawn(move || {
                for job in inbox {
                    job(&thread_comm.0);
                }
                drop(thread_comm);
                let _ = end.send(());
            })
            .expect("a thread for the group's MPI calls");
        Self {
            runtime,
            comm,
            jobs: Mutex::new(Some(jobs)),
            ended: Mutex::new(ended),
            buffers: Mutex::default(),
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

    /// Runs `call` on the group's thread as call `seq`, and waits for its result.
    fn run<T: Send + 'static>(
        &self,
        seq: u64,
        call: impl FnOnce(&SimpleCommunicator) -> T + Send + 'static,
    ) -> Result<T, Failure> {
        self.runtime.lock().start(self.id, seq);
        let (result, answer) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |comm| {
            // The caller may have given up (timed out): then nobody reads the result.
            let _ = SyncSender::send(&result, call(comm));
        });
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok());
        assert!(
            sent,
            "the group's MPI thread runs until the group is dropped"
        );
        wait(self.runtime, &self.waiting(seq), |slice| {
            answer.recv_timeout(slice).ok()
        })
    }

    /// Element-wise combination of every process's `data` (f32 or f64 values).
    pub fn all_reduce<T: Equivalence + Copy + Default + burn::tensor::Element>(
        &self,
        data: TensorData,
        combine: Combine,
        seq: u64,
    ) -> Result<TensorData, Failure> {
        let mut output = self.buffers().take::<T>(&data);
        let (input, output) = self.run(seq, move |comm| {
            // Read in place: a tensor's host copy is not copied again.
            let input = data.as_slice::<T>().expect("the values' own dtype");
            let into = output
                .as_mut_slice::<T>()
                .expect("a buffer of the values' dtype");
            comm.all_reduce_into(input, into, combine.op());
            (data, output)
        })?;
        self.buffers().keep(input);
        Ok(output)
    }

    /// Element-wise combination of every process's `data` (f32 or f64 values), on the process
    /// `root` alone (`None` elsewhere: the others receive nothing).
    pub fn reduce<T: Equivalence + Copy + Default + burn::tensor::Element>(
        &self,
        data: TensorData,
        combine: Combine,
        root: usize,
        seq: u64,
    ) -> Result<Option<TensorData>, Failure> {
        let output = (self.index == root).then(|| self.buffers().take::<T>(&data));
        let (input, output) = self.run(seq, move |comm| {
            let mut output = output;
            let input = data.as_slice::<T>().expect("the values' own dtype");
            let root = comm.process_at_rank(root as i32);
            match output.as_mut() {
                Some(output) => {
                    let into = output
                        .as_mut_slice::<T>()
                        .expect("a buffer of the values' dtype");
                    root.reduce_into_root(input, into, combine.op());
                }
                None => root.reduce_into(input, combine.op()),
            }
            (data, output)
        })?;
        self.buffers().keep(input);
        Ok(output)
    }

    fn buffers(&self) -> std::sync::MutexGuard<'_, ReceiveBuffers> {
        self.buffers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The root process's `bytes` on every process (the same length everywhere).
    pub fn broadcast(&self, mut bytes: Vec<u8>, root: usize, seq: u64) -> Result<Vec<u8>, Failure> {
        self.run(seq, move |comm| {
            comm.process_at_rank(root as i32)
                .broadcast_into(&mut bytes[..]);
            bytes
        })
    }

    /// Every process's `bytes` (the same length everywhere), concatenated in process order.
    pub fn all_gather(&self, bytes: Vec<u8>, seq: u64) -> Result<Vec<u8>, Failure> {
        let n = bytes.len() * self.processes.len();
        self.run(seq, move |comm| {
            let mut output = vec![0u8; n];
            comm.all_gather_into(&bytes[..], &mut output[..]);
            output
        })
    }

    /// Waits until every process has arrived.
    pub fn barrier(&self, seq: u64) -> Result<(), Failure> {
        self.run(seq, |comm| comm.barrier())
    }

    /// Sends `bytes` to the group's process `to` with `tag`, without waiting for it.
    pub fn send(&self, bytes: Vec<u8>, to: usize, tag: i32) {
        let pending = Pending::send(&self.comm.0, to, tag, bytes);
        self.runtime.lock().keep(pending);
    }

    /// The next message with `tag` from the group's process `from`.
    pub fn recv(&self, from: usize, tag: i32, seq: u64) -> Result<Vec<u8>, Failure> {
        // Probes, gently: an activation is usually on its way.
        self.recv_probing(from, tag, seq, Duration::from_micros(20), self.timeout)
    }

    /// [`Self::recv`], probing every `every` and waiting at most `timeout`.
    pub fn recv_probing(
        &self,
        from: usize,
        tag: i32,
        seq: u64,
        every: Duration,
        timeout: Duration,
    ) -> Result<Vec<u8>, Failure> {
        let comm = &self.comm.0;
        let waiting = Waiting {
            timeout,
            ..self.waiting(seq)
        };
        wait(self.runtime, &waiting, |slice| {
            let until = Instant::now() + slice;
            loop {
                if let Some((message, status)) = comm
                    .process_at_rank(from as i32)
                    .immediate_matched_probe_with_tag(tag)
                {
                    let mut bytes = vec![0u8; status.count(u8::equivalent_datatype()) as usize];
                    message.matched_receive_into(&mut bytes[..]);
                    return Some(bytes);
                }
                if Instant::now() >= until {
                    return None;
                }
                std::thread::sleep(every);
            }
        })
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // Ends the group's thread, which frees the communicator (an MPI call, which must come
        // before MPI is finalised); a thread still blocked in a call that timed out is left
        // behind: its process is failing.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take();
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        let _ = ended.recv_timeout(Duration::from_secs(1));
    }
}
