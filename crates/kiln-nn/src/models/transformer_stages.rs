//! The causal transformer as pipeline stages: the embeddings, then its encoder layers as the
//! blocks, then the head.

use std::ops::Range;

use burn::module::Module;
use burn::nn::transformer::TransformerEncoderLayer;
use burn::nn::{Embedding, Linear};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use kiln_core::model::PipelineModel;

use super::Transformer;
use super::transformer::{embed, run_layers, sequence_loss};
use crate::tasks::SequenceBatch;

/// A contiguous run of a [`Transformer`]'s layers; the first stage also holds the token and
/// position embeddings, the last the head.
#[derive(Module, Debug)]
pub struct TransformerStage<B: Backend> {
    tokens: Option<Embedding<B>>,
    positions: Option<Embedding<B>>,
    layers: Vec<TransformerEncoderLayer<B>>,
    head: Option<Linear<B>>,
}

impl<B: AutodiffBackend> PipelineModel<B> for Transformer<B> {
    type Stage = TransformerStage<B>;
    type Activation = Tensor<B, 3>;
    type FirstInput = Tensor<B, 2, Int>;
    type Target = Tensor<B, 2, Int>;
    type Context = ();

    fn num_blocks(&self) -> usize {
        self.blocks.layers.len()
    }

    fn split(&self, ranges: &[Range<usize>]) -> Vec<TransformerStage<B>> {
        let last = ranges.len() - 1;
        ranges
            .iter()
            .enumerate()
            .map(|(s, range)| TransformerStage {
                tokens: (s == 0).then(|| self.tokens.clone()),
                positions: (s == 0).then(|| self.positions.clone()),
                layers: self.blocks.layers[range.clone()].to_vec(),
                head: (s == last).then(|| self.head.clone()),
            })
            .collect()
    }

    fn split_input(batch: SequenceBatch<B>) -> (Tensor<B, 2, Int>, (), Tensor<B, 2, Int>) {
        (batch.inputs, (), batch.targets)
    }

    fn embed(stage: &TransformerStage<B>, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let (Some(token_table), Some(position_table)) = (&stage.tokens, &stage.positions) else {
            panic!("the first stage holds the embeddings");
        };
        embed(token_table, position_table, tokens)
    }

    fn blocks(stage: &TransformerStage<B>, x: Tensor<B, 3>, _: &()) -> Tensor<B, 3> {
        run_layers(&stage.layers, x)
    }

    fn loss(
        stage: &TransformerStage<B>,
        x: Tensor<B, 3>,
        targets: Tensor<B, 2, Int>,
    ) -> Tensor<B, 1> {
        let head = stage.head.as_ref().expect("the last stage holds the head");
        sequence_loss(head.forward(x), targets)
    }
}
