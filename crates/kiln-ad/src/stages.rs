//! The AD transformer as pipeline stages: the step embedding and positions, then its blocks,
//! then the final norm and the action head; whole blocks or a tensor-parallel shard's alike.

use std::ops::Range;

use burn::module::{AutodiffModule, Module, Param};
use burn::nn::Linear;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use kiln_core::model::PipelineModel;
use kiln_kernels::KernelBackend;
use kiln_nn::layers::{LayerNorm, PreNormBlock, SequenceBlock, linear_rows, run_blocks};

use crate::dataset::AdBatch;
use crate::model::{AdModel, action_loss, embed};

/// A stage of an [`AdTransformer`](crate::model::AdTransformer).
pub type AdTransformerStage<B> = AdStage<B, PreNormBlock<B>>;

/// A contiguous run of an [`AdModel`]'s blocks; the first stage also holds the step embedding
/// and the positions, the last the final norm and the head.
#[derive(Module, Debug)]
pub struct AdStage<B: Backend, L: Module<B>> {
    embed: Option<Linear<B>>,
    positions: Option<Param<Tensor<B, 2>>>,
    blocks: Vec<L>,
    norm: Option<LayerNorm<B>>,
    head: Option<Linear<B>>,
}

impl<B, L> PipelineModel<B> for AdModel<B, L>
where
    B: AutodiffBackend + KernelBackend,
    L: SequenceBlock<B> + 'static,
    Self: AutodiffModule<B>,
    AdStage<B, L>: AutodiffModule<B>,
{
    type Stage = AdStage<B, L>;
    type Activation = Tensor<B, 3>;
    type FirstInput = Tensor<B, 3>;
    type Target = Tensor<B, 2, Int>;
    type Context = ();

    fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    fn split(&self, ranges: &[Range<usize>]) -> Vec<AdStage<B, L>> {
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

    fn split_input(batch: AdBatch<B>) -> (Tensor<B, 3>, (), Tensor<B, 2, Int>) {
        (batch.features, (), batch.targets)
    }

    fn embed(stage: &AdStage<B, L>, features: Tensor<B, 3>) -> Tensor<B, 3> {
        let (Some(table), Some(positions)) = (&stage.embed, &stage.positions) else {
            panic!("the first stage holds the embedding");
        };
        embed(table, positions, features)
    }

    fn blocks(stage: &AdStage<B, L>, x: Tensor<B, 3>, _: &()) -> Tensor<B, 3> {
        run_blocks(&stage.blocks, x)
    }

    fn loss(stage: &AdStage<B, L>, x: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let (Some(norm), Some(head)) = (&stage.norm, &stage.head) else {
            panic!("the last stage holds the norm and the head");
        };
        action_loss(linear_rows(head, norm.forward(x)), targets)
    }
}
