//! A [`CausalLm`] as pipeline stages, split between decoder layers as `device_map="auto"`
//! splits a model too big for one device: the token embedding, then the layers, then the
//! final norm, the LM head and the masked loss.
//!
//! A tied head is the embedding's weight. When the first and the last stage differ, the last
//! holds a clone of the embedding (the same `ParamId`, so the model reassembles). That is exact
//! while the embedding is frozen, as LoRA fine-tuning leaves it; a trainable tied embedding
//! would get two gradients on two stages that nothing sums, so that split is refused
//! ([`PipelineModel::check_split`]).

use std::ops::Range;

use burn::module::{AutodiffModule, Module};
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor};
use kiln_core::model::PipelineModel;

use super::model::tied_logits;
use super::train::masked_loss;
use super::{CausalLm, DecoderLayer, LmBatch, PackedRows, Rope};
use crate::tensor_parallel::ShardedBackend;

/// A contiguous run of a [`CausalLm`]'s decoder layers; the first stage also holds the token
/// embedding, the last the final norm and the head.
#[derive(Module, Debug)]
pub struct CausalLmStage<B: ShardedBackend> {
    embed_tokens: Option<Embedding<B>>,
    layers: Vec<DecoderLayer<B>>,
    norm: Option<RmsNorm<B>>,
    lm_head: Option<Linear<B>>,
    /// The embedding again, as the tied head of a last stage that is not also the first.
    tied_head: Option<Embedding<B>>,
    #[module(skip)]
    rope: Rope,
}

impl<B> PipelineModel<B> for CausalLm<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
    Self: AutodiffModule<B>,
    CausalLmStage<B>: AutodiffModule<B>,
{
    type Stage = CausalLmStage<B>;
    type Activation = Tensor<B, 3>;
    type FirstInput = Tensor<B, 2, Int>;
    /// The next tokens and the mask of those that count.
    type Target = (Tensor<B, 2, Int>, Tensor<B, 2>);
    /// Where the examples of packed rows begin, which every stage's attention and rotary
    /// positions read.
    type Context = Option<PackedRows<B>>;

    fn num_blocks(&self) -> usize {
        self.model.layers.len()
    }

    fn check_split(&self, stages: usize) -> Result<(), String> {
        if stages > 1 && self.lm_head.is_none() && self.model.embed_tokens.weight.is_require_grad()
        {
            return Err(
                "its LM head is tied to its trainable token embedding, which the first and the \
                 last stage would each update alone; freeze the embedding (LoRA fine-tuning \
                 does) or use single, data_parallel or ddp"
                    .into(),
            );
        }
        Ok(())
    }

    fn split(&self, ranges: &[Range<usize>]) -> Vec<CausalLmStage<B>> {
        let last = ranges.len() - 1;
        let decoder = &self.model;
        ranges
            .iter()
            .enumerate()
            .map(|(s, range)| CausalLmStage {
                embed_tokens: (s == 0).then(|| decoder.embed_tokens.clone()),
                layers: decoder.layers[range.clone()].to_vec(),
                norm: (s == last).then(|| decoder.norm.clone()),
                lm_head: self.lm_head.as_ref().filter(|_| s == last).cloned(),
                tied_head: (s == last && s > 0 && self.lm_head.is_none())
                    .then(|| decoder.embed_tokens.clone()),
                rope: decoder.rope.clone(),
            })
            .collect()
    }

    fn split_input(batch: LmBatch<B>) -> (Tensor<B, 2, Int>, Self::Context, Self::Target) {
        (batch.inputs, batch.packed, (batch.targets, batch.mask))
    }

    fn embed(stage: &CausalLmStage<B>, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        stage
            .embed_tokens
            .as_ref()
            .expect("the first stage holds the embedding")
            .forward(tokens)
    }

    fn blocks(
        stage: &CausalLmStage<B>,
        mut x: Tensor<B, 3>,
        packed: &Option<PackedRows<B>>,
    ) -> Tensor<B, 3> {
        let [batch, seq, _] = x.dims();
        let rope = stage
            .rope
            .positions(batch, 0..seq, packed.as_ref(), &x.device(), x.dtype());
        for layer in &stage.layers {
            x = layer.forward(x, &rope);
        }
        x
    }

    fn loss(
        stage: &CausalLmStage<B>,
        x: Tensor<B, 3>,
        (targets, mask): Self::Target,
    ) -> Tensor<B, 1> {
        let norm = stage.norm.as_ref().expect("the last stage holds the norm");
        let x = crate::layers::rms_norm(norm, x);
        let logits = match &stage.lm_head {
            Some(head) => crate::layers::linear_rows(head, x),
            // Tied: the embedding this stage holds, as a copy or (one stage) its own.
            None => tied_logits(
                x,
                stage
                    .tied_head
                    .as_ref()
                    .or(stage.embed_tokens.as_ref())
                    .expect("a tied last stage holds the embedding"),
            ),
        };
        masked_loss(logits, targets, mask)
    }
}
