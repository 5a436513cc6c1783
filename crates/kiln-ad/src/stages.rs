//! The AD transformer as pipeline stages: the step embedding and positions, then its pre-norm
//! blocks, then the final norm and the action head.

use std::ops::Range;

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use kiln_core::model::PipelineModel;
use kiln_kernels::KernelBackend;
use kiln_nn::layers::{LayerNorm, PreNormBlock, linear_rows};

use crate::dataset::AdBatch;
use crate::model::{AdTransformer, action_loss, embed};

/// A contiguous run of an [`AdTransformer`]'s blocks; the first stage also holds the step
/// embedding and the positions, the last the final norm and the head.
#[derive(Module, Debug)]
pub struct AdStage<B: Backend> {
    embed: Option<Linear<B>>,
    positions: Option<Param<Tensor<B, 2>>>,
    blocks: Vec<PreNormBlock<B>>,
    norm: Option<LayerNorm<B>>,
    head: Option<Linear<B>>,
}

impl<B: AutodiffBackend + KernelBackend> PipelineModel<B> for AdTransformer<B> {
    type Stage = AdStage<B>;
    type Activation = Tensor<B, 3>;
    type FirstInput = Tensor<B, 3>;
    type Target = Tensor<B, 2, Int>;

    fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    fn split(&self, ranges: &[Range<usize>]) -> Vec<AdStage<B>> {
        let last = ranges.len() - 1;
        ranges
            .iter()
            .enumerate()
            .map(|(s, range)| AdStage {
                embed: (s == 0).then(|| self.embed.clone()),
                positions: (s == 0).then(|| self.positions.clone()),
                blocks: self.blocks[range.clone()].to_vec(),
                norm: (s == last).then(|| self.norm.clone()),
                head: (s == last).then(|| self.head.clone()),
            })
            .collect()
    }

    fn split_input(batch: AdBatch<B>) -> (Tensor<B, 3>, Tensor<B, 2, Int>) {
        (batch.features, batch.targets)
    }

    fn embed(stage: &AdStage<B>, features: Tensor<B, 3>) -> Tensor<B, 3> {
        let (Some(table), Some(positions)) = (&stage.embed, &stage.positions) else {
            panic!("the first stage holds the embedding");
        };
        embed(table, positions, features)
    }

    fn blocks(stage: &AdStage<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
        stage.blocks.iter().fold(x, |x, block| block.forward(x))
    }

    fn loss(stage: &AdStage<B>, x: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let (Some(norm), Some(head)) = (&stage.norm, &stage.head) else {
            panic!("the last stage holds the norm and the head");
        };
        action_loss(linear_rows(head, norm.forward(x)), targets)
    }
}
