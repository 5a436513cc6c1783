//! The in-process collective: ranks are threads of one process, on any Burn backend.
//!
//! A rendezvous under one mutex: each call is a *round*. Ranks deposit their tensor and wait
//! on a condition variable with a deadline; the last rank to arrive combines the inputs in
//! rank order (so every rank gets bit-identical results), publishes the output, and wakes the
//! others. A round's output cannot be overwritten before every rank has read it, because the
//! next round needs every rank to arrive.
//!
//! Tensors cross threads here, and a device may queue each thread's work separately (CubeCL
//! keeps a stream per thread): a rank synchronises its device before depositing its tensor,
//! and the combining rank before publishing the output, so nobody reads unfinished data. On
//! CPU backends synchronising is free.
//!
//! Failure handling keeps the "never a hang" invariant: a waiting rank past its deadline
//! records which ranks are missing and poisons the group; [`Collective::abort`], a panic
//! unwinding through the handle, or a dropped handle poison it too, and every rank checks the
//! poison before and while waiting.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use burn::tensor::{Tensor, backend::Backend};

use super::{Collective, CollectiveCounters, CollectiveError, CollectiveOp, ReduceOp};

/// One rank's handle on a group of threads of this process.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use kiln_core::collective::{Collective, InProcess, ReduceOp};
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
    counters: CollectiveCounters,
}

struct Shared<B: Backend> {
    world_size: usize,
    timeout: Duration,
    state: Mutex<State<B>>,
    wake: Condvar,
}

/// The failure that poisoned a group: the rank blamed and why.
#[derive(Clone)]
struct Failure {
    rank: usize,
    reason: String,
}

/// What the first rank to arrive in a round called; later ranks must match it.
#[derive(Clone, Copy)]
struct Call {
    op: CollectiveOp,
    elements: usize,
    rank: usize,
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
}

impl<B: Backend> InProcess<B> {
    /// Creates a group of `world_size` ranks whose calls time out after `timeout`; hand
    /// element `r` of the result to the thread of rank `r`.
    ///
    /// # Panics
    /// When `world_size` is 0.
    pub fn group(world_size: usize, timeout: Duration) -> Vec<Self> {
        assert!(world_size > 0, "a collective group needs at least one rank");
        let shared = Arc::new(Shared {
            world_size,
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
            }),
            wake: Condvar::new(),
        });
        (0..world_size)
            .map(|rank| Self {
                rank,
                shared: shared.clone(),
                seq: 0,
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

    fn peer_failed(&self, op: CollectiveOp, seq: u64, failure: &Failure) -> CollectiveError {
        CollectiveError::PeerFailed {
            op,
            seq,
            rank: self.rank,
            failed_rank: failure.rank,
            reason: failure.reason.clone(),
        }
    }

    /// One round: deposit `input`, wait for every rank, return the combined output.
    fn rendezvous(
        &mut self,
        op: CollectiveOp,
        input: Option<Tensor<B, 1>>,
    ) -> Result<Option<Tensor<B, 1>>, CollectiveError> {
        let seq = self.seq;
        self.seq += 1;
        self.counters.calls += 1;
        let elements = input.as_ref().map_or(0, |t| t.dims()[0]);
        self.counters.elements += elements as u64;
        if self.shared.world_size == 1 {
            // Alone, every operation returns its input: nothing to wait for or combine.
            return Ok(input);
        }
        let device = input.as_ref().map(Tensor::device);
        if let Some(device) = &device {
            B::sync(device).map_err(|e| CollectiveError::Device {
                op,
                seq,
                rank: self.rank,
                reason: format!("{e:?}"),
            })?;
        }
        let deadline = Instant::now() + self.shared.timeout;

        let mut state = self.lock();
        if let Some(failure) = &state.failure {
            return Err(self.peer_failed(op, seq, failure));
        }
        debug_assert_eq!(state.round, seq, "rank {} is out of step", self.rank);
        match state.call {
            None => {
                state.call = Some(Call {
                    op,
                    elements,
                    rank: self.rank,
                })
            }
            Some(first) if first.op != op || first.elements != elements => {
                let error = CollectiveError::Mismatch {
                    seq,
                    rank: self.rank,
                    op,
                    elements,
                    other_rank: first.rank,
                    other_op: first.op,
                    other_elements: first.elements,
                };
                self.record_failure(&mut state, self.rank, error.to_string());
                return Err(error);
            }
            Some(_) => {}
        }
        state.inputs[self.rank] = input;
        state.arrived[self.rank] = true;
        state.arrivals += 1;

        if state.arrivals == self.shared.world_size {
            let inputs: Vec<_> = state.inputs.iter_mut().map(Option::take).collect();
            state.output = combine(op, inputs, self.shared.world_size);
            if let Some(output) = &state.output
                && let Err(e) = B::sync(&output.device())
            {
                let reason = format!("device failed to synchronise after combining: {e:?}");
                self.record_failure(&mut state, self.rank, reason.clone());
                return Err(CollectiveError::Device {
                    op,
                    seq,
                    rank: self.rank,
                    reason,
                });
            }
            state.output_readers = 0;
            state.call = None;
            state.arrived.fill(false);
            state.arrivals = 0;
            state.round += 1;
            self.shared.wake.notify_all();
        }

        loop {
            if state.round > seq {
                return Ok(take_output(&mut state, self.shared.world_size)
                    .map(|t| t.to_device(device.as_ref().expect("a tensor op has a device"))));
            }
            if let Some(failure) = &state.failure {
                return Err(self.peer_failed(op, seq, failure));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..self.shared.world_size)
                    .filter(|&r| !state.arrived[r])
                    .collect();
                let reason = format!(
                    "never arrived at {op} #{seq} within {:?}",
                    self.shared.timeout
                );
                self.record_failure(&mut state, missing[0], reason);
                return Err(CollectiveError::Timeout {
                    op,
                    seq,
                    rank: self.rank,
                    missing,
                    timeout: self.shared.timeout,
                });
            }
            state = self
                .shared
                .wake
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    fn poison(&self, reason: String) {
        let mut state = self.lock();
        self.record_failure(&mut state, self.rank, reason);
    }

    /// Poisons the group, blaming `rank`, unless it already is, and wakes every waiter.
    fn record_failure(&self, state: &mut State<B>, rank: usize, reason: String) {
        if state.failure.is_none() {
            state.failure = Some(Failure { rank, reason });
        }
        self.shared.wake.notify_all();
    }
}

/// Hands out the finished round's output, dropping the group's copy after the last reader.
fn take_output<B: Backend>(state: &mut State<B>, world_size: usize) -> Option<Tensor<B, 1>> {
    state.output_readers += 1;
    if state.output_readers == world_size {
        state.output.take()
    } else {
        state.output.clone()
    }
}

/// Combines the inputs of one round, in rank order, on rank 0's device.
fn combine<B: Backend>(
    op: CollectiveOp,
    inputs: Vec<Option<Tensor<B, 1>>>,
    world_size: usize,
) -> Option<Tensor<B, 1>> {
    match op {
        CollectiveOp::Barrier => None,
        CollectiveOp::Broadcast { root } => inputs.into_iter().nth(root).flatten(),
        CollectiveOp::AllReduce(reduce) => {
            let mut inputs = inputs.into_iter().flatten();
            let first = inputs.next().expect("every rank deposits a tensor");
            let device = first.device();
            let combined = inputs.fold(first, |acc, t| {
                let t = t.to_device(&device);
                match reduce {
                    ReduceOp::Sum | ReduceOp::Mean => acc + t,
                    ReduceOp::Max => acc.max_pair(t),
                }
            });
            Some(match reduce {
                ReduceOp::Mean => combined.div_scalar(world_size as f64),
                ReduceOp::Sum | ReduceOp::Max => combined,
            })
        }
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

    fn broadcast(
        &mut self,
        tensor: Tensor<B, 1>,
        root: usize,
    ) -> Result<Tensor<B, 1>, CollectiveError> {
        let world_size = self.shared.world_size;
        if root >= world_size {
            return Err(CollectiveError::InvalidRoot { root, world_size });
        }
        let output = self.rendezvous(CollectiveOp::Broadcast { root }, Some(tensor))?;
        Ok(output.expect("a broadcast produces a tensor"))
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
mod tests {
    use std::time::{Duration, Instant};

    use burn::backend::Flex;

    use super::*;

    type T = Tensor<Flex, 1>;

    fn tensor(values: &[f32]) -> T {
        Tensor::from_floats(values, &Default::default())
    }

    fn values(t: T) -> Vec<f32> {
        t.into_data().to_vec().unwrap()
    }

    /// Runs `f(rank, handle)` on a thread per rank and returns the results in rank order.
    fn on_ranks<R: Send>(
        world_size: usize,
        timeout: Duration,
        f: impl Fn(usize, InProcess<Flex>) -> R + Sync,
    ) -> Vec<R> {
        let handles = InProcess::<Flex>::group(world_size, timeout);
        std::thread::scope(|s| {
            let jobs: Vec<_> = handles
                .into_iter()
                .enumerate()
                .map(|(rank, c)| {
                    let f = &f;
                    s.spawn(move || f(rank, c))
                })
                .collect();
            jobs.into_iter().map(|j| j.join().unwrap()).collect()
        })
    }

    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn all_reduce_ops_agree_on_every_rank() {
        for (op, expected) in [
            (ReduceOp::Sum, vec![6.0, 10.0]),
            (ReduceOp::Mean, vec![1.5, 2.5]),
            (ReduceOp::Max, vec![3.0, 4.0]),
        ] {
            let results = on_ranks(4, LONG, |rank, mut c| {
                let r = rank as f32;
                values(c.all_reduce(tensor(&[r, r + 1.0]), op).unwrap())
            });
            assert!(
                results.iter().all(|r| *r == expected),
                "{op:?}: {results:?}"
            );
        }
    }

    #[test]
    fn many_rounds_in_a_row() {
        let results = on_ranks(3, LONG, |rank, mut c| {
            (0..50)
                .map(|i| {
                    values(
                        c.all_reduce(tensor(&[(rank * i) as f32]), ReduceOp::Sum)
                            .unwrap(),
                    )[0]
                })
                .collect::<Vec<_>>()
        });
        let expected: Vec<f32> = (0..50).map(|i| (3 * i) as f32).collect();
        assert!(results.iter().all(|r| *r == expected));
    }

    #[test]
    fn broadcast_takes_the_root_values() {
        let results = on_ranks(3, LONG, |rank, mut c| {
            c.barrier().unwrap();
            values(c.broadcast(tensor(&[rank as f32; 3]), 2).unwrap())
        });
        assert!(results.iter().all(|r| *r == vec![2.0; 3]));
    }

    #[test]
    fn a_missing_rank_is_named_within_the_timeout() {
        let timeout = Duration::from_millis(200);
        let results = on_ranks(3, timeout, |rank, mut c| {
            let start = Instant::now();
            let result = if rank == 1 {
                // Never arrives, but stays alive (does not drop its handle) past the deadline.
                std::thread::sleep(timeout * 3);
                return None;
            } else {
                c.all_reduce(tensor(&[1.0]), ReduceOp::Sum)
            };
            Some((result.unwrap_err(), start.elapsed()))
        });
        for (error, elapsed) in results.into_iter().flatten() {
            assert_eq!(error.culprit(), Some(1), "{error}");
            assert!(elapsed < timeout * 3, "took {elapsed:?}");
        }
    }

    #[test]
    fn an_aborting_rank_releases_the_others_at_once() {
        let results = on_ranks(3, LONG, |rank, mut c| {
            let start = Instant::now();
            if rank == 2 {
                std::thread::sleep(Duration::from_millis(50));
                c.abort("out of data");
                return None;
            }
            let error = c.all_reduce(tensor(&[1.0]), ReduceOp::Sum).unwrap_err();
            Some((error, start.elapsed()))
        });
        for (error, elapsed) in results.into_iter().flatten() {
            assert!(matches!(
                &error,
                CollectiveError::PeerFailed { failed_rank: 2, reason, .. } if reason == "out of data"
            ));
            assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
        }
    }

    #[test]
    fn a_panicking_rank_poisons_the_group() {
        let handles = InProcess::<Flex>::group(2, LONG);
        let mut handles = handles.into_iter();
        let (mut first, second) = (handles.next().unwrap(), handles.next().unwrap());
        let dead = std::thread::spawn(move || {
            let _keep = second;
            panic!("boom");
        });
        assert!(dead.join().is_err());
        let error = first.barrier().unwrap_err();
        assert!(
            matches!(&error, CollectiveError::PeerFailed { failed_rank: 1, reason, .. } if reason == "panicked"),
            "{error}"
        );
    }

    #[test]
    fn mismatched_shapes_are_reported_not_mixed() {
        let results = on_ranks(2, LONG, |rank, mut c| {
            let len = if rank == 0 { 2 } else { 3 };
            c.all_reduce(tensor(&vec![1.0; len]), ReduceOp::Sum)
        });
        assert!(results.iter().all(Result::is_err), "{results:?}");
        assert!(
            results
                .iter()
                .any(|r| matches!(r, Err(CollectiveError::Mismatch { .. })))
        );
    }

    #[test]
    fn invalid_root_is_an_error() {
        let mut c = InProcess::<Flex>::group(1, LONG).pop().unwrap();
        assert_eq!(
            c.broadcast(tensor(&[1.0]), 1).unwrap_err(),
            CollectiveError::InvalidRoot {
                root: 1,
                world_size: 1
            }
        );
    }
}
