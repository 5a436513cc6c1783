//! Group operations as rounds of a rendezvous: every rank deposits its input, the last to
//! arrive combines them in rank order and publishes the output, and every rank takes it.

use std::time::Instant;

use burn::tensor::{Tensor, backend::Backend};

use super::{Call, InProcess, State};
use crate::collective::{CollectiveError, CollectiveOp, ReduceOp};

impl<B: Backend> InProcess<B> {
    /// One round: deposit `input`, wait for every rank, return the combined output.
    pub(super) fn rendezvous(
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
            self.sync(op, seq, device)?;
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
                    rank: self.global(self.rank),
                })
            }
            Some(first) if first.op != op || first.elements != elements => {
                let error = CollectiveError::Mismatch {
                    seq,
                    rank: self.global(self.rank),
                    op,
                    elements,
                    other_rank: self.global(first.rank),
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
                    rank: self.global(self.rank),
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
                let output = take_output(&mut state, self.shared.world_size);
                drop(state);
                // A reduction's result is the root's alone: the others copy nothing.
                let output = match op {
                    CollectiveOp::Reduce { root, .. } if root != self.rank => None,
                    _ => output,
                };
                return match (output, device) {
                    (Some(output), Some(device)) => self.own(op, seq, output, &device).map(Some),
                    (output, _) => Ok(output),
                };
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
                    rank: self.global(self.rank),
                    missing: missing.into_iter().map(|r| self.global(r)).collect(),
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
        CollectiveOp::Send { .. } | CollectiveOp::Recv { .. } => {
            unreachable!("point-to-point calls go through the mailboxes, not rounds")
        }
        CollectiveOp::Broadcast { root } => inputs.into_iter().nth(root).flatten(),
        CollectiveOp::AllGather => {
            let inputs: Vec<_> = inputs.into_iter().flatten().collect();
            let device = inputs[0].device();
            let inputs = inputs.into_iter().map(|t| t.to_device(&device)).collect();
            Some(Tensor::cat(inputs, 0))
        }
        // Each rank slices its chunk of the full reduction once it takes the output.
        CollectiveOp::AllReduce(reduce)
        | CollectiveOp::ReduceScatter(reduce)
        | CollectiveOp::Reduce { op: reduce, .. } => {
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
