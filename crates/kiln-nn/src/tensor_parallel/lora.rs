//! LoRA and QLoRA projections sharded with their base.
//!
//! Column-parallel: `y_t = f(x)·W_t + s·f(x·A)·B_t`. `A` stays whole: its input `x` is the same
//! on every shard, and the low-rank product `x·A` goes through its own `f`, so that `A`'s
//! gradient (which each shard's `B_t` contributes to) is summed over the group and the same on
//! every shard, and `x`'s gradient through it is counted once.
//!
//! Row-parallel: `y = g(x_t·W_t) + s·g(x_t·A_t)·B`. `B` stays whole and multiplies the summed
//! low-rank product, so its gradient is the same on every shard. Both partial products travel
//! in one all-reduce.

use burn::module::{Module, Param};
use burn::nn::{DropoutConfig, Linear};
use burn::tensor::Tensor;
use kiln_core::model::ShardError;
use kiln_core::tensor_parallel::TpGroup;
use kiln_core::tensor_parallel::ops::{copy_to_tp, reduce_from_tp};
use kiln_kernels::ops;
use kiln_kernels::quant::QuantizedWeight;

use super::linear::rows_linear;
use super::{ShardedBackend, divides, join, part, replicate, slice};
use crate::lora::{LoraAdapter, LoraLinear, Projection, QLoraLinear};

/// A shard's frozen base: dense or 4-bit, with the bias that goes with it (split for a
/// column-parallel shard, whole for a row-parallel one).
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum ShardBase<B: ShardedBackend> {
    /// A dense base.
    Dense(Linear<B>),
    /// A 4-bit base.
    Quantized(QuantBase<B>),
}

/// A 4-bit base shard and its bias.
#[derive(Module, Debug)]
pub struct QuantBase<B: ShardedBackend> {
    /// The codes and scales of the shard.
    pub weight: QuantizedWeight<B>,
    /// The frozen bias, if the layer has one.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

/// A LoRA or QLoRA projection whose output features are split over the `tp` group: `A` whole,
/// `B` split by output, the low-rank product entering through its own `f` so that `A`'s
/// gradient is summed over the group.
#[derive(Module, Debug)]
pub struct ColumnParallelLora<B: ShardedBackend> {
    /// The base's columns.
    pub base: ShardBase<B>,
    /// `A` whole, `B`'s columns.
    pub adapter: LoraAdapter<B>,
    scale: f32,
    #[module(skip)]
    tp: TpGroup<B>,
}

/// A LoRA or QLoRA projection whose input features are split over the `tp` group: `A` split by
/// input, `B` whole, both partial products summed in one all-reduce.
#[derive(Module, Debug)]
pub struct RowParallelLora<B: ShardedBackend> {
    /// The base's rows (whole quantisation blocks for a 4-bit base).
    pub base: ShardBase<B>,
    /// `A`'s rows, `B` whole.
    pub adapter: LoraAdapter<B>,
    scale: f32,
    #[module(skip)]
    tp: TpGroup<B>,
}

/// The parts of a projection that sharding reads, or why it cannot be sharded.
fn parts<'a, B: kiln_kernels::KernelBackend>(
    what: &str,
    projection: &'a Projection<B>,
) -> Result<(&'a LoraAdapter<B>, f32), ShardError> {
    let (adapter, dropout, scale, merged) = match projection {
        Projection::Lora(l) => (&l.adapter, l.dropout.prob, l.scale, l.merged),
        Projection::QLora(l) => (&l.adapter, l.dropout.prob, l.scale, false),
    };
    let refuse = |why: &str| ShardError::Unsupported {
        what: what.to_string(),
        why: why.to_string(),
    };
    if merged {
        return Err(refuse(
            "its adapter is merged into the base; unmerge it first",
        ));
    }
    if dropout > 0.0 {
        return Err(refuse(
            "its adapter has dropout, which each shard would draw differently; use dropout 0",
        ));
    }
    Ok((adapter, scale))
}

/// The projection `base` and `adapter` make, as the ordinary layer.
fn projection<B: ShardedBackend>(
    base: ShardBase<B>,
    adapter: LoraAdapter<B>,
    scale: f32,
) -> Projection<B> {
    let dropout = DropoutConfig::new(0.0).init();
    match base {
        ShardBase::Dense(base) => Projection::Lora(LoraLinear {
            base,
            adapter,
            dropout,
            scale,
            merged: false,
        }),
        ShardBase::Quantized(QuantBase { weight: base, bias }) => Projection::QLora(QLoraLinear {
            base,
            bias,
            adapter,
            dropout,
            scale,
        }),
    }
}

impl<B: ShardedBackend> ColumnParallelLora<B> {
    /// Shard `tp.rank()` of `projection`, named `what` in errors.
    ///
    /// # Errors
    /// [`ShardError`] when the output features do not divide by the group, or the adapter is
    /// merged or has dropout.
    pub fn shard(
        what: &str,
        projection: &Projection<B>,
        tp: TpGroup<B>,
    ) -> Result<Self, ShardError> {
        let (adapter, scale) = parts(what, projection)?;
        let d_out = adapter.b.dims()[1];
        divides(&format!("{what}'s output features"), d_out, tp.size())?;
        let cols = part(d_out, tp.rank(), tp.size());
        let base = match projection {
            Projection::Lora(l) => ShardBase::Dense(Linear {
                weight: slice(&l.base.weight, 1, cols.clone()),
                bias: l.base.bias.as_ref().map(|b| slice(b, 0, cols.clone())),
            }),
            Projection::QLora(l) => ShardBase::Quantized(QuantBase {
                weight: l.base.columns(cols.clone()),
                bias: l.bias.as_ref().map(|b| slice(b, 0, cols.clone())),
            }),
        };
        Ok(Self {
            base,
            adapter: LoraAdapter {
                a: replicate(&adapter.a),
                b: slice(&adapter.b, 1, cols),
            },
            scale,
            tp,
        })
    }

    /// The whole projection from its shards, in shard order.
    pub fn gather(shards: &[Self]) -> Projection<B> {
        let bs: Vec<_> = shards.iter().map(|s| &s.adapter.b).collect();
        let adapter = LoraAdapter {
            a: replicate(&shards[0].adapter.a),
            b: join(&bs, 1),
        };
        let base = match &shards[0].base {
            ShardBase::Dense(_) => {
                let linears: Vec<_> = shards
                    .iter()
                    .map(|s| match &s.base {
                        ShardBase::Dense(l) => l,
                        ShardBase::Quantized(..) => unreachable!("shards of one projection"),
                    })
                    .collect();
                let weights: Vec<_> = linears.iter().map(|l| &l.weight).collect();
                let biases: Vec<_> = linears.iter().filter_map(|l| l.bias.as_ref()).collect();
                ShardBase::Dense(Linear {
                    weight: join(&weights, 1),
                    bias: (!biases.is_empty()).then(|| join(&biases, 0)),
                })
            }
            ShardBase::Quantized(..) => {
                let (weights, biases): (Vec<_>, Vec<_>) = shards
                    .iter()
                    .map(|s| match &s.base {
                        ShardBase::Quantized(q) => (q.weight.clone(), q.bias.as_ref()),
                        ShardBase::Dense(_) => unreachable!("shards of one projection"),
                    })
                    .unzip();
                let biases: Vec<_> = biases.into_iter().flatten().collect();
                ShardBase::Quantized(QuantBase {
                    weight: QuantizedWeight::concat_columns(&weights),
                    bias: (!biases.is_empty()).then(|| join(&biases, 0)),
                })
            }
        };
        projection(base, adapter, shards[0].scale)
    }

    /// `y_t = u·W_t (+ b_t) + s·f(x·A)·B_t`, where `u = f(x)` is the input after the `f` that
    /// the block's column-parallel projections share: `[b, s, d_in]` → `[b, s, d_out / tp]`.
    pub fn forward(&self, x: Tensor<B, 3>, u: Tensor<B, 3>) -> Tensor<B, 3> {
        let t = copy_to_tp(x.matmul(self.adapter.a.val().unsqueeze()), &self.tp);
        let b = self.adapter.b.val();
        match &self.base {
            ShardBase::Dense(base) => {
                let y = rows_linear(u, base.weight.val(), base.bias.as_ref().map(Param::val));
                y + t.matmul(b.unsqueeze()).mul_scalar(self.scale)
            }
            ShardBase::Quantized(QuantBase { weight, bias }) => {
                let y = ops::qlora_matmul(u, weight, t, b, self.scale)
                    .unwrap_or_else(|e| panic!("{e}"));
                match bias {
                    Some(bias) => y + bias.val().unsqueeze(),
                    None => y,
                }
            }
        }
    }
}

impl<B: ShardedBackend> RowParallelLora<B> {
    /// Shard `tp.rank()` of `projection`, named `what` in errors.
    ///
    /// # Errors
    /// [`ShardError`] when the input features do not divide by the group or a 4-bit base's
    /// shard would cut its quantisation blocks, or the adapter is merged or has dropout.
    pub fn shard(
        what: &str,
        projection: &Projection<B>,
        tp: TpGroup<B>,
    ) -> Result<Self, ShardError> {
        let (adapter, scale) = parts(what, projection)?;
        let d_in = adapter.a.dims()[0];
        divides(&format!("{what}'s input features"), d_in, tp.size())?;
        let rows = part(d_in, tp.rank(), tp.size());
        let base = match projection {
            Projection::Lora(l) => ShardBase::Dense(Linear {
                weight: slice(&l.base.weight, 0, rows.clone()),
                bias: l.base.bias.as_ref().map(replicate),
            }),
            Projection::QLora(l) => ShardBase::Quantized(QuantBase {
                weight: l
                    .base
                    .rows(rows.clone())
                    .map_err(|_| ShardError::QuantBlocks {
                        what: what.to_string(),
                        rows: rows.len(),
                    })?,
                bias: l.bias.as_ref().map(replicate),
            }),
        };
        Ok(Self {
            base,
            adapter: LoraAdapter {
                a: slice(&adapter.a, 0, rows),
                b: replicate(&adapter.b),
            },
            scale,
            tp,
        })
    }

    /// The whole projection from its shards, in shard order.
    pub fn gather(shards: &[Self]) -> Projection<B> {
        let a_parts: Vec<_> = shards.iter().map(|s| &s.adapter.a).collect();
        let adapter = LoraAdapter {
            a: join(&a_parts, 0),
            b: replicate(&shards[0].adapter.b),
        };
        let base = match &shards[0].base {
            ShardBase::Dense(first) => {
                let weights: Vec<_> = shards
                    .iter()
                    .map(|s| match &s.base {
                        ShardBase::Dense(l) => &l.weight,
                        ShardBase::Quantized(..) => unreachable!("shards of one projection"),
                    })
                    .collect();
                ShardBase::Dense(Linear {
                    weight: join(&weights, 0),
                    bias: first.bias.as_ref().map(replicate),
                })
            }
            ShardBase::Quantized(first) => {
                let weights: Vec<_> = shards
                    .iter()
                    .map(|s| match &s.base {
                        ShardBase::Quantized(q) => q.weight.clone(),
                        ShardBase::Dense(_) => unreachable!("shards of one projection"),
                    })
                    .collect();
                ShardBase::Quantized(QuantBase {
                    weight: QuantizedWeight::concat_rows(&weights),
                    bias: first.bias.as_ref().map(replicate),
                })
            }
        };
        projection(base, adapter, shards[0].scale)
    }

    /// `y = g(x_t·W_t) + s·g(x_t·A_t)·B (+ b)`, the two partial products summed in one
    /// all-reduce: `[b, s, d_in / tp]` → `[b, s, d_out]`, the same on every shard.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let low = x.clone().matmul(self.adapter.a.val().unsqueeze());
        let (partial, bias) = match &self.base {
            ShardBase::Dense(base) => (
                rows_linear(x, base.weight.val(), None),
                base.bias.as_ref().map(Param::val),
            ),
            ShardBase::Quantized(QuantBase { weight, bias }) => (
                ops::quantized_matmul(x, weight).unwrap_or_else(|e| panic!("{e}")),
                bias.as_ref().map(Param::val),
            ),
        };
        let [_, _, d_out] = partial.dims();
        let rank = low.dims()[2];
        let summed = reduce_from_tp(Tensor::cat(vec![partial, low], 2), &self.tp);
        let y = summed.clone().narrow(2, 0, d_out);
        let t = summed.narrow(2, d_out, rank);
        let y = y + t
            .matmul(self.adapter.b.val().unsqueeze())
            .mul_scalar(self.scale);
        match bias {
            Some(bias) => y + bias.unsqueeze(),
            None => y,
        }
    }
}
