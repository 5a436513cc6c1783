//! A [`CausalLm`] tensor-parallel, Megatron-LM's way: in every layer the query, key, value,
//! gate and up projections are column-parallel (their output features, so the attention heads
//! and the key/value heads, split over the `tp` group) and the output and down projections
//! row-parallel (their input features split, the partial outputs summed). The embedding, the
//! norms and the head are replicated.
//!
//! A shard is the same model: each [`Proj`] knows its part and its group, and calls the group
//! inside its forward (`Proj::tp`), as `kiln-nn`'s tensor-parallel layers do, and each
//! attention has its share of the heads. A projection's adapter is split with its base: a
//! column-parallel one keeps `A` whole and splits `B` by output, its low-rank product entering
//! through its own `f` so that `A`'s gradient is summed over the shards; a row-parallel one
//! splits `A` by input and keeps `B` whole, the two partial products summed in one all-reduce.
//! A 4-bit base splits along whole quantisation blocks.
//!
//! [`ShardedCausalLm`] is what one rank holds: a distinct type, because a model's shard
//! declares no tensor parallelism of its own (its `ParallelModel::Tensor` is `Unsupported`).

use super::proj::rows_matmul;
use burn::module::{AutodiffModule, Module, Param};
use burn::nn::Linear;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{FloatDType, Int, Tensor};
use burn::train::{SequenceOutput, TrainOutput, TrainStep};
use kiln_core::model::{
    LowPrecisionStep, ParallelModel, PipelineModel, ShardError, Supported, TensorParallelModel,
    Unsupported,
};
use kiln_core::tensor_parallel::TpGroup;
use kiln_core::tensor_parallel::ops::{copy_to_tp, reduce_from_tp};
use kiln_kernels::ops;
use kiln_kernels::quant::QuantizedWeight;

use super::{
    Attention, CausalLm, CausalLmStage, Decoder, DecoderLayer, LmBatch, Mlp, PackedRows, Proj,
    QuantizedBase,
};
use crate::lora::LoraAdapter;
use crate::tensor_parallel::{ShardedBackend, divides, fresh, heads, join, part, replicate, slice};

impl<B: ShardedBackend> Proj<B> {
    /// Shard `group.rank()` of this projection, its output features split (`column`) or its
    /// input features; `what` names it in errors.
    fn shard(&self, what: &str, column: bool, group: &TpGroup<B>) -> Result<Self, ShardError> {
        let [d_in, d_out] = self.dims();
        let (rank, size) = (group.rank(), group.size());
        let (base, quantized, lora) = if column {
            divides(&format!("{what}'s output features"), d_out, size)?;
            let cols = part(d_out, rank, size);
            let bias =
                |b: &Option<Param<Tensor<B, 1>>>| b.as_ref().map(|b| slice(b, 0, cols.clone()));
            (
                self.base.as_ref().map(|l| Linear {
                    weight: slice(&l.weight, 1, cols.clone()),
                    bias: bias(&l.bias),
                }),
                self.quantized.as_ref().map(|q| QuantizedBase {
                    weight: q.weight.columns(cols.clone()),
                    bias: bias(&q.bias),
                }),
                self.lora.as_ref().map(|a| LoraAdapter {
                    a: replicate(&a.a),
                    b: slice(&a.b, 1, cols.clone()),
                }),
            )
        } else {
            divides(&format!("{what}'s input features"), d_in, size)?;
            let rows = part(d_in, rank, size);
            let quantized = match &self.quantized {
                Some(q) => Some(QuantizedBase {
                    weight: q
                        .weight
                        .rows(rows.clone())
                        .map_err(|_| ShardError::QuantBlocks {
                            what: what.to_string(),
                            rows: rows.len(),
                        })?,
                    bias: q.bias.as_ref().map(replicate),
                }),
                None => None,
            };
            (
                self.base.as_ref().map(|l| Linear {
                    weight: slice(&l.weight, 0, rows.clone()),
                    bias: l.bias.as_ref().map(replicate),
                }),
                quantized,
                self.lora.as_ref().map(|a| LoraAdapter {
                    a: slice(&a.a, 0, rows.clone()),
                    b: replicate(&a.b),
                }),
            )
        };
        Ok(Self {
            base,
            quantized,
            lora,
            scale: self.scale,
            dropout: self.dropout,
            tp: Some(group.clone()),
            row: !column,
        })
    }

    /// The whole projection from its shards, in shard order.
    fn gather(shards: &[&Self]) -> Self {
        let first = shards[0];
        let column = !first.row;
        // Column shards join along the outputs (dimension 1 of `[in, out]`), row shards along
        // the inputs; whatever a row shard holds whole is the first's.
        let dim = if column { 1 } else { 0 };
        let bias = |biases: Vec<&Param<Tensor<B, 1>>>| {
            if biases.is_empty() {
                None
            } else if column {
                Some(join(&biases, 0))
            } else {
                Some(replicate(biases[0]))
            }
        };
        let base = first.base.as_ref().map(|_| {
            let linears: Vec<&Linear<B>> = shards.iter().filter_map(|s| s.base.as_ref()).collect();
            let weights: Vec<_> = linears.iter().map(|l| &l.weight).collect();
            Linear {
                weight: join(&weights, dim),
                bias: bias(linears.iter().filter_map(|l| l.bias.as_ref()).collect()),
            }
        });
        let quantized = first.quantized.as_ref().map(|_| {
            let parts: Vec<&QuantizedBase<B>> =
                shards.iter().filter_map(|s| s.quantized.as_ref()).collect();
            let weights: Vec<QuantizedWeight<B>> = parts.iter().map(|q| q.weight.clone()).collect();
            QuantizedBase {
                weight: if column {
                    QuantizedWeight::concat_columns(&weights)
                } else {
                    QuantizedWeight::concat_rows(&weights)
                },
                bias: bias(parts.iter().filter_map(|q| q.bias.as_ref()).collect()),
            }
        });
        let lora = first.lora.as_ref().map(|_| {
            let adapters: Vec<&LoraAdapter<B>> =
                shards.iter().filter_map(|s| s.lora.as_ref()).collect();
            let a: Vec<_> = adapters.iter().map(|x| &x.a).collect();
            let b: Vec<_> = adapters.iter().map(|x| &x.b).collect();
            if column {
                LoraAdapter {
                    a: replicate(a[0]),
                    b: join(&b, 1),
                }
            } else {
                LoraAdapter {
                    a: join(&a, 0),
                    b: replicate(b[0]),
                }
            }
        });
        Self {
            base,
            quantized,
            lora,
            scale: first.scale,
            dropout: first.dropout,
            tp: None,
            row: false,
        }
    }

    /// A column shard: `y_t = f(x)·W_t (+ b_t) + s·f(x·A)·B_t`.
    pub(super) fn forward_column(&self, x: Tensor<B, 3>, group: &TpGroup<B>) -> Tensor<B, 3> {
        let t = self
            .lora
            .as_ref()
            .map(|a| copy_to_tp(rows_matmul(self.adapter_input(x.clone()), a.a.val()), group));
        self.base_plus_adapter(copy_to_tp(x, group), t)
    }

    /// A row shard: `y = g(x_t·W_t) + s·g(x_t·A_t)·B (+ b)`, both partial products summed in one
    /// all-reduce.
    pub(super) fn forward_row(&self, x: Tensor<B, 3>, group: &TpGroup<B>) -> Tensor<B, 3> {
        let (partial, bias) = match (&self.base, &self.quantized) {
            (Some(linear), _) => (
                rows_matmul(x.clone(), linear.weight.val()),
                linear.bias.as_ref().map(Param::val),
            ),
            (None, Some(q)) => (
                ops::quantized_matmul(x.clone(), &q.weight).unwrap_or_else(|e| panic!("{e}")),
                q.bias.as_ref().map(Param::val),
            ),
            (None, None) => unreachable!("a Proj is built with a base"),
        };
        let y = match &self.lora {
            Some(adapter) => {
                let low = rows_matmul(self.adapter_input(x), adapter.a.val());
                let [_, _, d_out] = partial.dims();
                let rank = low.dims()[2];
                let summed = reduce_from_tp(Tensor::cat(vec![partial, low], 2), group);
                let t = summed.clone().narrow(2, d_out, rank);
                summed.narrow(2, 0, d_out) + rows_matmul(t, adapter.b.val()).mul_scalar(self.scale)
            }
            None => reduce_from_tp(partial, group),
        };
        match bias {
            Some(bias) => y + bias.unsqueeze::<3>(),
            None => y,
        }
    }
}

impl<B: ShardedBackend> DecoderLayer<B> {
    /// Shard `group.rank()` of layer `i`.
    fn shard(&self, i: usize, group: &TpGroup<B>) -> Result<Self, ShardError> {
        let (a, m) = (&self.self_attn, &self.mlp);
        let tp = group.size();
        heads(a.heads, tp)?;
        divides(&format!("layer {i}'s key/value heads"), a.kv_heads, tp)?;
        let name = |p: &str| format!("model.layers.{i}.{p}");
        // Qwen3's per-head norms are replicated: every shard holds the whole gain and applies
        // it to its own heads. A gain that trained would take its gradient from each shard's
        // heads only, and those parts would need summing; fine-tuning keeps it frozen.
        for (norm, which) in [(&a.q_norm, "q_norm"), (&a.k_norm, "k_norm")] {
            if norm.as_ref().is_some_and(|n| n.gamma.is_require_grad()) {
                return Err(ShardError::Unsupported {
                    what: name(&format!("self_attn.{which}")),
                    why: "a trainable per-head norm is not sharded; freeze it (LoRA does)".into(),
                });
            }
        }
        Ok(Self {
            input_layernorm: fresh(&self.input_layernorm),
            self_attn: Attention {
                q_proj: a.q_proj.shard(&name("self_attn.q_proj"), true, group)?,
                k_proj: a.k_proj.shard(&name("self_attn.k_proj"), true, group)?,
                v_proj: a.v_proj.shard(&name("self_attn.v_proj"), true, group)?,
                o_proj: a.o_proj.shard(&name("self_attn.o_proj"), false, group)?,
                q_norm: a.q_norm.as_ref().map(fresh),
                k_norm: a.k_norm.as_ref().map(fresh),
                heads: a.heads / tp,
                kv_heads: a.kv_heads / tp,
                head_dim: a.head_dim,
            },
            post_attention_layernorm: fresh(&self.post_attention_layernorm),
            mlp: Mlp {
                gate_proj: m.gate_proj.shard(&name("mlp.gate_proj"), true, group)?,
                up_proj: m.up_proj.shard(&name("mlp.up_proj"), true, group)?,
                down_proj: m.down_proj.shard(&name("mlp.down_proj"), false, group)?,
            },
        })
    }

    /// The whole layer from its shards.
    fn gather(shards: &[&Self]) -> Self {
        let first = shards[0];
        let tp = shards.len();
        let proj = |pick: fn(&Self) -> &Proj<B>| {
            Proj::gather(&shards.iter().map(|s| pick(s)).collect::<Vec<_>>())
        };
        Self {
            input_layernorm: fresh(&first.input_layernorm),
            self_attn: Attention {
                q_proj: proj(|l| &l.self_attn.q_proj),
                k_proj: proj(|l| &l.self_attn.k_proj),
                v_proj: proj(|l| &l.self_attn.v_proj),
                o_proj: proj(|l| &l.self_attn.o_proj),
                q_norm: first.self_attn.q_norm.as_ref().map(fresh),
                k_norm: first.self_attn.k_norm.as_ref().map(fresh),
                heads: first.self_attn.heads * tp,
                kv_heads: first.self_attn.kv_heads * tp,
                head_dim: first.self_attn.head_dim,
            },
            post_attention_layernorm: fresh(&first.post_attention_layernorm),
            mlp: Mlp {
                gate_proj: proj(|l| &l.mlp.gate_proj),
                up_proj: proj(|l| &l.mlp.up_proj),
                down_proj: proj(|l| &l.mlp.down_proj),
            },
        }
    }
}

impl<B: ShardedBackend> CausalLm<B> {
    /// This model's embedding, final norm and head as fresh leaves, around `layers`.
    fn around(&self, layers: Vec<DecoderLayer<B>>) -> Self {
        Self {
            model: Decoder {
                embed_tokens: fresh(&self.model.embed_tokens),
                layers,
                norm: fresh(&self.model.norm),
                rope: self.model.rope.clone(),
                checkpointing: self.model.checkpointing,
            },
            lm_head: self.lm_head.as_ref().map(fresh),
        }
    }
}

/// One tensor-parallel shard of a [`CausalLm`]: the model with its layers sharded, each
/// projection holding its slice (column- or row-parallel) and calling the group in its forward.
#[derive(Module, Debug)]
pub struct ShardedCausalLm<B: ShardedBackend> {
    /// The shard, as a model.
    pub lm: CausalLm<B>,
}

impl<B> TensorParallelModel<B> for CausalLm<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Sharded = ShardedCausalLm<B>;

    fn shard(&self, group: TpGroup<B>) -> Result<ShardedCausalLm<B>, ShardError> {
        let layers = self
            .model
            .layers
            .iter()
            .enumerate()
            .map(|(i, layer)| layer.shard(i, &group))
            .collect::<Result<_, _>>()?;
        Ok(ShardedCausalLm {
            lm: self.around(layers),
        })
    }

    fn gather(shards: Vec<ShardedCausalLm<B>>) -> Self {
        let first = &shards[0].lm;
        let layers = (0..first.model.layers.len())
            .map(|i| {
                let parts: Vec<&DecoderLayer<B>> =
                    shards.iter().map(|s| &s.lm.model.layers[i]).collect();
                DecoderLayer::gather(&parts)
            })
            .collect();
        first.around(layers)
    }
}

impl<B> TrainStep for ShardedCausalLm<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
    Self: AutodiffModule<B>,
{
    type Input = LmBatch<B>;
    type Output = SequenceOutput<B>;

    fn step(&self, batch: LmBatch<B>) -> TrainOutput<SequenceOutput<B>> {
        // The shard's parameters are its model's, under the same ids.
        self.lm.step(batch)
    }
}

impl<B> LowPrecisionStep<B> for ShardedCausalLm<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
    Self: AutodiffModule<B>,
    CausalLm<B>: AutodiffModule<B>,
{
    fn forward_in(&self, batch: LmBatch<B>, dtype: FloatDType) -> SequenceOutput<B> {
        self.lm.forward_in(batch, dtype)
    }

    fn grads_in(
        &self,
        batch: LmBatch<B>,
        dtype: FloatDType,
        loss_scale: Option<f64>,
    ) -> (GradientsParams, SequenceOutput<B>) {
        self.lm.grads_in(batch, dtype, loss_scale)
    }
}

/// A shard splits into pipeline stages as the whole model does (`dp × pp × tp`).
impl<B> PipelineModel<B> for ShardedCausalLm<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
    Self: AutodiffModule<B>,
    CausalLm<B>: AutodiffModule<B>,
    CausalLmStage<B>: AutodiffModule<B>,
{
    type Stage = CausalLmStage<B>;
    type Activation = Tensor<B, 3>;
    type FirstInput = Tensor<B, 2, Int>;
    type Target = (Tensor<B, 2, Int>, Tensor<B, 2>);
    type Context = Option<PackedRows<B>>;

    fn num_blocks(&self) -> usize {
        self.lm.num_blocks()
    }

    fn check_split(&self, stages: usize) -> Result<(), String> {
        self.lm.check_split(stages)
    }

    fn split(&self, ranges: &[std::ops::Range<usize>]) -> Vec<CausalLmStage<B>> {
        self.lm.split(ranges)
    }

    fn split_input(batch: LmBatch<B>) -> (Tensor<B, 2, Int>, Self::Context, Self::Target) {
        CausalLm::<B>::split_input(batch)
    }

    fn embed(stage: &CausalLmStage<B>, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        CausalLm::<B>::embed(stage, tokens)
    }

    fn blocks(
        stage: &CausalLmStage<B>,
        x: Tensor<B, 3>,
        packed: &Option<PackedRows<B>>,
    ) -> Tensor<B, 3> {
        CausalLm::<B>::blocks(stage, x, packed)
    }

    fn loss(stage: &CausalLmStage<B>, x: Tensor<B, 3>, target: Self::Target) -> Tensor<B, 1> {
        CausalLm::<B>::loss(stage, x, target)
    }
}

impl<B> ParallelModel<B> for ShardedCausalLm<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Pipeline = Supported;
    type Tensor = Unsupported;
    type LowPrecision = Supported;
}
