//! The AD transformer, tensor-parallel: how [`AdTransformer`] shards (its blocks' heads and
//! feed-forward units over the `tp` group, the embedding, positions, final norm and head
//! replicated), and the model one shard holds, which also splits into pipeline stages.

use std::ops::Range;

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor};
use burn::train::{SequenceOutput, TrainOutput, TrainStep};
use kiln_core::model::{
    ParallelModel, PipelineModel, ShardError, Supported, TensorParallelModel, Unsupported,
};
use kiln_core::tensor_parallel::TpGroup;
use kiln_nn::layers::{LayerNorm, linear_rows};
use kiln_nn::tensor_parallel::{ShardedBackend, TpPreNormBlock, fresh, replicate};

use crate::dataset::AdBatch;
use crate::model::{AdTransformer, action_loss, embed};

/// One tensor-parallel shard of an [`AdTransformer`].
#[derive(Module, Debug)]
pub struct TpAdTransformer<B: ShardedBackend> {
    embed: Linear<B>,
    positions: Param<Tensor<B, 2>>,
    blocks: Vec<TpPreNormBlock<B>>,
    norm: LayerNorm<B>,
    head: Linear<B>,
}

impl<B: ShardedBackend> TpAdTransformer<B> {
    /// Action logits at every position, the same on every shard.
    pub fn forward(&self, features: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = embed(&self.embed, &self.positions, features);
        let x = self.blocks.iter().fold(x, |x, block| block.forward(x));
        linear_rows(&self.head, self.norm.forward(x))
    }
}

impl<B> TrainStep for TpAdTransformer<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Input = AdBatch<B>;
    type Output = SequenceOutput<B>;

    fn step(&self, batch: AdBatch<B>) -> TrainOutput<SequenceOutput<B>> {
        let logits = self.forward(batch.features);
        let loss = action_loss(logits.clone(), batch.targets.clone());
        let output = SequenceOutput::new(loss, logits, None, batch.targets);
        TrainOutput::new(self, output.loss.backward(), output)
    }
}

impl<B> TensorParallelModel<B> for AdTransformer<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Sharded = TpAdTransformer<B>;

    fn shard(&self, group: TpGroup<B>) -> Result<TpAdTransformer<B>, ShardError> {
        Ok(TpAdTransformer {
            embed: fresh(&self.embed),
            positions: replicate(&self.positions),
            blocks: self
                .blocks
                .iter()
                .map(|block| TpPreNormBlock::shard(block, group.clone()))
                .collect::<Result<_, _>>()?,
            norm: fresh(&self.norm),
            head: fresh(&self.head),
        })
    }

    fn gather(shards: Vec<TpAdTransformer<B>>) -> Self {
        let first = &shards[0];
        let blocks = (0..first.blocks.len())
            .map(|i| {
                let parts: Vec<_> = shards.iter().map(|s| s.blocks[i].clone()).collect();
                TpPreNormBlock::gather(&parts)
            })
            .collect();
        AdTransformer {
            embed: fresh(&first.embed),
            positions: replicate(&first.positions),
            blocks,
            norm: fresh(&first.norm),
            head: fresh(&first.head),
        }
    }
}

impl<B> ParallelModel<B> for AdTransformer<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Pipeline = Supported;
    type Tensor = Supported;
    type LowPrecision = Supported;
}

impl<B> ParallelModel<B> for TpAdTransformer<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Pipeline = Supported;
    type Tensor = Unsupported;
    type LowPrecision = Unsupported;
}

/// A contiguous run of a [`TpAdTransformer`]'s blocks; the first stage also holds the step
/// embedding and the positions, the last the final norm and the head.
#[derive(Module, Debug)]
pub struct TpAdStage<B: ShardedBackend> {
    embed: Option<Linear<B>>,
    positions: Option<Param<Tensor<B, 2>>>,
    blocks: Vec<TpPreNormBlock<B>>,
    norm: Option<LayerNorm<B>>,
    head: Option<Linear<B>>,
}

impl<B> PipelineModel<B> for TpAdTransformer<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Stage = TpAdStage<B>;
    type Activation = Tensor<B, 3>;
    type FirstInput = Tensor<B, 3>;
    type Target = Tensor<B, 2, Int>;

    fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    fn split(&self, ranges: &[Range<usize>]) -> Vec<TpAdStage<B>> {
        let last = ranges.len() - 1;
        ranges
            .iter()
            .enumerate()
            .map(|(s, range)| TpAdStage {
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

    fn embed(stage: &TpAdStage<B>, features: Tensor<B, 3>) -> Tensor<B, 3> {
        let (Some(table), Some(positions)) = (&stage.embed, &stage.positions) else {
            panic!("the first stage holds the embedding");
        };
        embed(table, positions, features)
    }

    fn blocks(stage: &TpAdStage<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
        stage.blocks.iter().fold(x, |x, block| block.forward(x))
    }

    fn loss(stage: &TpAdStage<B>, x: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let (Some(norm), Some(head)) = (&stage.norm, &stage.head) else {
            panic!("the last stage holds the norm and the head");
        };
        action_loss(linear_rows(head, norm.forward(x)), targets)
    }
}
