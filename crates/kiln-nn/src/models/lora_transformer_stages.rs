//! The LoRA / QLoRA transformer as pipeline stages: the embeddings, then its LoRA blocks,
//! then the head scored by the fused cross-entropy.

use std::ops::Range;

use burn::module::Module;
use burn::nn::{Embedding, Linear};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor};
use kiln_core::model::PipelineModel;
use kiln_kernels::KernelBackend;

use super::LoraTransformer;
use super::lora_transformer::fused_sequence_loss;
use super::transformer::embed;
use crate::lora::LoraBlock;
use crate::tasks::SequenceBatch;

/// A contiguous run of a [`LoraTransformer`]'s blocks; the first stage also holds the
/// embeddings, the last the head.
#[derive(Module, Debug)]
pub struct LoraTransformerStage<B: KernelBackend> {
    tokens: Option<Embedding<B>>,
    positions: Option<Embedding<B>>,
    blocks: Vec<LoraBlock<B>>,
    head: Option<Linear<B>>,
}

impl<B> PipelineModel<B> for LoraTransformer<B>
where
    B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend,
{
    type Stage = LoraTransformerStage<B>;
    type Activation = Tensor<B, 3>;
    type FirstInput = Tensor<B, 2, Int>;
    type Target = Tensor<B, 2, Int>;

    fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    fn split(&self, ranges: &[Range<usize>]) -> Vec<LoraTransformerStage<B>> {
        let last = ranges.len() - 1;
        ranges
            .iter()
            .enumerate()
            .map(|(s, range)| LoraTransformerStage {
                tokens: (s == 0).then(|| self.tokens.clone()),
                positions: (s == 0).then(|| self.positions.clone()),
                blocks: self.blocks[range.clone()].to_vec(),
                head: (s == last).then(|| self.head.clone()),
            })
            .collect()
    }

    fn split_input(batch: SequenceBatch<B>) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
        (batch.inputs, batch.targets)
    }

    fn embed(stage: &LoraTransformerStage<B>, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let (Some(token_table), Some(position_table)) = (&stage.tokens, &stage.positions) else {
            panic!("the first stage holds the embeddings");
        };
        embed(token_table, position_table, tokens)
    }

    fn blocks(stage: &LoraTransformerStage<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
        stage.blocks.iter().fold(x, |x, block| block.forward(x))
    }

    fn loss(
        stage: &LoraTransformerStage<B>,
        x: Tensor<B, 3>,
        targets: Tensor<B, 2, Int>,
    ) -> Tensor<B, 1> {
        let head = stage.head.as_ref().expect("the last stage holds the head");
        fused_sequence_loss(head.forward(x), targets)
    }
}
