//! Burn's `TransformerEncoderLayer`, sharded: the layer the built-in [`Transformer`]
//! (crate::models::Transformer) is made of.

use burn::module::Module;
use burn::nn::activation::Activation;
use burn::nn::attention::MultiHeadAttention;
use burn::nn::transformer::{PositionWiseFeedForward, TransformerEncoderLayer};
use burn::nn::{Dropout, Gelu, LayerNorm};
use burn::tensor::activation::{quiet_softmax, softmax};
use burn::tensor::{Bool, Tensor};
use kiln_core::model::ShardError;
use kiln_core::tensor_parallel::ops::copy_to_tp;
use kiln_core::tensor_parallel::{TpBackend, TpGroup};

use super::{ColumnParallelLinear, RowParallelLinear, fresh, heads, no_dropout};

/// Burn's [`TransformerEncoderLayer`] over a `tp` group: its multi-head attention with the
/// heads split (query, key and value column-parallel behind one `f`, the output row-parallel),
/// its position-wise feed-forward with the hidden units split, its norms replicated. It
/// computes what Burn's layer computes, with Burn's own attention arithmetic (scaled scores,
/// the mask filled with Burn's `min_float`, softmax) on this shard's heads.
#[derive(Module, Debug)]
pub struct TpEncoderLayer<B: TpBackend> {
    norm_1: LayerNorm<B>,
    norm_2: LayerNorm<B>,
    query: ColumnParallelLinear<B>,
    key: ColumnParallelLinear<B>,
    value: ColumnParallelLinear<B>,
    output: RowParallelLinear<B>,
    inner: ColumnParallelLinear<B>,
    outer: RowParallelLinear<B>,
    activation: Activation<B>,
    dropout: Dropout,
    /// This shard's heads.
    heads: usize,
    /// Every shard's heads.
    all_heads: usize,
    d_model: usize,
    d_k: usize,
    min_float: f64,
    quiet_softmax: bool,
    norm_first: bool,
    #[module(skip)]
    tp: TpGroup<B>,
}

impl<B: TpBackend> TpEncoderLayer<B> {
    /// Shard `tp.rank()` of `layer`.
    ///
    /// # Errors
    /// [`ShardError`] when the heads or the feed-forward width do not divide by the group,
    /// or the layer has dropout.
    pub fn shard(layer: &TransformerEncoderLayer<B>, tp: TpGroup<B>) -> Result<Self, ShardError> {
        let mha = &layer.mha;
        heads(mha.n_heads, tp.size())?;
        no_dropout("a transformer encoder layer", layer.dropout.prob)?;
        no_dropout("its attention", mha.dropout.prob)?;
        no_dropout("its feed-forward", layer.pwff.dropout.prob)?;
        Ok(Self {
            norm_1: fresh(&layer.norm_1),
            norm_2: fresh(&layer.norm_2),
            query: ColumnParallelLinear::shard(&mha.query, tp.clone(), false)?,
            key: ColumnParallelLinear::shard(&mha.key, tp.clone(), false)?,
            value: ColumnParallelLinear::shard(&mha.value, tp.clone(), false)?,
            output: RowParallelLinear::shard(&mha.output, tp.clone(), true)?,
            inner: ColumnParallelLinear::shard(&layer.pwff.linear_inner, tp.clone(), false)?,
            outer: RowParallelLinear::shard(&layer.pwff.linear_outer, tp.clone(), true)?,
            activation: layer.pwff.activation.clone(),
            dropout: layer.dropout.clone(),
            heads: mha.n_heads / tp.size(),
            all_heads: mha.n_heads,
            d_model: mha.d_model,
            d_k: mha.d_k,
            min_float: mha.min_float,
            quiet_softmax: mha.quiet_softmax,
            norm_first: layer.norm_first,
            tp,
        })
    }

    /// The whole layer from its shards, in shard order.
    pub fn gather(shards: &[Self]) -> TransformerEncoderLayer<B> {
        let first = &shards[0];
        let cols = |f: fn(&Self) -> &ColumnParallelLinear<B>| {
            let parts: Vec<_> = shards.iter().map(f).cloned().collect();
            ColumnParallelLinear::gather(&parts)
        };
        let rows = |f: fn(&Self) -> &RowParallelLinear<B>| {
            let parts: Vec<_> = shards.iter().map(f).cloned().collect();
            RowParallelLinear::gather(&parts)
        };
        TransformerEncoderLayer {
            mha: MultiHeadAttention {
                query: cols(|s| &s.query),
                key: cols(|s| &s.key),
                value: cols(|s| &s.value),
                output: rows(|s| &s.output),
                dropout: first.dropout.clone(),
                activation: Gelu::new(),
                d_model: first.d_model,
                n_heads: first.all_heads,
                d_k: first.d_k,
                min_float: first.min_float,
                quiet_softmax: first.quiet_softmax,
            },
            pwff: PositionWiseFeedForward {
                linear_inner: cols(|s| &s.inner),
                linear_outer: rows(|s| &s.outer),
                dropout: first.dropout.clone(),
                activation: first.activation.clone(),
            },
            norm_1: fresh(&first.norm_1),
            norm_2: fresh(&first.norm_2),
            dropout: first.dropout.clone(),
            norm_first: first.norm_first,
        }
    }

    /// Burn's `TransformerEncoderLayer::forward` with an attention mask, on this shard's heads
    /// and hidden units: `[batch, seq, d_model]` → the same, equal on every shard.
    pub fn forward(&self, input: Tensor<B, 3>, mask: Tensor<B, 3, Bool>) -> Tensor<B, 3> {
        let x = input;
        let attn_in = if self.norm_first {
            self.norm_2.forward(x.clone())
        } else {
            x.clone()
        };
        let mut x = x + self.attend(attn_in, mask);
        let ff_in = if self.norm_first {
            self.norm_1.forward(x.clone())
        } else {
            x = self.norm_1.forward(x);
            x.clone()
        };
        let hidden = self.activation.forward(self.inner.forward(ff_in));
        let x = x + self.outer.forward(hidden);
        if self.norm_first {
            x
        } else {
            self.norm_2.forward(x)
        }
    }

    /// Burn's multi-head attention on this shard's heads.
    fn attend(&self, x: Tensor<B, 3>, mask: Tensor<B, 3, Bool>) -> Tensor<B, 3> {
        let [batch, seq, _] = x.dims();
        let u = copy_to_tp(x, &self.tp);
        let split = |y: Tensor<B, 3>| {
            y.reshape([batch, seq, self.heads, self.d_k])
                .swap_dims(1, 2)
        };
        let q = split(self.query.forward_copied(u.clone()));
        let k = split(self.key.forward_copied(u.clone()));
        let v = split(self.value.forward_copied(u));
        let scores = q
            .matmul(k.transpose())
            .div_scalar((self.d_k as f32).sqrt())
            .mask_fill(mask.reshape([batch, 1, seq, seq]), self.min_float);
        let weights = if self.quiet_softmax {
            quiet_softmax(scores, 3)
        } else {
            softmax(scores, 3)
        };
        let context =
            weights
                .matmul(v)
                .swap_dims(1, 2)
                .reshape([batch, seq, self.heads * self.d_k]);
        self.output.forward(context)
    }
}
