//! What one training step asks of the hardware: parameters, FLOPs and activation bytes, from a
//! transformer's shape or given as they are.

use serde::{Deserialize, Serialize};

use crate::optim::Precision;

/// A transformer by its shape, as a Hugging Face `config.json` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransformerShape {
    /// Blocks.
    pub layers: usize,
    /// Model width.
    pub hidden: usize,
    /// Attention (query) heads.
    pub heads: usize,
    /// Key and value heads: fewer than `heads` under grouped-query attention.
    pub kv_heads: usize,
    /// Width of one head (`hidden / heads` in most models; some configs set it apart).
    pub head_dim: usize,
    /// The query, key and value projections have biases (Qwen2).
    pub qkv_bias: bool,
    /// The attention's output projection has a bias.
    pub o_bias: bool,
    /// Width of the feed-forward layer.
    pub ffn: usize,
    /// Tokens per sample.
    pub seq: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// A gated feed-forward (SwiGLU: three matrices instead of two), as in LLaMA.
    pub gated: bool,
    /// The output head shares the embedding's weights.
    pub tied: bool,
}

impl TransformerShape {
    /// The largest value of each size the planner takes: beyond every published model, and
    /// small enough that every parameter count below stays exact in 64 bits (the largest
    /// block is under 2^44 parameters, the largest model under 2^56) and every FLOP and byte
    /// count is a finite `f64`, growing with every size (the cost tests check both at every
    /// corner of these limits).
    pub const LIMITS: [(&'static str, usize); 8] = [
        ("layers", 1 << 12),
        ("hidden", 1 << 17),
        ("heads", 1 << 12),
        ("kv_heads", 1 << 12),
        ("head_dim", 1 << 12),
        ("ffn", 1 << 19),
        ("seq", 1 << 24),
        ("vocab", 1 << 22),
    ];

    /// Checks every size against [`Self::LIMITS`] and that none is zero.
    ///
    /// # Errors
    /// The first size out of range, by its name here, with the range.
    pub fn check(&self) -> Result<(), String> {
        let values = [
            self.layers,
            self.hidden,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.ffn,
            self.seq,
            self.vocab,
        ];
        for ((name, max), value) in Self::LIMITS.iter().zip(values) {
            if value == 0 || value > *max {
                return Err(format!(
                    "{name} is {value}; the planner takes 1 to {max} (beyond every published \
                     model)"
                ));
            }
        }
        Ok(())
    }

    /// Widths of all query heads together and of all key (or value) heads together.
    fn attention_widths(&self) -> (u64, u64) {
        let d = self.head_dim as u64;
        (self.heads as u64 * d, self.kv_heads as u64 * d)
    }

    /// Parameters of one block: the query and output projections (`h × heads · head_dim`
    /// each), the key and value projections (`h × kv_heads · head_dim` each), their biases
    /// where the model has them, the feed-forward's two or three `h × ffn` matrices, two norms.
    pub fn block_params(&self) -> u64 {
        let (h, f) = (self.hidden as u64, self.ffn as u64);
        let (q, kv) = self.attention_widths();
        let matrices = if self.gated { 3 } else { 2 };
        let bias = if self.qkv_bias { q + 2 * kv } else { 0 } + if self.o_bias { h } else { 0 };
        2 * h * q + 2 * h * kv + matrices * h * f + 2 * h + bias
    }

    /// The most shards its attention splits into evenly: every shard needs whole query and
    /// key-value heads.
    pub fn max_shards(&self) -> usize {
        let (mut a, mut b) = (self.heads, self.kv_heads);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a.max(1)
    }

    /// Every parameter: the blocks, the embedding, the head unless tied, the final norm.
    pub fn params(&self) -> u64 {
        let embed = self.vocab as u64 * self.hidden as u64;
        let head = if self.tied { 0 } else { embed };
        self.layers as u64 * self.block_params() + embed + head + self.hidden as u64
    }

    /// Forward FLOPs of one sample: two per weight a token meets (the blocks' and the head's;
    /// an embedding is a lookup), and attention's scores and mixing, `4 · s² · h` a block.
    pub fn forward_flops(&self) -> f64 {
        let (s, h) = (self.seq as f64, self.hidden as f64);
        let weights = self.layers as f64 * self.block_params() as f64 + h * self.vocab as f64;
        2.0 * s * weights + 4.0 * self.layers as f64 * s * s * h
    }

    /// Bytes one block keeps for the backward per sample, its activations split over `tp`
    /// shards: `s · h · (10 + 24 / t + 5 · a · s / (h · t))` at 2 bytes a value (Korthikanti
    /// et al., 2022, without recomputation or sequence parallelism), scaled to `bytes`.
    pub fn block_activation_bytes(&self, tp: usize, bytes: f64) -> f64 {
        let (s, h, a, t) = (
            self.seq as f64,
            self.hidden as f64,
            self.heads as f64,
            tp as f64,
        );
        s * h * (10.0 + 24.0 / t + 5.0 * a * s / (h * t)) * bytes / 2.0
    }
}

/// What a step of training asks, whatever the model: the planner's input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Parameters.
    pub params: u64,
    /// Parameters that train (all, or a LoRA adapter's few): they have gradients and moments.
    pub trainable: u64,
    /// Parameters of the input side (embeddings): the first stage holds them, whole on every
    /// shard (Kiln replicates embeddings under tensor parallelism).
    pub embedding_params: u64,
    /// Parameters of the output side (the head unless tied, the final norm): the last stage
    /// holds them, whole on every shard.
    pub head_params: u64,
    /// Bytes per stored weight (2 in bf16, 4 in f32, about 0.56 in 4-bit NF4).
    pub weight_bytes: f64,
    /// Bytes per trainable parameter besides its weight (gradient, moments, master copy).
    pub trainable_extra_bytes: f64,
    /// Bytes of a trainable parameter's gradient, of those above: what data parallelism
    /// all-reduces, and copies into its buckets.
    #[serde(default = "f32_bytes")]
    pub gradient_bytes: f64,
    /// Bytes of an activation value.
    pub activation_bytes: f64,
    /// Forward FLOPs per sample.
    pub forward_flops: f64,
    /// The part of `forward_flops` on the output side (the head): the last stage runs it,
    /// whole on every shard.
    #[serde(default)]
    pub head_flops: f64,
    /// The backward's FLOPs in forwards: 2 when every weight trains (the inputs' gradients
    /// and the weights'), 1 when the base is frozen and only small adapters train.
    pub backward_passes: f64,
    /// Blocks a pipeline can split the model into.
    pub layers: usize,
    /// Activation bytes one block keeps per sample, by tensor-parallel degree (index `t - 1`
    /// for `t` shards; one entry when the model cannot be sharded).
    pub block_activation_bytes: Vec<f64>,
    /// Shard counts must divide this (the heads; 1 when the model cannot be sharded).
    pub shardable: usize,
    /// Activation bytes per sample of the head and the loss (the logits and their gradient),
    /// held by the last stage while one micro-batch passes it.
    #[serde(default)]
    pub head_activation_bytes: f64,
    /// Bytes per sample that cross a stage boundary (a block's output).
    pub boundary_bytes: f64,
    /// Bytes per sample one block all-reduces across its shards, forward and backward
    /// together (Megatron-LM's two all-reduces each way, of a block's output each).
    pub tp_bytes: f64,
    /// Samples per optimizer step.
    pub global_batch: usize,
    /// Bytes every device holds whatever its share of the model: the framework's own buffers,
    /// measured on a device that is here (0 for a described model).
    #[serde(default)]
    pub fixed_bytes: f64,
    /// The activations a pipeline stage holds while one micro-batch passes through it, over
    /// what its blocks' share of the model's predicts (the boundary's copies, the embedding's
    /// or the head's own): measured on a machine that is here, 1 for a described model.
    #[serde(default = "super::measured::one")]
    pub stage_activation_scale: f64,
    /// The model can keep only each block's input and recompute the block in the backward
    /// without pipeline stages, gathering each block from its owners as it runs it under
    /// ZeRO-3: Kiln's LLMs under gradient checkpointing (`kiln finetune
    /// --gradient-checkpointing`). Kiln's built-in models recompute only as pipeline stages.
    #[serde(default)]
    pub recomputes_blocks: bool,
}

impl Workload {
    /// The workload of training all of `shape` in `precision` on `global_batch` samples a step.
    pub fn transformer(
        shape: &TransformerShape,
        precision: Precision,
        global_batch: usize,
    ) -> Self {
        let max_tp = shape.max_shards();
        let act = precision.activation_bytes();
        let block_out = shape.seq as f64 * shape.hidden as f64 * act;
        let embedding = shape.vocab as u64 * shape.hidden as u64;
        let head = if shape.tied { 0 } else { embedding };
        Self {
            params: shape.params(),
            trainable: shape.params(),
            embedding_params: embedding,
            head_params: head + shape.hidden as u64,
            weight_bytes: precision.weight_bytes(),
            trainable_extra_bytes: precision.trainable_extra_bytes(),
            gradient_bytes: precision.gradient_bytes(),
            activation_bytes: act,
            forward_flops: shape.forward_flops(),
            head_flops: 2.0 * shape.seq as f64 * shape.hidden as f64 * shape.vocab as f64,
            backward_passes: 2.0,
            layers: shape.layers,
            block_activation_bytes: (1..=max_tp)
                .map(|t| shape.block_activation_bytes(t, act))
                .collect(),
            shardable: max_tp,
            head_activation_bytes: 2.0 * shape.seq as f64 * shape.vocab as f64 * act,
            boundary_bytes: block_out,
            tp_bytes: 4.0 * block_out,
            global_batch,
            fixed_bytes: 0.0,
            stage_activation_scale: 1.0,
            recomputes_blocks: false,
        }
    }

    /// The workload of fine-tuning LoRA adapters of rank `rank` on every projection of
    /// `shape`'s blocks (Kiln's `TARGET_MODULES`: the attention's four, the feed-forward's),
    /// its base frozen, and with `four_bit` quantised to NF4 with f32 scales (0.5625 bytes a
    /// weight; embeddings, norms and head stay in `precision`). Adapters train in f32.
    pub fn lora(
        shape: &TransformerShape,
        precision: Precision,
        global_batch: usize,
        rank: usize,
        four_bit: bool,
    ) -> Self {
        let whole = Self::transformer(shape, precision, global_batch);
        let (h, f, r) = (shape.hidden as u64, shape.ffn as u64, rank as u64);
        let (q, kv) = shape.attention_widths();
        let attention = r * ((h + q) + 2 * (h + kv) + (q + h));
        let feed_forward = match shape.gated {
            true => r * (2 * (h + f) + (f + h)),
            false => r * ((h + f) + (f + h)),
        };
        let adapters = shape.layers as u64 * (attention + feed_forward);
        let block_weights = shape.layers as u64 * (shape.block_params() - 2 * h);
        let others = whole.params - block_weights;
        let base_bytes = match four_bit {
            true => 0.5625,
            false => precision.weight_bytes(),
        };
        let bytes = block_weights as f64 * base_bytes
            + others as f64 * precision.weight_bytes()
            + adapters as f64 * 4.0;
        let params = whole.params + adapters;
        Self {
            params,
            trainable: adapters,
            weight_bytes: bytes / params as f64,
            // An f32 gradient and AdamW's two f32 moments per adapter weight.
            trainable_extra_bytes: 12.0,
            gradient_bytes: 4.0,
            backward_passes: 1.0,
            ..whole
        }
    }

    /// Kiln's LLM of this workload's shape (`kiln finetune`), which recomputes one block at a
    /// time under gradient checkpointing ([`Self::recomputes_blocks`]).
    pub fn as_llm(self) -> Self {
        Self {
            recomputes_blocks: true,
            ..self
        }
    }

    /// Whether the model splits into `tp` shards.
    pub fn shards_into(&self, tp: usize) -> bool {
        tp <= self.block_activation_bytes.len() && self.shardable.is_multiple_of(tp)
    }
}

/// The serde default of [`Workload::gradient_bytes`], for a workload written before it was
/// kept: an f32 gradient.
fn f32_bytes() -> f64 {
    4.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// LLaMA-2 7B's configuration.
    pub(crate) fn llama_7b() -> TransformerShape {
        TransformerShape {
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: 32,
            head_dim: 128,
            qkv_bias: false,
            o_bias: false,
            ffn: 11008,
            seq: 4096,
            vocab: 32000,
            gated: true,
            tied: false,
        }
    }

    #[test]
    fn a_7b_model_counts_its_published_parameters_and_flops() {
        let shape = llama_7b();
        // Meta reports 6.74 B parameters (the norms included).
        let params = shape.params() as f64;
        assert!((params - 6.738e9).abs() < 0.01e9, "{params}");
        // About 6 · N FLOPs a token for a training step, plus attention.
        let per_token = 3.0 * shape.forward_flops() / shape.seq as f64;
        let six_n = 6.0 * params;
        assert!(
            per_token > six_n && per_token < 1.3 * six_n,
            "{per_token} vs {six_n}"
        );
    }

    #[test]
    fn sharding_shrinks_a_block_s_activations() {
        let shape = llama_7b();
        let one = shape.block_activation_bytes(1, 2.0);
        // s · h · (34 + 5 a s / h) bytes at 2 bytes a value.
        let expected = 4096.0 * 4096.0 * (34.0 + 5.0 * 32.0 * 4096.0 / 4096.0);
        assert!((one - expected).abs() < 1.0, "{one} vs {expected}");
        assert!(shape.block_activation_bytes(8, 2.0) < one / 4.0);
    }
}
