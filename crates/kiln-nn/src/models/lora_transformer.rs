//! A small causal language model whose blocks are [`LoraBlock`]s: the fine-tuning case
//! (frozen bases, trainable adapters) for every Kiln strategy, and a user of every fused op
//! (QLoRA matmul, RMSNorm, SwiGLU, cross-entropy).

use burn::config::Config;
use burn::module::{AutodiffModule, Module};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use burn::train::{SequenceOutput, TrainOutput, TrainStep};
use kiln_kernels::{KernelBackend, ops};

use super::transformer::embed;
use crate::layers::{SequenceBlock, run_blocks};
use crate::lora::{LoraBlock, LoraBlockConfig, LoraConfig, LoraKind};
use crate::tasks::SequenceBatch;

/// Sizes of a [`LoraTransformer`].
#[derive(Config, Debug)]
pub struct LoraTransformerConfig {
    /// Token vocabulary.
    #[config(default = 16)]
    pub vocab: usize,
    /// Longest sequence.
    #[config(default = 16)]
    pub max_len: usize,
    /// Model width.
    #[config(default = 32)]
    pub d_model: usize,
    /// SwiGLU hidden width.
    #[config(default = 64)]
    pub d_ff: usize,
    /// Attention heads.
    #[config(default = 4)]
    pub heads: usize,
    /// Blocks.
    #[config(default = 2)]
    pub layers: usize,
    /// The adapters.
    #[config(default = "LoraConfig::new()")]
    pub lora: LoraConfig,
    /// Dense or 4-bit bases.
    #[config(default = "LoraKind::Lora")]
    pub kind: LoraKind,
}

impl LoraTransformerConfig {
    /// Trainable embeddings and head around frozen-base LoRA blocks.
    pub fn init<B: KernelBackend>(&self, device: &B::Device) -> LoraTransformer<B> {
        let block = LoraBlockConfig::new(
            self.d_model,
            self.heads,
            self.d_ff,
            self.lora.clone(),
            self.kind.clone(),
        );
        LoraTransformer {
            tokens: EmbeddingConfig::new(self.vocab, self.d_model).init(device),
            positions: EmbeddingConfig::new(self.max_len, self.d_model).init(device),
            blocks: (0..self.layers).map(|_| block.init(device)).collect(),
            head: LinearConfig::new(self.d_model, self.vocab).init(device),
        }
    }
}

/// The LoRA transformer: token and position embeddings, [`LoraBlock`]s, a linear head; trained
/// with the fused softmax cross-entropy.
pub type LoraTransformer<B> = LoraModel<B, LoraBlock<B>>;

/// Token and position embeddings, a stack of blocks `L`, a linear head: the whole model with
/// [`LoraBlock`]s ([`LoraTransformer`]), or a tensor-parallel shard of it with
/// [`TpLoraBlock`](crate::tensor_parallel::TpLoraBlock)s
/// ([`TpLoraTransformer`](super::TpLoraTransformer)). Both run the same forward, step and
/// pipeline stages.
#[derive(Module, Debug)]
pub struct LoraModel<B: Backend, L: Module<B>> {
    pub(super) tokens: Embedding<B>,
    pub(super) positions: Embedding<B>,
    /// The blocks, for their adapters.
    pub blocks: Vec<L>,
    pub(super) head: Linear<B>,
}

impl<B: KernelBackend, L: SequenceBlock<B>> LoraModel<B, L> {
    /// Logits `[batch, seq, vocab]` (the same on every shard).
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let x = embed(&self.tokens, &self.positions, tokens);
        self.head.forward(run_blocks(&self.blocks, x))
    }

    /// Mean next-token cross-entropy over every position.
    pub fn forward_sequence(&self, batch: SequenceBatch<B>) -> SequenceOutput<B> {
        let logits = self.forward(batch.inputs);
        let loss = fused_sequence_loss(logits.clone(), batch.targets.clone());
        SequenceOutput::new(loss, logits, None, batch.targets)
    }
}

/// Mean cross-entropy of `[batch, seq, vocab]` logits against `[batch, seq]` targets, through
/// the fused kernel.
pub(super) fn fused_sequence_loss<B: KernelBackend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
) -> Tensor<B, 1> {
    let [b, s, v] = logits.dims();
    ops::cross_entropy(logits.reshape([b * s, v]), targets.reshape([b * s]))
        .unwrap_or_else(|e| panic!("{e}"))
        .mean()
}

impl<B, L> TrainStep for LoraModel<B, L>
where
    B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend,
    L: SequenceBlock<B>,
    Self: AutodiffModule<B>,
{
    type Input = SequenceBatch<B>;
    type Output = SequenceOutput<B>;

    fn step(&self, batch: SequenceBatch<B>) -> TrainOutput<SequenceOutput<B>> {
        let output = self.forward_sequence(batch);
        TrainOutput::new(self, output.loss.backward(), output)
    }
}
