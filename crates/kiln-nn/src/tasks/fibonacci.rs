//! Next-token prediction on Fibonacci sequences modulo the vocabulary:
//! `t[i] = (t[i-1] + t[i-2]) mod vocab` from two random seeds, so every token after the
//! second is predictable by attending to the two before it.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_core::data::dense_tensor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One sequence of `len + 1` tokens: inputs are the first `len`, targets the last `len`.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceItem {
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// A batch of [`SequenceItem`]s on a device.
#[derive(Debug, Clone)]
pub struct SequenceBatch<B: Backend> {
    /// `[batch, seq]` input tokens.
    pub inputs: Tensor<B, 2, Int>,
    /// `[batch, seq]` next tokens.
    pub targets: Tensor<B, 2, Int>,
}

/// Builds the Fibonacci data set.
#[derive(Debug, Clone)]
pub struct FibonacciTask {
    /// Sequences.
    pub samples: usize,
    /// Input length of each sequence.
    pub len: usize,
    /// Vocabulary (the modulus).
    pub vocab: u32,
    /// Seed of the first two tokens.
    pub seed: u64,
}

impl FibonacciTask {
    /// Generates the sequences.
    pub fn dataset(&self) -> InMemDataset<SequenceItem> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let items = (0..self.samples)
            .map(|_| {
                let mut tokens = vec![
                    rng.random_range(0..self.vocab),
                    rng.random_range(0..self.vocab),
                ];
                while tokens.len() < self.len + 1 {
                    let n = tokens.len();
                    tokens.push((tokens[n - 1] + tokens[n - 2]) % self.vocab);
                }
                tokens.truncate(self.len + 1);
                SequenceItem { tokens }
            })
            .collect();
        InMemDataset::new(items)
    }
}

/// Stacks [`SequenceItem`]s into a [`SequenceBatch`].
#[derive(Debug, Clone, Default)]
pub struct SequenceBatcher;

impl<B: Backend> Batcher<B, SequenceItem, SequenceBatch<B>> for SequenceBatcher {
    fn batch(&self, items: Vec<SequenceItem>, device: &B::Device) -> SequenceBatch<B> {
        let n = items.len();
        let seq = items.first().map_or(0, |i| i.tokens.len() - 1);
        let inputs: Vec<i64> = items
            .iter()
            .flat_map(|i| i.tokens[..seq].iter().map(|&t| i64::from(t)))
            .collect();
        let targets: Vec<i64> = items
            .iter()
            .flat_map(|i| i.tokens[1..].iter().map(|&t| i64::from(t)))
            .collect();
        SequenceBatch {
            inputs: dense_tensor(TensorData::new(inputs, [n, seq]), device),
            targets: dense_tensor(TensorData::new(targets, [n, seq]), device),
        }
    }
}
