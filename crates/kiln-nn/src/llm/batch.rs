//! Sequences of tokens with the positions their loss counts, and their batches.

use burn::data::dataloader::batcher::Batcher;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use kiln_core::data::dense_tensor;

/// `n + 1` tokens: inputs are the first `n`, targets the last `n`, and `trained[i]` says
/// whether target `i` counts in the loss. Items of a batch may differ in length.
///
/// A packed item holds several examples side by side (`starts`): each attends only to its own
/// tokens, at positions counted from its own first token, so that it computes what it would
/// alone. The target of an example's last input is the next example's first token, which is
/// never trained.
#[derive(Debug, Clone, PartialEq)]
pub struct LmItem {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// One flag per target.
    pub trained: Vec<bool>,
    /// The token at which each packed example begins, increasing from 0; empty for an item of
    /// one example (as `[0]`).
    pub starts: Vec<usize>,
}

impl LmItem {
    /// The item of a stream of `(token, trained)` pairs (the first token's flag is unused:
    /// no position predicts it).
    pub fn from_stream(stream: &[(u32, bool)]) -> Self {
        Self {
            tokens: stream.iter().map(|&(t, _)| t).collect(),
            trained: stream.iter().skip(1).map(|&(_, t)| t).collect(),
            starts: Vec::new(),
        }
    }

    /// The item of examples' streams packed side by side, none attending to another.
    pub fn packed<'a>(examples: impl IntoIterator<Item = &'a [(u32, bool)]>) -> Self {
        let mut stream = Vec::new();
        let mut starts = Vec::new();
        for example in examples {
            starts.push(stream.len());
            // An example's first token is never a target, not even of the one before.
            stream.extend(
                example
                    .iter()
                    .enumerate()
                    .map(|(i, &(t, trained))| (t, trained && i > 0)),
            );
        }
        Self {
            starts: if starts.len() > 1 { starts } else { Vec::new() },
            ..Self::from_stream(&stream)
        }
    }

    /// An item training every target.
    pub fn all_trained(tokens: Vec<u32>) -> Self {
        let trained = vec![true; tokens.len().saturating_sub(1)];
        Self {
            tokens,
            trained,
            starts: Vec::new(),
        }
    }

    /// How many examples it holds.
    pub fn examples(&self) -> usize {
        self.starts.len().max(1)
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
    /// Where the examples of packed rows begin; `None` when every row is one example.
    pub packed: Option<PackedRows<B>>,
}

/// The examples of packed rows ([`LmItem::starts`]), for the attention and the rotary
/// positions. A row's pads form an example of their own.
#[derive(Debug, Clone)]
pub struct PackedRows<B: Backend> {
    /// `[batch, seq]`: the position at which each input's example begins in its row.
    pub starts: Tensor<B, 2, Int>,
    /// `[batch, seq]`: each input's position within its example.
    pub positions: Tensor<B, 2, Int>,
}

impl<B: AutodiffBackend> PackedRows<B> {
    /// The same rows on the inner backend.
    pub fn inner(&self) -> PackedRows<B::InnerBackend> {
        PackedRows {
            starts: self.starts.clone().inner(),
            positions: self.positions.clone().inner(),
        }
    }
}

impl<B: Backend> PackedRows<B> {
    /// The rows of `items` padded to `seq` inputs, or `None` when none is packed.
    fn of(items: &[LmItem], seq: usize, device: &B::Device) -> Option<Self> {
        if items.iter().all(|item| item.starts.is_empty()) {
            return None;
        }
        let n = items.len();
        let (mut starts, mut positions) =
            (Vec::with_capacity(n * seq), Vec::with_capacity(n * seq));
        for item in items {
            let len = item.trained.len();
            let mut examples = item.starts.iter().copied().skip(1).peekable();
            let mut start = 0;
            for i in 0..seq {
                if i == len {
                    start = len;
                } else if examples.peek() == Some(&i) {
                    start = i;
                    examples.next();
                }
                starts.push(start as i64);
                positions.push((i - start) as i64);
            }
        }
        Some(Self {
            starts: dense_tensor(TensorData::new(starts, [n, seq]), device),
            positions: dense_tensor(TensorData::new(positions, [n, seq]), device),
        })
    }
}

/// Stacks [`LmItem`]s into an [`LmBatch`], padding each to the batch's longest (as
/// transformers' collators do), rounded up to a multiple of [`LmBatcher::MULTIPLE`] where that
/// stays within the longest sequence the run allows: a batch of short examples computes short
/// sequences. Pads come after each sequence and are never targets, so under causal attention
/// they change no other position's result.
#[derive(Debug, Clone, Copy)]
pub struct LmBatcher {
    max_len: usize,
}

impl LmBatcher {
    /// The multiple batches are padded to: the matmul kernels' tile of rows.
    pub const MULTIPLE: usize = 8;

    /// Pads to at most `max_len` positions (the run's `--seq-len`), unless an item is longer.
    pub fn new(max_len: usize) -> Self {
        Self { max_len }
    }

    /// The positions of a batch whose longest item has `longest` targets.
    pub fn padded_len(&self, longest: usize) -> usize {
        let rounded = longest.div_ceil(Self::MULTIPLE) * Self::MULTIPLE;
        if rounded <= self.max_len {
            rounded
        } else {
            longest
        }
    }
}

impl<B: Backend> Batcher<B, LmItem, LmBatch<B>> for LmBatcher {
    fn batch(&self, items: Vec<LmItem>, device: &B::Device) -> LmBatch<B> {
        let n = items.len();
        let longest = items.iter().map(|i| i.trained.len()).max().unwrap_or(0);
        let seq = self.padded_len(longest);
        let mut inputs = Vec::with_capacity(n * seq);
        let mut targets = Vec::with_capacity(n * seq);
        let mut mask = Vec::with_capacity(n * seq);
        for item in &items {
            let len = item.trained.len();
            inputs.extend(item.tokens[..len].iter().map(|&t| i64::from(t)));
            targets.extend(item.tokens[1..].iter().map(|&t| i64::from(t)));
            mask.extend(item.trained.iter().map(|&t| f32::from(u8::from(t))));
            // Token 0 pads: any id the embedding holds; no loss reads it.
            inputs.resize(inputs.len() + seq - len, 0);
            targets.resize(targets.len() + seq - len, 0);
            mask.resize(mask.len() + seq - len, 0.0);
        }
        LmBatch {
            inputs: dense_tensor(TensorData::new(inputs, [n, seq]), device),
            targets: dense_tensor(TensorData::new(targets, [n, seq]), device),
            mask: dense_tensor(TensorData::new(mask, [n, seq]), device),
            packed: PackedRows::of(&items, seq, device),
        }
    }
}
