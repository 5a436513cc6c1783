//! The run's processes before their world exists: what `auto` needs to plan one layout for
//! all of them. Every process takes part in probing the link between them, the first measures
//! the model, and the first's measurements reach every process, which then all plan alike.

use std::time::{Duration, Instant};

use burn::tensor::TensorData;

use super::MpiError;
use super::connect::{first_other, launched_runtime};
use super::group::{Combine, ProcessGroup};
use super::runtime::Failure;
use crate::collective::Link;
use crate::stats::{WARMUP, median};
use crate::world::ProcessInfo;

/// What every process says first: that it is here to plan.
const MEETING: &[u8; 8] = b"kiln-pln";

/// The tag of the first process's message.
const FROM_FIRST: i32 = 201;

/// How often the other processes look for the first's message: rarely enough to leave the
/// cores to the first's measurements.
const PATIENT_PROBE: Duration = Duration::from_millis(1);

/// Every process of a launch, met through MPI before their world is built.
pub struct Processes {
    group: ProcessGroup,
    /// Calls so far.
    seq: u64,
    timeout: Duration,
}

impl Processes {
    /// Every process of the launch (`process` says which this one is), met through MPI;
    /// each call waits at most `timeout`. Every process must call this at the same point,
    /// before its world's collectives are connected.
    ///
    /// # Errors
    /// [`MpiError`] when MPI cannot start or its world is not the launcher's.
    pub fn meet(process: &ProcessInfo, timeout: Duration) -> Result<Self, MpiError> {
        let runtime = launched_runtime(process)?;
        // Every process must be here, not connecting its world (as a process started with
        // another strategy would be): this first call, timed, matches the world's start-up
        // check, whose different bytes then tell both sides apart.
        let other = first_other(runtime, process.processes, MEETING, timeout)
            .map_err(|f| failed(f, timeout))?;
        if let Some(other) = other {
            return Err(MpiError::Meeting(format!(
                "process {other} is not planning with auto; start every process with the same \
                 --strategy and flags"
            )));
        }
        let (comm, id) = runtime.lock().split(true);
        let comm = comm.expect("every process is a member");
        let processes = (0..process.processes).collect();
        Ok(Self {
            group: ProcessGroup::new(runtime, comm, id, processes, timeout),
            seq: 0,
            timeout,
        })
    }

    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq - 1
    }

    /// The link between the processes through MPI, `calls` all-reduces of every process timed
    /// at each size after a warm-up: its latency (the median all-reduce of 16 values) and its
    /// bandwidth (of 1 Mi values, 4 MiB, against 16, back to back). What a step's
    /// collectives cost between ranks of different processes, beyond their combination in
    /// each process.
    ///
    /// # Errors
    /// [`MpiError::Meeting`] when a process fails or does not arrive in time.
    pub fn probe(&mut self, calls: usize) -> Result<Link, MpiError> {
        const SMALL: usize = 16;
        const LARGE: usize = 1 << 20;
        let mut time = |len: usize| -> Result<f64, MpiError> {
            let mut times = Vec::with_capacity(calls);
            for call in 0..calls + WARMUP {
                let data = TensorData::new(vec![1.0f32; len], [len]);
                let seq = self.next();
                let start = Instant::now();
                self.group
                    .all_reduce::<f32>(data, Combine::Sum, seq)
                    .map_err(|f| failed(f, self.timeout))?;
                if call >= WARMUP {
                    times.push(start.elapsed().as_secs_f64());
                }
            }
            Ok(median(&times))
        };
        let small = time(SMALL)?;
        let large = time(LARGE)?;
        Ok(Link::probed(small, small, large, (LARGE * 4) as f64))
    }

    /// The first process's `bytes` (given there, `None` elsewhere) on every process. The
    /// others look for them every millisecond, leaving the cores to the first's work, for at
    /// most `patience`.
    ///
    /// # Errors
    /// [`MpiError::Meeting`] when a process fails or the bytes do not come in time.
    ///
    /// # Panics
    /// When the first process gives no bytes, or another gives some: the caller's mistake.
    pub fn from_first(
        &mut self,
        bytes: Option<Vec<u8>>,
        patience: Duration,
    ) -> Result<Vec<u8>, MpiError> {
        let first = self.group.index == 0;
        assert_eq!(
            bytes.is_some(),
            first,
            "the first process, alone, gives the bytes"
        );
        let seq = self.next();
        let bytes = match bytes {
            Some(bytes) => {
                for other in 1..self.group.processes.len() {
                    self.group.send(bytes.clone(), other, FROM_FIRST);
                }
                bytes
            }
            None => self
                .group
                .recv_probing(0, FROM_FIRST, seq, PATIENT_PROBE, patience)
                .map_err(|f| match f {
                    // The first process is not missing: it is busy measuring.
                    Failure::Timeout { .. } => MpiError::Meeting(format!(
                        "the first process did not send its measurement within {patience:?}; \
                         raise [parallel.ddp] collective_timeout_s"
                    )),
                    other => failed(other, patience),
                })?,
        };
        // Every process holds the bytes before any goes on.
        let seq = self.next();
        self.group
            .barrier(seq)
            .map_err(|f| failed(f, self.timeout))?;
        Ok(bytes)
    }
}

/// The error of a meeting that failed.
fn failed(failure: Failure, timeout: Duration) -> MpiError {
    MpiError::Meeting(match failure {
        Failure::Aborted { rank, reason } => format!("rank {rank} failed: {reason}"),
        Failure::Timeout { missing } => {
            format!("process(es) {missing:?} did not arrive within {timeout:?}")
        }
    })
}
