//! Megatron-LM's column- and row-parallel linear layers.

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::Tensor;
use kiln_core::model::ShardError;
use kiln_core::tensor_parallel::ops::{copy_to_tp, gather_from_tp, reduce_from_tp, scatter_to_tp};
use kiln_core::tensor_parallel::{TpBackend, TpGroup};

use super::{divides, join, part, replicate, slice};

/// A linear layer whose output features are split over the `tp` group: shard `t` holds
/// columns `t·n/tp .. (t+1)·n/tp` of the weight (`[d_in, d_out]`, Burn's layout) and of the
/// bias.
///
/// `y_t = f(x)·W_t + b_t`: the input is replicated and enters through `f`, so the partial
/// input gradients of the shards are summed in the backward. With `gather_output` the shards'
/// outputs are gathered into the whole `y`; without it (the usual case, followed by a
/// [`RowParallelLinear`]) each shard keeps its `y_t`.
#[derive(Module, Debug)]
pub struct ColumnParallelLinear<B: TpBackend> {
    /// `[d_in, d_out / tp]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[d_out / tp]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    #[module(skip)]
    tp: TpGroup<B>,
    gather_output: bool,
}

impl<B: TpBackend> ColumnParallelLinear<B> {
    /// Shard `tp.rank()` of `linear`.
    ///
    /// # Errors
    /// [`ShardError::Indivisible`] when the output features do not divide by the group.
    pub fn shard(
        linear: &Linear<B>,
        tp: TpGroup<B>,
        gather_output: bool,
    ) -> Result<Self, ShardError> {
        let [_, d_out] = linear.weight.dims();
        divides(
            "a column-parallel layer's output features",
            d_out,
            tp.size(),
        )?;
        let cols = part(d_out, tp.rank(), tp.size());
        Ok(Self {
            weight: slice(&linear.weight, 1, cols.clone()),
            bias: linear.bias.as_ref().map(|b| slice(b, 0, cols)),
            tp,
            gather_output,
        })
    }

    /// The whole layer from its shards, in shard order: the inverse of [`Self::shard`].
    pub fn gather(shards: &[Self]) -> Linear<B> {
        let weights: Vec<_> = shards.iter().map(|s| &s.weight).collect();
        let bias = shards[0].bias.as_ref().map(|_| {
            let biases: Vec<_> = shards.iter().filter_map(|s| s.bias.as_ref()).collect();
            join(&biases, 0)
        });
        Linear {
            weight: join(&weights, 1),
            bias,
        }
    }

    /// `f(x)·W_t + b_t` (gathered with `gather_output`): `[.., d_in]` → `[.., d_out / tp]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.forward_copied(copy_to_tp(x, &self.tp))
    }

    /// [`Self::forward`] of an input that already went through `f`: several column-parallel
    /// layers that read the same input (query, key and value) share one `f`, so their input
    /// gradients are summed over the group once.
    pub fn forward_copied<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let y = rows_linear(x, self.weight.val(), self.bias.as_ref().map(Param::val));
        if self.gather_output {
            gather_from_tp(y, &self.tp)
        } else {
            y
        }
    }
}

/// A linear layer whose input features are split over the `tp` group: shard `t` holds rows
/// `t·k/tp .. (t+1)·k/tp` of the weight; the bias is replicated.
///
/// `y = g(x_t·W_t) + b`: the shards' partial products are summed by `g` (in rank order, so
/// every shard gets the same `y`), and the bias is added once, after the sum. With
/// `input_is_parallel` (the usual case, after a [`ColumnParallelLinear`]) the input is each
/// shard's `x_t`; without it the whole `x` is split here.
#[derive(Module, Debug)]
pub struct RowParallelLinear<B: TpBackend> {
    /// `[d_in / tp, d_out]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[d_out]`, the same on every shard.
    pub bias: Option<Param<Tensor<B, 1>>>,
    #[module(skip)]
    tp: TpGroup<B>,
    input_is_parallel: bool,
}

impl<B: TpBackend> RowParallelLinear<B> {
    /// Shard `tp.rank()` of `linear`.
    ///
    /// # Errors
    /// [`ShardError::Indivisible`] when the input features do not divide by the group.
    pub fn shard(
        linear: &Linear<B>,
        tp: TpGroup<B>,
        input_is_parallel: bool,
    ) -> Result<Self, ShardError> {
        let [d_in, _] = linear.weight.dims();
        divides("a row-parallel layer's input features", d_in, tp.size())?;
        let rows = part(d_in, tp.rank(), tp.size());
        Ok(Self {
            weight: slice(&linear.weight, 0, rows),
            bias: linear.bias.as_ref().map(replicate),
            tp,
            input_is_parallel,
        })
    }

    /// The whole layer from its shards, in shard order: the inverse of [`Self::shard`].
    pub fn gather(shards: &[Self]) -> Linear<B> {
        let weights: Vec<_> = shards.iter().map(|s| &s.weight).collect();
        Linear {
            weight: join(&weights, 0),
            bias: shards[0].bias.as_ref().map(replicate),
        }
    }

    /// `g(x_t·W_t) + b`: `[.., d_in / tp]` (or `[.., d_in]` without `input_is_parallel`) →
    /// `[.., d_out]`, the same on every shard.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let x = if self.input_is_parallel {
            x
        } else {
            scatter_to_tp(x, &self.tp)
        };
        let y = reduce_from_tp(rows_linear(x, self.weight.val(), None), &self.tp);
        match &self.bias {
            Some(bias) => y + bias.val().unsqueeze(),
            None => y,
        }
    }
}

/// `x·weight (+ bias)` over the last dimension of `x`, computed on its rows as one matrix (see
/// [`crate::layers::linear_rows`] for why).
pub(crate) fn rows_linear<B: burn::tensor::backend::Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, D> {
    let dims = x.dims();
    let d_in = dims[D - 1];
    let rows = dims[..D - 1].iter().product::<usize>();
    let y = burn::tensor::module::linear(x.reshape([rows, d_in]), weight, bias);
    let mut out = dims;
    out[D - 1] = y.dims()[1];
    y.reshape(out)
}
