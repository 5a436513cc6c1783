//! The AD transformer, tensor-parallel: how [`AdTransformer`] shards (its blocks' heads and
//! feed-forward units over the `tp` group, the embedding, positions, final norm and head
//! replicated), and the model one shard holds ([`TpAdTransformer`]): the same [`AdModel`] over
//! sharded blocks, which trains and splits into pipeline stages as the whole model does.

use burn::module::Module;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_core::model::{ParallelModel, ShardError, Supported, TensorParallelModel, Unsupported};
use kiln_core::tensor_parallel::TpGroup;
use kiln_nn::tensor_parallel::{ShardedBackend, TpPreNormBlock, fresh, replicate};

use crate::model::{AdModel, AdTransformer};
use crate::stages::AdStage;

/// One tensor-parallel shard of an [`AdTransformer`].
pub type TpAdTransformer<B> = AdModel<B, TpPreNormBlock<B>>;

/// A stage of a [`TpAdTransformer`].
pub type TpAdStage<B> = AdStage<B, TpPreNormBlock<B>>;

impl<B: Backend, L: Module<B>> AdModel<B, L> {
    /// This model's embedding, positions, norm and head, as fresh leaves, around `blocks`: a
    /// shard of it, or the whole model from a shard.
    fn around<M: Module<B>>(&self, blocks: Vec<M>) -> AdModel<B, M> {
        AdModel {
            embed: fresh(&self.embed),
            positions: replicate(&self.positions),
            blocks,
            norm: fresh(&self.norm),
            head: fresh(&self.head),
        }
    }
}

impl<B> TensorParallelModel<B> for AdTransformer<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Sharded = TpAdTransformer<B>;

    fn shard(&self, group: TpGroup<B>) -> Result<TpAdTransformer<B>, ShardError> {
        let blocks = self
            .blocks
            .iter()
            .map(|block| TpPreNormBlock::shard(block, group.clone()))
            .collect::<Result<_, _>>()?;
        Ok(self.around(blocks))
    }

    fn gather(shards: Vec<TpAdTransformer<B>>) -> Self {
        let first = &shards[0];
        let blocks = (0..first.blocks.len())
            .map(|i| {
                let parts: Vec<_> = shards.iter().map(|s| s.blocks[i].clone()).collect();
                TpPreNormBlock::gather(&parts)
            })
            .collect();
        first.around(blocks)
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
    type LowPrecision = Supported;
}
