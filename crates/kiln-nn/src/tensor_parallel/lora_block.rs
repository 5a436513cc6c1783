//! The LoRA / QLoRA block, sharded.

use burn::module::{Module, Param};
use burn::tensor::Tensor;
use kiln_core::model::ShardError;
use kiln_core::tensor_parallel::TpGroup;
use kiln_core::tensor_parallel::ops::copy_to_tp;
use kiln_kernels::ops;

use super::{ColumnParallelLora, RowParallelLora, ShardedBackend, heads, replicate};
use crate::layers::attend;
use crate::lora::LoraBlock;

/// [`LoraBlock`] over a `tp` group: the heads split (query, key, value column-parallel, output
/// row-parallel), the SwiGLU's hidden units split (gate and up column-parallel, down
/// row-parallel), each adapter sharded with its base, the RMSNorm gains replicated.
#[derive(Module, Debug)]
pub struct TpLoraBlock<B: ShardedBackend> {
    norm_attn: Param<Tensor<B, 1>>,
    query: ColumnParallelLora<B>,
    key: ColumnParallelLora<B>,
    value: ColumnParallelLora<B>,
    output: RowParallelLora<B>,
    norm_ff: Param<Tensor<B, 1>>,
    gate: ColumnParallelLora<B>,
    up: ColumnParallelLora<B>,
    down: RowParallelLora<B>,
    /// This shard's heads.
    heads: usize,
    eps: f32,
    #[module(skip)]
    tp: TpGroup<B>,
}

impl<B: ShardedBackend> crate::layers::SequenceBlock<B> for TpLoraBlock<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        TpLoraBlock::forward(self, x)
    }
}

impl<B: ShardedBackend> TpLoraBlock<B> {
    /// Shard `tp.rank()` of `block`.
    ///
    /// # Errors
    /// [`ShardError`] when the heads or the SwiGLU width do not divide by the group, a 4-bit
    /// base's shard would cut its quantisation blocks, or an adapter is merged or has dropout.
    pub fn shard(block: &LoraBlock<B>, tp: TpGroup<B>) -> Result<Self, ShardError> {
        heads(block.heads, tp.size())?;
        let col = |what, p| ColumnParallelLora::shard(what, p, tp.clone());
        let row = |what, p| RowParallelLora::shard(what, p, tp.clone());
        Ok(Self {
            norm_attn: replicate(&block.norm_attn),
            query: col("the query projection", &block.query)?,
            key: col("the key projection", &block.key)?,
            value: col("the value projection", &block.value)?,
            output: row("the attention's output projection", &block.output)?,
            norm_ff: replicate(&block.norm_ff),
            gate: col("the SwiGLU gate", &block.gate)?,
            up: col("the SwiGLU up projection", &block.up)?,
            down: row("the SwiGLU down projection", &block.down)?,
            heads: block.heads / tp.size(),
            eps: block.eps,
            tp,
        })
    }

    /// The whole block from its shards, in shard order.
    pub fn gather(shards: &[Self]) -> LoraBlock<B> {
        let first = &shards[0];
        let col = |f: fn(&Self) -> &ColumnParallelLora<B>| {
            let parts: Vec<_> = shards.iter().map(f).cloned().collect();
            ColumnParallelLora::gather(&parts)
        };
        let row = |f: fn(&Self) -> &RowParallelLora<B>| {
            let parts: Vec<_> = shards.iter().map(f).cloned().collect();
            RowParallelLora::gather(&parts)
        };
        LoraBlock {
            norm_attn: replicate(&first.norm_attn),
            query: col(|s| &s.query),
            key: col(|s| &s.key),
            value: col(|s| &s.value),
            output: row(|s| &s.output),
            norm_ff: replicate(&first.norm_ff),
            gate: col(|s| &s.gate),
            up: col(|s| &s.up),
            down: row(|s| &s.down),
            heads: shards.iter().map(|s| s.heads).sum(),
            eps: first.eps,
        }
    }

    /// `[batch, seq, d_model]` → the same, causally, equal on every shard.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let norm = |x: Tensor<B, 3>, gain: &Param<Tensor<B, 1>>| {
            ops::rms_norm(x, gain.val(), self.eps).unwrap_or_else(|e| panic!("{e}"))
        };
        let n = norm(x.clone(), &self.norm_attn);
        let u = copy_to_tp(n.clone(), &self.tp);
        let context = attend(
            self.query.forward(n.clone(), u.clone()),
            self.key.forward(n.clone(), u.clone()),
            self.value.forward(n, u),
            self.heads,
        );
        let h = x + self.output.forward(context);
        let n = norm(h.clone(), &self.norm_ff);
        let u = copy_to_tp(n.clone(), &self.tp);
        let hidden = ops::swiglu(
            self.gate.forward(n.clone(), u.clone()),
            self.up.forward(n, u),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        h + self.down.forward(hidden)
    }
}
