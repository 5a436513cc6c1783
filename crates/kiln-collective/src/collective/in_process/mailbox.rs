//! Point-to-point messages: one FIFO queue per (sender, receiver) pair under the group's lock.
//!
//! A send synchronises its device (the receiver's thread reads the tensor next), appends to
//! the queue and wakes the waiters; it never blocks, like a buffered MPI send, so a pipeline
//! stage can run ahead of its neighbour by as many messages as its schedule allows. A receive
//! waits with the group's deadline for the head of its queue, checks its length, and moves it
//! to the receiver's device. A failed group releases every waiting receiver at once.

use std::time::Instant;

use burn::tensor::{Tensor, backend::Backend};

use super::InProcess;
use crate::collective::{CollectiveError, CollectiveOp};

impl<B: Backend> InProcess<B> {
    fn check_peer(&self, op: CollectiveOp, peer: usize) -> Result<(), CollectiveError> {
        let world_size = self.shared.world_size;
        if peer < world_size {
            Ok(())
        } else {
            Err(CollectiveError::InvalidPeer {
                op,
                peer,
                world_size,
            })
        }
    }

    /// Hands `tensor` to rank `to`'s queue from this rank.
    pub(super) fn post(&mut self, tensor: Tensor<B, 1>, to: usize) -> Result<(), CollectiveError> {
        let op = CollectiveOp::Send { to };
        self.check_peer(op, to)?;
        let seq = self.sent[to];
        self.sent[to] += 1;
        self.counters.calls += 1;
        self.counters.elements += tensor.dims()[0] as u64;
        self.sync(op, seq, &tensor.device())?;
        let mut state = self.lock();
        if let Some(failure) = &state.failure {
            return Err(self.peer_failed(op, seq, failure));
        }
        state.mail[self.rank * self.shared.world_size + to].push_back(tensor);
        self.shared.wake.notify_all();
        Ok(())
    }

    /// Takes the next message from rank `from`, which must hold `elements` values.
    pub(super) fn take(
        &mut self,
        from: usize,
        elements: usize,
        device: &B::Device,
    ) -> Result<Tensor<B, 1>, CollectiveError> {
        let op = CollectiveOp::Recv { from };
        self.check_peer(op, from)?;
        let seq = self.received[from];
        self.received[from] += 1;
        self.counters.calls += 1;
        let deadline = Instant::now() + self.shared.timeout;
        let queue = from * self.shared.world_size + self.rank;
        let mut state = self.lock();
        loop {
            // Messages already sent are delivered even after a failure elsewhere: they are
            // complete, and the failure surfaces at the next call that must wait.
            if let Some(tensor) = state.mail[queue].pop_front() {
                let got = tensor.dims()[0];
                if got != elements {
                    let error = CollectiveError::Mismatch {
                        seq,
                        rank: self.global(self.rank),
                        op,
                        elements,
                        other_rank: self.global(from),
                        other_op: CollectiveOp::Send { to: self.rank },
                        other_elements: got,
                    };
                    self.record_failure(&mut state, self.rank, error.to_string());
                    return Err(error);
                }
                drop(state);
                return self.own(op, seq, tensor, device);
            }
            if let Some(failure) = &state.failure {
                return Err(self.peer_failed(op, seq, failure));
            }
            let now = Instant::now();
            if now >= deadline {
                let reason = format!(
                    "never sent message #{seq} to rank {} within {:?}",
                    self.rank, self.shared.timeout
                );
                self.record_failure(&mut state, from, reason);
                return Err(CollectiveError::Timeout {
                    op,
                    seq,
                    rank: self.global(self.rank),
                    missing: vec![self.global(from)],
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
