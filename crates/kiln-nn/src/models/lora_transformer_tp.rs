//! The LoRA / QLoRA transformer, tensor-parallel: how [`LoraTransformer`] shards (its blocks'
//! projections with their adapters, 4-bit bases along whole quantisation blocks), and the
//! model one shard holds ([`TpLoraTransformer`]), which also splits into pipeline stages.

use std::ops::Range;

use burn::module::Module;
use burn::nn::{Embedding, Linear};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor};
use burn::train::{SequenceOutput, TrainOutput, TrainStep};
use kiln_core::model::{
    ParallelModel, PipelineModel, ShardError, Supported, TensorParallelModel, Unsupported,
};
use kiln_core::tensor_parallel::TpGroup;

use super::LoraTransformer;
use super::lora_transformer::fused_sequence_loss;
use super::transformer::embed;
use crate::tasks::SequenceBatch;
use crate::tensor_parallel::{ShardedBackend, TpLoraBlock, fresh};

/// One tensor-parallel shard of a [`LoraTransformer`]: its blocks sharded ([`TpLoraBlock`]),
/// the embeddings and the head replicated.
#[derive(Module, Debug)]
pub struct TpLoraTransformer<B: ShardedBackend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    blocks: Vec<TpLoraBlock<B>>,
    head: Linear<B>,
}

impl<B: ShardedBackend> TpLoraTransformer<B> {
    /// Logits `[batch, seq, vocab]`, the same on every shard.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let x = embed(&self.tokens, &self.positions, tokens);
        let x = self.blocks.iter().fold(x, |x, block| block.forward(x));
        self.head.forward(x)
    }
}

impl<B> TrainStep for TpLoraTransformer<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Input = SequenceBatch<B>;
    type Output = SequenceOutput<B>;

    fn step(&self, batch: SequenceBatch<B>) -> TrainOutput<SequenceOutput<B>> {
        let logits = self.forward(batch.inputs);
        let loss = fused_sequence_loss(logits.clone(), batch.targets.clone());
        let output = SequenceOutput::new(loss, logits, None, batch.targets);
        TrainOutput::new(self, output.loss.backward(), output)
    }
}

impl<B> TensorParallelModel<B> for LoraTransformer<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Sharded = TpLoraTransformer<B>;

    fn shard(&self, group: TpGroup<B>) -> Result<TpLoraTransformer<B>, ShardError> {
        Ok(TpLoraTransformer {
            tokens: fresh(&self.tokens),
            positions: fresh(&self.positions),
            blocks: self
                .blocks
                .iter()
                .map(|block| TpLoraBlock::shard(block, group.clone()))
                .collect::<Result<_, _>>()?,
            head: fresh(&self.head),
        })
    }

    fn gather(shards: Vec<TpLoraTransformer<B>>) -> Self {
        let first = &shards[0];
        let blocks = (0..first.blocks.len())
            .map(|i| {
                let parts: Vec<_> = shards.iter().map(|s| s.blocks[i].clone()).collect();
                TpLoraBlock::gather(&parts)
            })
            .collect();
        LoraTransformer {
            tokens: fresh(&first.tokens),
            positions: fresh(&first.positions),
            blocks,
            head: fresh(&first.head),
        }
    }
}

impl<B> ParallelModel<B> for LoraTransformer<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Pipeline = Supported;
    type Tensor = Supported;
    type LowPrecision = Unsupported;
}

impl<B> ParallelModel<B> for TpLoraTransformer<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Pipeline = Supported;
    type Tensor = Unsupported;
    type LowPrecision = Unsupported;
}

/// A contiguous run of a [`TpLoraTransformer`]'s blocks; the first stage also holds the
/// embeddings, the last the head.
#[derive(Module, Debug)]
pub struct TpLoraTransformerStage<B: ShardedBackend> {
    tokens: Option<Embedding<B>>,
    positions: Option<Embedding<B>>,
    blocks: Vec<TpLoraBlock<B>>,
    head: Option<Linear<B>>,
}

impl<B> PipelineModel<B> for TpLoraTransformer<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Stage = TpLoraTransformerStage<B>;
    type Activation = Tensor<B, 3>;
    type FirstInput = Tensor<B, 2, Int>;
    type Target = Tensor<B, 2, Int>;

    fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    fn split(&self, ranges: &[Range<usize>]) -> Vec<TpLoraTransformerStage<B>> {
        let last = ranges.len() - 1;
        ranges
            .iter()
            .enumerate()
            .map(|(s, range)| TpLoraTransformerStage {
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

    fn embed(stage: &TpLoraTransformerStage<B>, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let (Some(token_table), Some(position_table)) = (&stage.tokens, &stage.positions) else {
            panic!("the first stage holds the embeddings");
        };
        embed(token_table, position_table, tokens)
    }

    fn blocks(stage: &TpLoraTransformerStage<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
        stage.blocks.iter().fold(x, |x, block| block.forward(x))
    }

    fn loss(
        stage: &TpLoraTransformerStage<B>,
        x: Tensor<B, 3>,
        targets: Tensor<B, 2, Int>,
    ) -> Tensor<B, 1> {
        let head = stage.head.as_ref().expect("the last stage holds the head");
        fused_sequence_loss(head.forward(x), targets)
    }
}
