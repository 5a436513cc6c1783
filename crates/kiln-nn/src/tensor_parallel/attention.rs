//! Causal self-attention with its heads split over the `tp` group.

use burn::module::Module;
use burn::tensor::Tensor;
use kiln_core::model::ShardError;
use kiln_core::tensor_parallel::TpGroup;
use kiln_core::tensor_parallel::ops::copy_to_tp;

use super::{ColumnParallelLinear, RowParallelLinear, ShardedBackend, heads};
use crate::layers::{CausalSelfAttention, attend};

/// [`CausalSelfAttention`] with shard `t` holding heads `t·h/tp .. (t+1)·h/tp`: their query,
/// key and value columns (column-parallel, one `f` for the three), and the output
/// projection's matching rows (row-parallel, one `g`).
#[derive(Module, Debug)]
pub struct TpCausalSelfAttention<B: ShardedBackend> {
    query: ColumnParallelLinear<B>,
    key: ColumnParallelLinear<B>,
    value: ColumnParallelLinear<B>,
    output: RowParallelLinear<B>,
    /// This shard's heads.
    heads: usize,
    #[module(skip)]
    tp: TpGroup<B>,
}

impl<B: ShardedBackend> TpCausalSelfAttention<B> {
    /// Shard `tp.rank()` of `attn`.
    ///
    /// # Errors
    /// [`ShardError`] when the heads do not divide by the group, or are fewer.
    pub fn shard(attn: &CausalSelfAttention<B>, tp: TpGroup<B>) -> Result<Self, ShardError> {
        heads(attn.heads, tp.size())?;
        Ok(Self {
            query: ColumnParallelLinear::shard(&attn.query, tp.clone(), false)?,
            key: ColumnParallelLinear::shard(&attn.key, tp.clone(), false)?,
            value: ColumnParallelLinear::shard(&attn.value, tp.clone(), false)?,
            output: RowParallelLinear::shard(&attn.output, tp.clone(), true)?,
            heads: attn.heads / tp.size(),
            tp,
        })
    }

    /// The whole layer from its shards, in shard order.
    pub fn gather(shards: &[Self]) -> CausalSelfAttention<B> {
        let cols = |f: fn(&Self) -> &ColumnParallelLinear<B>| {
            let parts: Vec<_> = shards.iter().map(f).cloned().collect();
            ColumnParallelLinear::gather(&parts)
        };
        let rows: Vec<_> = shards.iter().map(|s| s.output.clone()).collect();
        CausalSelfAttention {
            query: cols(|s| &s.query),
            key: cols(|s| &s.key),
            value: cols(|s| &s.value),
            output: RowParallelLinear::gather(&rows),
            heads: shards.iter().map(|s| s.heads).sum(),
        }
    }

    /// Attends causally over `x`, `[batch, seq, d_model]` → the same, equal on every shard.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let u = copy_to_tp(x, &self.tp);
        let context = attend(
            self.query.forward_copied(u.clone()),
            self.key.forward_copied(u.clone()),
            self.value.forward_copied(u),
            self.heads,
        );
        self.output.forward(context)
    }
}
