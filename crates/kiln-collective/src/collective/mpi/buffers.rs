//! Receive buffers kept from one call to the next of the same size.
//!
//! An all-reduce needs a buffer apart from its input (rsmpi has no `MPI_IN_PLACE`). A fresh
//! one costs its allocation and, on first touch, a page fault per page: on 25 MB that was 10
//! to 25 % of the whole call. A training step all-reduces the same buckets every step, so the
//! spent input of one call, whose pages are already mapped, receives the next call of its size.

use burn::tensor::{Element, TensorData};

/// At most this many bytes of buffers are kept; the oldest go first.
const KEEP_BYTES: usize = 512 << 20;

/// Spent inputs, oldest first, waiting for a call of their size.
#[derive(Default)]
pub(super) struct ReceiveBuffers {
    kept: Vec<TensorData>,
    bytes: usize,
}

impl ReceiveBuffers {
    /// A buffer for `like`'s values (same dtype and shape): a kept one of that size, else
    /// a fresh one. Its contents are to be overwritten.
    pub fn take<T: Element + Default + Copy>(&mut self, like: &TensorData) -> TensorData {
        let found = self.kept.iter().position(|kept| {
            kept.dtype == like.dtype && kept.as_bytes().len() == like.as_bytes().len()
        });
        match found {
            Some(i) => {
                let mut kept = self.kept.remove(i);
                self.bytes -= kept.as_bytes().len();
                kept.shape = like.shape.clone();
                kept
            }
            None => TensorData::new(vec![T::default(); like.num_elements()], like.shape.clone()),
        }
    }

    /// Keeps `spent` for a later call of its size, within the budget.
    pub fn keep(&mut self, spent: TensorData) {
        let size = spent.as_bytes().len();
        if size > KEEP_BYTES {
            return;
        }
        self.bytes += size;
        self.kept.push(spent);
        while self.bytes > KEEP_BYTES {
            let oldest = self.kept.remove(0);
            self.bytes -= oldest.as_bytes().len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_input_receives_the_next_call_of_its_size_only() {
        let mut buffers = ReceiveBuffers::default();
        let input = TensorData::new(vec![1f32, 2.0, 3.0], [3]);
        let fresh = buffers.take::<f32>(&input);
        assert_eq!(fresh.as_slice::<f32>().unwrap(), [0.0; 3]);
        buffers.keep(input);
        let other = TensorData::new(vec![0f32; 2], [2]);
        assert_eq!(buffers.take::<f32>(&other).num_elements(), 2);
        let doubles = TensorData::new(vec![0f64; 3], [3]);
        assert_eq!(buffers.take::<f64>(&doubles).dtype, doubles.dtype);
        // The kept one, shaped like the asker.
        let asker = TensorData::new(vec![0f32; 3], [1, 3]);
        let reused = buffers.take::<f32>(&asker);
        assert_eq!(reused.as_slice::<f32>().unwrap(), [1.0, 2.0, 3.0]);
        assert_eq!(reused.shape, asker.shape);
        assert!(buffers.kept.is_empty());
    }

    #[test]
    fn the_oldest_go_past_the_budget() {
        let mut buffers = ReceiveBuffers::default();
        let quarter = KEEP_BYTES / 4 / 4;
        for _ in 0..5 {
            buffers.keep(TensorData::new(vec![0f32; quarter], [quarter]));
        }
        assert_eq!(buffers.kept.len(), 4);
        assert_eq!(buffers.bytes, KEEP_BYTES);
        buffers.keep(TensorData::new(vec![0u8; KEEP_BYTES + 1], [KEEP_BYTES + 1]));
        assert_eq!(buffers.kept.len(), 4, "too large to keep");
    }
}
