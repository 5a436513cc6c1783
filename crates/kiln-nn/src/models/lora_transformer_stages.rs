//! The LoRA / QLoRA transformer as pipeline stages: the embeddings, then its LoRA blocks,
//! then the head scored by the fused cross-entropy.

use std::ops::Range;

use burn::module::{AutodiffModule, Module};
use burn::nn::{Embedding, Linear};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use kiln_core::model::PipelineModel;
use kiln_kernels::KernelBackend;

use super::lora_transformer::{LoraModel, fused_sequence_loss};
use super::transformer::embed;
use crate::layers::{SequenceBlock, run_blocks};
use crate::lora::LoraBlock;
use crate::tasks::SequenceBatch;

/// A stage of a [`LoraTransformer`](super::LoraTransformer).
pub type LoraTransformerStage<B> = LoraStage<B, LoraBlock<B>>;

/// A contiguous run of a [`LoraModel`]'s blocks; the first stage also holds the embeddings,
/// the last the head.
#[derive(Module, Debug)]
pub struct LoraStage<B: Backend, L: Module<B>> {
    tokens: Option<Embedding<B>>,
    positions: Option<Embedding<B>>,
    blocks: Vec<L>,
    head: Option<Linear<B>>,
}

impl<B, L> PipelineModel<B> for LoraModel<B, L>
where
    B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend,
    L: SequenceBlock<B> + 'static,
    Self: AutodiffModule<B>,
    LoraStage<B, L>: AutodiffModule<B>,
{
    type Stage = LoraStage<B, L>;
    type Activation = Tensor<B, 3>;
    type FirstInput = Tensor<B, 2, Int>;
    type Target = Tensor<B, 2, Int>;
    type Context = ();

    fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    fn split(&self, ranges: &[Range<usize>]) -> Vec<LoraStage<B, L>> {
        let last = ranges.len() - 1;
        ranges
            .iter()
            .enumerate()
            .map(|(s, range)| LoraStage {
                tokens: (s == 0).then(|| self.tokens.clone()),
                positions: (s == 0).then(|| self.positions.clone()),
                blocks: self.blocks[range.clone()].to_vec(),
                head: (s == last).then(|| self.head.clone()),
            })
            .collect()
    }

    fn split_input(batch: SequenceBatch<B>) -> (Tensor<B, 2, Int>, (), Tensor<B, 2, Int>) {
        (batch.inputs, (), batch.targets)
    }

    fn embed(stage: &LoraStage<B, L>, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let (Some(token_table), Some(position_table)) = (&stage.tokens, &stage.positions) else {
            panic!("the first stage holds the embeddings");
        };
        embed(token_table, position_table, tokens)
    }

    fn blocks(stage: &LoraStage<B, L>, x: Tensor<B, 3>, _: &()) -> Tensor<B, 3> {
        run_blocks(&stage.blocks, x)
    }

    fn loss(stage: &LoraStage<B, L>, x: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let head = stage.head.as_ref().expect("the last stage holds the head");
        fused_sequence_loss(head.forward(x), targets)
    }
}
