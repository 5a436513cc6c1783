//! The held-out loss of a [`CausalLm`]: what `kiln finetune --eval-data` reports to choose a
//! step by and to see over-fitting.

use burn::data::dataloader::batcher::Batcher;
use burn::tensor::ElementConversion;

use super::train::per_sequence_losses;
use super::{CausalLm, LmBatcher, LmItem};
use crate::tensor_parallel::ShardedBackend;

/// A model's loss over a held-out set.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct EvalLoss {
    /// The mean over the set's sequences of each sequence's mean cross-entropy over its
    /// trained targets: the training loss's measure, so the two curves compare.
    pub loss: f64,
    /// Sequences evaluated.
    pub sequences: usize,
    /// Targets the loss counts.
    pub tokens: usize,
}

impl EvalLoss {
    /// `exp(loss)`: the perplexity of the set's average sequence.
    pub fn perplexity(&self) -> f64 {
        self.loss.exp()
    }
}

impl<B: ShardedBackend> CausalLm<B> {
    /// The loss of `items`, `batch` sequences a forward pass, each batch padded to its
    /// longest (at most `max_len` tokens), on `device`. No gradient is taken: call it on
    /// the inference model (`valid()`).
    ///
    /// # Panics
    /// When `items` is empty or `batch` is 0.
    pub fn eval_loss(
        &self,
        items: &[LmItem],
        batch: usize,
        max_len: usize,
        device: &B::Device,
    ) -> EvalLoss {
        assert!(!items.is_empty() && batch > 0, "an eval set and a batch");
        let batcher = LmBatcher::new(max_len);
        let mut sum = 0.0;
        for chunk in items.chunks(batch) {
            let batch: super::LmBatch<B> = batcher.batch(chunk.to_vec(), device);
            let logits = self.forward_packed(batch.inputs, batch.packed.as_ref());
            let losses = per_sequence_losses(logits, batch.targets, batch.mask);
            sum += losses.sum().into_scalar().elem::<f64>();
        }
        EvalLoss {
            loss: sum / items.len() as f64,
            sequences: items.len(),
            tokens: items
                .iter()
                .map(|item| item.trained.iter().filter(|&&t| t).count())
                .sum(),
        }
    }
}
