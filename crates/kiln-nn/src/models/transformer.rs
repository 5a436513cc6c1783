//! A small causal (decoder-only) transformer over tokens: the shape of the Algorithm
//! Distillation model, built from Burn's own transformer layers.

use burn::config::Config;
use burn::module::Module;
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderLayer,
};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{FloatDType, Int, Tensor};
use burn::train::{SequenceOutput, TrainOutput, TrainStep};

use kiln_core::model::LowPrecisionStep;

use crate::tasks::SequenceBatch;

/// Configuration of [`Transformer`].
#[derive(Config, Debug)]
pub struct TransformerConfig {
    /// Token vocabulary.
    #[config(default = 16)]
    pub vocab: usize,
    /// Longest sequence (positions).
    #[config(default = 16)]
    pub max_len: usize,
    /// Model width.
    #[config(default = 32)]
    pub d_model: usize,
    /// Feed-forward width.
    #[config(default = 64)]
    pub d_ff: usize,
    /// Attention heads.
    #[config(default = 4)]
    pub heads: usize,
    /// Layers.
    #[config(default = 2)]
    pub layers: usize,
}

impl TransformerConfig {
    /// Builds the model on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Transformer<B> {
        Transformer {
            tokens: EmbeddingConfig::new(self.vocab, self.d_model).init(device),
            positions: EmbeddingConfig::new(self.max_len, self.d_model).init(device),
            blocks: TransformerEncoderConfig::new(self.d_model, self.d_ff, self.heads, self.layers)
                .with_dropout(0.0)
                .with_norm_first(true)
                .init(device),
            head: LinearConfig::new(self.d_model, self.vocab).init(device),
        }
    }
}

/// Token and position embeddings → pre-norm causal transformer → vocabulary logits, trained
/// on next-token cross-entropy at every position.
///
/// # Shapes
/// Input `[batch, seq]` token ids with `seq ≤ max_len`, output `[batch, seq, vocab]`.
#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    pub(super) tokens: Embedding<B>,
    pub(super) positions: Embedding<B>,
    pub(super) blocks: TransformerEncoder<B>,
    pub(super) head: Linear<B>,
}

impl<B: Backend> Transformer<B> {
    /// Next-token logits at every position.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let x = embed(&self.tokens, &self.positions, tokens);
        let x = run_layers(&self.blocks.layers, x);
        self.head.forward(x)
    }

    pub fn forward_sequence(&self, batch: SequenceBatch<B>) -> SequenceOutput<B> {
        let logits = self.forward(batch.inputs);
        let loss = sequence_loss(logits.clone(), batch.targets.clone());
        SequenceOutput::new(loss, logits, None, batch.targets)
    }
}

/// Token plus learned position embeddings: `[batch, seq]` → `[batch, seq, d_model]`.
pub(super) fn embed<B: Backend>(
    tokens: &Embedding<B>,
    positions: &Embedding<B>,
    input: Tensor<B, 2, Int>,
) -> Tensor<B, 3> {
    let [batch, seq] = input.dims();
    let device = input.device();
    let position_ids = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
        .reshape([1, seq])
        .repeat_dim(0, batch);
    tokens.forward(input) + positions.forward(position_ids)
}

/// Causal pre-norm encoder layers over `[batch, seq, d_model]`.
pub(super) fn run_layers<B: Backend>(
    layers: &[TransformerEncoderLayer<B>],
    x: Tensor<B, 3>,
) -> Tensor<B, 3> {
    let [batch, seq, _] = x.dims();
    let mask = generate_autoregressive_mask::<B>(batch, seq, &x.device());
    layers
        .iter()
        .fold(x, |x, layer| layer.forward(x, None, Some(mask.clone())))
}

/// Mean cross-entropy of `[batch, seq, vocab]` logits against `[batch, seq]` targets.
pub(super) fn sequence_loss<B: Backend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
) -> Tensor<B, 1> {
    let [b, s, v] = logits.dims();
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits.reshape([b * s, v]), targets.reshape([b * s]))
}

impl<B: AutodiffBackend> LowPrecisionStep<B> for Transformer<B> {
    fn forward_in(&self, batch: SequenceBatch<B>, _dtype: FloatDType) -> SequenceOutput<B> {
        // The inputs are token ids: the cast parameters carry the dtype. The loss is in f32.
        let logits = self.forward(batch.inputs).cast(FloatDType::F32);
        let loss = sequence_loss(logits.clone(), batch.targets.clone());
        SequenceOutput::new(loss, logits, None, batch.targets)
    }
}

impl<B: AutodiffBackend> TrainStep for Transformer<B> {
    type Input = SequenceBatch<B>;
    type Output = SequenceOutput<B>;

    fn step(&self, batch: SequenceBatch<B>) -> TrainOutput<SequenceOutput<B>> {
        let output = self.forward_sequence(batch);
        TrainOutput::new(self, output.loss.backward(), output)
    }
}
