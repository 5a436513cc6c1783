//! Burn's data loaders hand over collated batches, while Kiln's strategies read samples by
//! index from a [`DataSource`]. A feed bridges the two: each step the adapter puts one batch
//! in each numbered slot, and the strategy's data source reads slot `i` as sample `i`, so every
//! rank (and every micro-batch) gets exactly the batch meant for it.

use std::sync::{Arc, Mutex, PoisonError};

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::tensor::backend::Backend;

use crate::data::DataSource;

/// Numbered slots of batches, shared by the adapter (which fills them) and the ranks (which
/// each take theirs).
pub(crate) struct Feed<I> {
    slots: Arc<Mutex<Vec<Option<I>>>>,
}

impl<I: Send + 'static> Feed<I> {
    pub fn new() -> Self {
        Self {
            slots: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Puts `batches` in slots `0..batches.len()`, replacing whatever was there.
    pub fn fill(&self, batches: Vec<I>) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        *slots = batches.into_iter().map(Some).collect();
    }

    /// The data source over `slots` slots that a strategy reads.
    pub fn source<B: Backend>(&self, slots: usize) -> DataSource<B, usize, I> {
        DataSource::new(
            InMemDataset::new((0..slots).collect()),
            SlotBatcher {
                slots: Arc::clone(&self.slots),
            },
        )
    }
}

/// Hands out the batch in a slot; a "batch" of slots is exactly one slot, because the feed
/// fills one slot per rank and micro-batch.
struct SlotBatcher<I> {
    slots: Arc<Mutex<Vec<Option<I>>>>,
}

impl<B: Backend, I: Send> Batcher<B, usize, I> for SlotBatcher<I> {
    fn batch(&self, items: Vec<usize>, _device: &B::Device) -> I {
        // Both panics are bugs in the adapter, not bad input: the slot count and the strategy's
        // micro-batching are set together in `KilnLearning::new`. A rank turns a panic into its
        // error, naming this message.
        let [slot] = items[..] else {
            panic!(
                "a Kiln feed slot is one whole batch, but a rank asked for {} slots at once",
                items.len()
            );
        };
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(slot)
            .and_then(Option::take)
            .unwrap_or_else(|| panic!("feed slot {slot} was read twice or never filled"))
    }
}
