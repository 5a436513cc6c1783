//! kiln-nn's pre-norm block, sharded.

use burn::module::Module;
use burn::nn::activation::Activation;
use burn::tensor::Tensor;
use kiln_core::model::ShardError;
use kiln_core::tensor_parallel::TpGroup;

use super::{
    ColumnParallelLinear, RowParallelLinear, ShardedBackend, TpCausalSelfAttention, fresh,
};
use crate::layers::{LayerNorm, PreNormBlock};

/// [`PreNormBlock`] over a `tp` group: the attention's heads split, the feed-forward's hidden
/// units split (`ff_in` column-parallel, `ff_out` row-parallel), the norms replicated. One
/// all-reduce forward and one backward for the attention, and the same for the feed-forward.
#[derive(Module, Debug)]
pub struct TpPreNormBlock<B: ShardedBackend> {
    norm_attn: LayerNorm<B>,
    attn: TpCausalSelfAttention<B>,
    norm_ff: LayerNorm<B>,
    ff_in: ColumnParallelLinear<B>,
    ff_out: RowParallelLinear<B>,
    activation: Activation<B>,
}

impl<B: ShardedBackend> crate::layers::SequenceBlock<B> for TpPreNormBlock<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        TpPreNormBlock::forward(self, x)
    }
}

impl<B: ShardedBackend> TpPreNormBlock<B> {
    /// Shard `tp.rank()` of `block`.
    ///
    /// # Errors
    /// [`ShardError`] when the heads or the feed-forward width do not divide by the group.
    pub fn shard(block: &PreNormBlock<B>, tp: TpGroup<B>) -> Result<Self, ShardError> {
        Ok(Self {
            norm_attn: fresh(&block.norm_attn),
            attn: TpCausalSelfAttention::shard(&block.attn, tp.clone())?,
            norm_ff: fresh(&block.norm_ff),
            ff_in: ColumnParallelLinear::shard(&block.ff_in, tp.clone(), false)?,
            ff_out: RowParallelLinear::shard(&block.ff_out, tp, true)?,
            activation: block.activation.clone(),
        })
    }

    /// The whole block from its shards, in shard order.
    pub fn gather(shards: &[Self]) -> PreNormBlock<B> {
        let first = &shards[0];
        let attn: Vec<_> = shards.iter().map(|s| s.attn.clone()).collect();
        let ff_in: Vec<_> = shards.iter().map(|s| s.ff_in.clone()).collect();
        let ff_out: Vec<_> = shards.iter().map(|s| s.ff_out.clone()).collect();
        PreNormBlock {
            norm_attn: fresh(&first.norm_attn),
            attn: TpCausalSelfAttention::gather(&attn),
            norm_ff: fresh(&first.norm_ff),
            ff_in: ColumnParallelLinear::gather(&ff_in),
            ff_out: RowParallelLinear::gather(&ff_out),
            activation: first.activation.clone(),
        }
    }

    /// Applies the block: `[batch, seq, d_model]` → the same, equal on every shard.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = x.clone() + self.attn.forward(self.norm_attn.forward(x));
        let hidden = self
            .activation
            .forward(self.ff_in.forward(self.norm_ff.forward(x.clone())));
        x + self.ff_out.forward(hidden)
    }
}
