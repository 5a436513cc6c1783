//! Sequences of tokens with the positions their loss counts, and their batches.

use burn::data::dataloader::batcher::Batcher;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_core::data::dense_tensor;

/// `seq_len + 1` tokens: inputs are the first `seq_len`, targets the last `seq_len`, and
/// `trained[i]` says whether target `i` counts in the loss.
#[derive(Debug, Clone, PartialEq)]
pub struct LmItem {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// One flag per target.
    pub trained: Vec<bool>,
}

impl LmItem {
    /// The item of a stream of `(token, trained)` pairs (the first token's flag is unused:
    /// no position predicts it).
    pub fn from_stream(stream: &[(u32, bool)]) -> Self {
        Self {
            tokens: stream.iter().map(|&(t, _)| t).collect(),
            trained: stream.iter().skip(1).map(|&(_, t)| t).collect(),
        }
    }

    /// An item training every target.
    pub fn all_trained(tokens: Vec<u32>) -> Self {
        let trained = vec![true; tokens.len().saturating_sub(1)];
        Self { tokens, trained }
    }
}

/// A batch of [`LmItem`]s on a device.
#[derive(Debug, Clone)]
pub struct LmBatch<B: Backend> {
    /// `[batch, seq]` input tokens.
    pub inputs: Tensor<B, 2, Int>,
    /// `[batch, seq]` next tokens.
    pub targets: Tensor<B, 2, Int>,
    /// `[batch, seq]`: 1 where the target counts in the loss, else 0.
    pub mask: Tensor<B, 2>,
}

/// Stacks [`LmItem`]s of one length into an [`LmBatch`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LmBatcher;

impl<B: Backend> Batcher<B, LmItem, LmBatch<B>> for LmBatcher {
    fn batch(&self, items: Vec<LmItem>, device: &B::Device) -> LmBatch<B> {
        let n = items.len();
        let seq = items.first().map_or(0, |i| i.trained.len());
        let tokens = |range: fn(&LmItem, usize) -> &[u32]| -> Vec<i64> {
            items
                .iter()
                .flat_map(|item| range(item, seq).iter().map(|&t| i64::from(t)))
                .collect()
        };
        let inputs = tokens(|item, seq| &item.tokens[..seq]);
        let targets = tokens(|item, _| &item.tokens[1..]);
        let mask: Vec<f32> = items
            .iter()
            .flat_map(|item| item.trained.iter().map(|&t| f32::from(u8::from(t))))
            .collect();
        LmBatch {
            inputs: dense_tensor(TensorData::new(inputs, [n, seq]), device),
            targets: dense_tensor(TensorData::new(targets, [n, seq]), device),
            mask: dense_tensor(TensorData::new(mask, [n, seq]), device),
        }
    }
}
