//! A data set plus the batcher that turns its items into a model input on a device.

use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;

use super::DataError;

/// Items of a Burn [`Dataset`] and the Burn [`Batcher`] that turns a list of them into a
/// model input, shared by every rank. Cloning is cheap (two `Arc`s).
pub struct DataSource<B: Backend, I, O> {
    dataset: Arc<dyn Dataset<I>>,
    batcher: Arc<dyn Batcher<B, I, O>>,
}

impl<B: Backend, I, O> Clone for DataSource<B, I, O> {
    fn clone(&self) -> Self {
        Self {
            dataset: self.dataset.clone(),
            batcher: self.batcher.clone(),
        }
    }
}

impl<B: Backend, I, O> DataSource<B, I, O> {
    /// Pairs a data set with its batcher.
    pub fn new(
        dataset: impl Dataset<I> + 'static,
        batcher: impl Batcher<B, I, O> + 'static,
    ) -> Self {
        Self {
            dataset: Arc::new(dataset),
            batcher: Arc::new(batcher),
        }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.dataset.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.dataset.is_empty()
    }

    /// Reads the samples at `indices` and batches them on `device`.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] for an index past the end.
    pub fn load(&self, indices: &[usize], device: &B::Device) -> Result<O, DataError> {
        let len = self.dataset.len();
        let items = indices
            .iter()
            .map(|&index| {
                self.dataset
                    .get(index)
                    .ok_or(DataError::IndexOutOfRange { index, len })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.batcher.batch(items, device))
    }
}
