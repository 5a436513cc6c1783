//! The process's MPI: initialised once, and the wait that gives MPI's calls Kiln's timeouts
//! and failure reports.
//!
//! MPI has no timeouts: a call waits forever for a peer that stalls. Kiln therefore makes a
//! group's blocking calls on a thread of the group's own ([`super::group`]) and waits for
//! their result with a deadline ([`wait`]). While it waits it serves a *control* communicator
//! (a duplicate of the world's) that carries three small messages:
//! - `ABORT`: a process failed (its rank and reason); every waiting process returns it.
//! - `PING` / `PONG`: when a call times out, the process asks every peer how far it got in
//!   that group. A peer that is waiting in any call answers; one that does not answer within a
//!   short grace (stopped, or busy far away from any collective) or answers that it has not
//!   reached the call yet is named in the timeout error.
//!
//! Threads call MPI concurrently (a group's thread its collective, a waiting rank the control
//! channel), which needs `MPI_THREAD_MULTIPLE` (Open MPI provides it). One lock guards the
//! control state and the control communicator.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use mpi::Tag;
use mpi::datatype::Equivalence;
use mpi::environment::{Threading, Universe};
use mpi::point_to_point::{Destination, Source};
use mpi::request::{Request, StaticScope};
use mpi::topology::{Color, Communicator, SimpleCommunicator};

/// A communicator that may cross threads.
pub(super) struct Comm(pub SimpleCommunicator);

// SAFETY: an MPI communicator is a process-wide handle, and MPI is initialised with
// `MPI_THREAD_MULTIPLE` (`Runtime::init` refuses less), under which any thread may call MPI on
// any communicator. Each group's collectives are made by its own thread only, in order; the
// control communicator is used under the runtime's lock.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

const PING: Tag = 101;
const PONG: Tag = 102;
const ABORT: Tag = 103;

/// How often a waiting rank serves the control messages (and looks at the clock).
const SERVE_EVERY: Duration = Duration::from_millis(10);

/// How long a timed-out process waits for its peers to say how far they got.
const PING_GRACE: Duration = Duration::from_secs(2);

/// Why a wait ended without its call completing.
#[derive(Debug, Clone)]
pub(super) enum Failure {
    /// A process reported a failure: the world rank it blamed and why.
    Aborted { rank: usize, reason: String },
    /// The call did not complete in time; these processes (world process ranks) had not
    /// reached it.
    Timeout { missing: Vec<usize> },
}

/// The process's MPI state.
pub(super) struct Runtime {
    state: Mutex<State>,
}

/// What the runtime's lock guards: MPI itself (until finalised), the control communicator and
/// what the control messages told this process.
pub(super) struct State {
    universe: Option<Universe>,
    /// A duplicate of the world's communicator for the control messages.
    control: Option<Comm>,
    /// This process's rank among all processes, and their number.
    pub process: usize,
    pub processes: usize,
    /// The first failure reported to this process.
    aborted: Option<(usize, String)>,
    /// Calls this process has started in each group (by group id).
    started: HashMap<u64, u64>,
    /// The answers to this process's pings: (group, process) → calls started.
    pongs: HashMap<(u64, usize), u64>,
    /// Sends whose buffers are kept until MPI has taken them.
    pending: Vec<Pending>,
    /// The id of the next group created.
    next_group: u64,
}

/// A send MPI may still be reading from, and the buffer it reads (kept in the runtime's state,
/// tested under its lock).
pub(super) struct Pending {
    request: Option<Request<'static, [u8]>>,
    buffer: *mut [u8],
}

// SAFETY: the request and its buffer move to the runtime's state and are only touched under
// its lock, with MPI initialised for any thread (`MPI_THREAD_MULTIPLE`).
unsafe impl Send for Pending {}

impl Pending {
    /// Sends `bytes` to `dest` of `comm` with `tag` without waiting; the buffer lives until
    /// the send completes.
    pub fn send(comm: &SimpleCommunicator, dest: usize, tag: Tag, bytes: Vec<u8>) -> Self {
        let buffer: &'static mut [u8] = Box::leak(bytes.into_boxed_slice());
        let ptr: *mut [u8] = buffer;
        let request =
            comm.process_at_rank(dest as i32)
                .immediate_send_with_tag(StaticScope, &*buffer, tag);
        Self {
            request: Some(request),
            buffer: ptr,
        }
    }

    /// Whether MPI is done with the buffer (it is then freed).
    fn done(&mut self) -> bool {
        let Some(request) = self.request.take() else {
            return true;
        };
        match request.test() {
            Ok(_) => {
                // SAFETY: the buffer was leaked from a `Box<[u8]>` in `send`, and the send that
                // read it has completed, so nothing refers to it any more.
                drop(unsafe { Box::from_raw(self.buffer) });
                true
            }
            Err(request) => {
                self.request = Some(request);
                false
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // A send that never completed keeps its buffer (MPI may still read it): the process is
        // failing, so the leak is moot, and dropping an active request would panic.
        if let Some(request) = self.request.take() {
            std::mem::forget(request);
        }
    }
}

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

/// The process's MPI, initialised on first use.
///
/// # Errors
/// When MPI cannot be initialised, or supports too little threading.
pub(super) fn runtime() -> Result<&'static Runtime, String> {
    RUNTIME
        .get_or_init(Runtime::init)
        .as_ref()
        .map_err(Clone::clone)
}

/// The runtime if MPI was initialised.
pub(super) fn started() -> Option<&'static Runtime> {
    RUNTIME.get().and_then(|r| r.as_ref().ok())
}

impl Runtime {
    fn init() -> Result<Self, String> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or("MPI was already initialised by someone else in this process")?;
        if threading != Threading::Multiple {
            return Err(format!(
                "the MPI library supports only {threading:?} threading; Kiln needs Multiple \
                 (MPI_THREAD_MULTIPLE, which Open MPI provides)"
            ));
        }
        let world = universe.world();
        let control = Comm(world.duplicate());
        let (process, processes) = (world.rank() as usize, world.size() as usize);
        Ok(Self {
            state: Mutex::new(State {
                universe: Some(universe),
                control: Some(control),
                process,
                processes,
                aborted: None,
                started: HashMap::new(),
                pongs: HashMap::new(),
                pending: Vec::new(),
                next_group: 0,
            }),
        })
    }

    /// Waits up to `within` for the sends in flight (an abort's messages) to leave: a process
    /// that fails exits right after, and its peers must still learn why.
    pub fn flush(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            {
                let mut state = self.lock();
                state.serve();
                if state.pending.is_empty() || Instant::now() >= deadline {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The lock of the control state.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    /// The world's communicator.
    pub fn world(&self) -> SimpleCommunicator {
        SimpleCommunicator::world()
    }

    /// Splits the world: a communicator of the processes that pass `member`, in process
    /// order, with a fresh group id; every process must call this in the same order.
    pub fn split(&mut self, member: bool) -> (Option<Comm>, u64) {
        let color = if member {
            Color::with_value(0)
        } else {
            Color::undefined()
        };
        let comm = self.world().split_by_color(color).map(Comm);
        (comm, self.reserve_id())
    }

    /// A fresh group id for a group on an existing communicator (the same in every process
    /// that calls this in the same order).
    pub fn reserve_id(&mut self) -> u64 {
        let id = self.next_group;
        self.next_group += 1;
        id
    }

    /// Records that this process starts call `seq` of group `group`.
    pub fn start(&mut self, group: u64, seq: u64) {
        self.started.insert(group, seq + 1);
    }

    /// Keeps a send's buffer until MPI has taken it.
    pub fn keep(&mut self, pending: Pending) {
        self.pending.push(pending);
    }

    /// Tells every other process that world rank `rank` failed with `reason`.
    pub fn abort(&mut self, rank: usize, reason: &str) {
        if self.aborted.is_none() {
            self.aborted = Some((rank, reason.to_string()));
        }
        let Some(control) = &self.control else { return };
        let mut message = (rank as u64).to_le_bytes().to_vec();
        message.extend_from_slice(reason.as_bytes());
        for process in (0..self.processes).filter(|&p| p != self.process) {
            let pending = Pending::send(&control.0, process, ABORT, message.clone());
            self.pending.push(pending);
        }
    }

    /// Answers pings, records pongs and aborts, and frees completed sends.
    fn serve(&mut self) {
        self.pending.retain_mut(|p| !p.done());
        let Some(control) = &self.control else { return };
        while let Some((message, status)) = control.0.any_process().immediate_matched_probe() {
            let count = status.count(u8::equivalent_datatype()) as usize;
            let mut bytes = vec![0u8; count];
            message.matched_receive_into(&mut bytes[..]);
            let from = status.source_rank() as usize;
            let word = |i: usize| {
                let mut w = [0u8; 8];
                w.copy_from_slice(&bytes[8 * i..8 * i + 8]);
                u64::from_le_bytes(w)
            };
            match status.tag() {
                PING if count == 8 => {
                    let group = word(0);
                    let started = self.started.get(&group).copied().unwrap_or(0);
                    let mut answer = group.to_le_bytes().to_vec();
                    answer.extend_from_slice(&started.to_le_bytes());
                    let pending = Pending::send(&control.0, from, PONG, answer);
                    self.pending.push(pending);
                }
                PONG if count == 16 => {
                    self.pongs.insert((word(0), from), word(1));
                }
                // The first failure reported is the one every wait returns.
                ABORT if count >= 8 && self.aborted.is_none() => {
                    let reason = String::from_utf8_lossy(&bytes[8..]).into_owned();
                    self.aborted = Some((word(0) as usize, reason));
                }
                // Nothing else is sent on the control communicator.
                _ => {}
            }
        }
    }
}

/// Where a wait stands: which group and call, among which processes.
pub(super) struct Waiting<'a> {
    pub group: u64,
    pub seq: u64,
    /// The group's processes (world process ranks), this one included.
    pub processes: &'a [usize],
    pub timeout: Duration,
}

/// Waits for `poll` to yield, serving the control messages meanwhile. `poll` may block for
/// up to the duration it is given (a channel's `recv_timeout`), and is called without the
/// lock.
///
/// # Errors
/// [`Failure::Aborted`] when a process reports a failure first, [`Failure::Timeout`] when
/// `waiting.timeout` passes.
pub(super) fn wait<T>(
    runtime: &Runtime,
    waiting: &Waiting<'_>,
    mut poll: impl FnMut(Duration) -> Option<T>,
) -> Result<T, Failure> {
    let start = Instant::now();
    loop {
        // A call's result wakes the wait at once; the control messages are served between
        // slices, rarely: each probe enters MPI's progress engine, which the group's thread
        // is using.
        if let Some(value) = poll(SERVE_EVERY) {
            return Ok(value);
        }
        {
            let mut state = runtime.lock();
            state.serve();
            if let Some((rank, reason)) = state.aborted.clone() {
                return Err(Failure::Aborted { rank, reason });
            }
        }
        if start.elapsed() >= waiting.timeout {
            return Err(Failure::Timeout {
                missing: missing(runtime, waiting),
            });
        }
    }
}

/// The processes of `waiting` that have not reached its call: those that do not answer a
/// ping within [`PING_GRACE`], and those that answer that they are behind.
fn missing(runtime: &Runtime, waiting: &Waiting<'_>) -> Vec<usize> {
    let me = {
        let mut state = runtime.lock();
        let me = state.process;
        for &p in waiting.processes.iter().filter(|&&p| p != me) {
            state.pongs.remove(&(waiting.group, p));
            if let Some(control) = &state.control {
                let ping = Pending::send(&control.0, p, PING, waiting.group.to_le_bytes().into());
                state.pending.push(ping);
            }
        }
        me
    };
    let others: Vec<usize> = waiting
        .processes
        .iter()
        .copied()
        .filter(|&p| p != me)
        .collect();
    let deadline = Instant::now() + PING_GRACE;
    loop {
        let answered = {
            let mut state = runtime.lock();
            state.serve();
            others
                .iter()
                .filter(|&&p| state.pongs.contains_key(&(waiting.group, p)))
                .count()
        };
        if answered == others.len() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let state = runtime.lock();
    others
        .into_iter()
        .filter(|&p| {
            state
                .pongs
                .get(&(waiting.group, p))
                .is_none_or(|&started| started <= waiting.seq)
        })
        .collect()
}

/// Finalises MPI if it was initialised: waits (briefly) for the sends in flight, frees the
/// control communicator and calls `MPI_Finalize`. Call it once, at the end of a successful
/// run, after every strategy is dropped; a failing process exits without it, which makes the
/// launcher end the whole job.
pub fn finalize() {
    let Some(runtime) = started() else { return };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut state = runtime.lock();
    while !state.pending.is_empty() && Instant::now() < deadline {
        state.serve();
        std::thread::yield_now();
    }
    state.pending.clear();
    state.control = None;
    state.universe = None;
}
