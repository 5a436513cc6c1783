//! The LoRA / QLoRA transformer, tensor-parallel: how [`LoraTransformer`] shards (its blocks'
//! projections with their adapters, 4-bit bases along whole quantisation blocks), and the
//! model one shard holds ([`TpLoraTransformer`]): the same [`LoraModel`] over sharded blocks,
//! which trains and splits into pipeline stages as the whole model does.

use burn::module::Module;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_core::model::{ParallelModel, ShardError, Supported, TensorParallelModel, Unsupported};
use kiln_core::tensor_parallel::TpGroup;

use super::LoraTransformer;
use super::lora_transformer::LoraModel;
use super::lora_transformer_stages::LoraStage;
use crate::tensor_parallel::{ShardedBackend, TpLoraBlock, fresh};

/// One tensor-parallel shard of a [`LoraTransformer`]: its blocks sharded ([`TpLoraBlock`]),
/// the embeddings and the head replicated.
pub type TpLoraTransformer<B> = LoraModel<B, TpLoraBlock<B>>;

/// A stage of a [`TpLoraTransformer`].
pub type TpLoraTransformerStage<B> = LoraStage<B, TpLoraBlock<B>>;

impl<B: Backend, L: Module<B>> LoraModel<B, L> {
    /// This model's embeddings and head, as fresh leaves, around `blocks`: a shard of it, or
    /// the whole model from a shard.
    fn around<M: Module<B>>(&self, blocks: Vec<M>) -> LoraModel<B, M> {
        LoraModel {
            tokens: fresh(&self.tokens),
            positions: fresh(&self.positions),
            blocks,
            head: fresh(&self.head),
        }
    }
}

impl<B> TensorParallelModel<B> for LoraTransformer<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Sharded = TpLoraTransformer<B>;

    fn shard(&self, group: TpGroup<B>) -> Result<TpLoraTransformer<B>, ShardError> {
        let blocks = self
            .blocks
            .iter()
            .map(|block| TpLoraBlock::shard(block, group.clone()))
            .collect::<Result<_, _>>()?;
        Ok(self.around(blocks))
    }

    fn gather(shards: Vec<TpLoraTransformer<B>>) -> Self {
        let first = &shards[0];
        let blocks = (0..first.blocks.len())
            .map(|i| {
                let parts: Vec<_> = shards.iter().map(|s| s.blocks[i].clone()).collect();
                TpLoraBlock::gather(&parts)
            })
            .collect();
        first.around(blocks)
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
