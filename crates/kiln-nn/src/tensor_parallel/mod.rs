//! Tensor-parallel layers, Megatron-LM's: every weight split over the ranks of a `tp` group,
//! the joins done by the group's operators inside the autodiff graph
//! ([`kiln_core::tensor_parallel::ops`]), so a sharded model trains with an ordinary backward.
//!
//! - [`ColumnParallelLinear`]: the output features split; the bias split with them. Its input
//!   is replicated and enters through `f` (identity forward, all-reduce backward).
//! - [`RowParallelLinear`]: the input features split; the partial outputs summed by `g`
//!   (all-reduce forward, identity backward); the bias added once, after the sum.
//! - [`ColumnParallelLora`] and [`RowParallelLora`]: a LoRA or QLoRA projection sharded with
//!   its base: for a column-parallel base `B` is split by output and `A` stays whole; for a
//!   row-parallel base `A` is split by input and `B` stays whole. A 4-bit base splits along
//!   whole quantisation blocks.
//! - Blocks made of them: [`TpCausalSelfAttention`] (the heads split over the shards: query,
//!   key and value column-parallel, the output row-parallel), [`TpPreNormBlock`] (kiln-nn's
//!   block), [`TpEncoderLayer`] (Burn's `TransformerEncoderLayer`) and [`TpLoraBlock`]. A dense
//!   block costs one all-reduce forward and one backward per attention and per feed-forward;
//!   [`TpLoraBlock`] one more backward all-reduce per column-parallel adapter (each `x·A`
//!   enters through its own `f`).
//!
//! Every sharded layer is built from the ordinary layer (`shard`) and gathered back into one
//! (`gather`), bit for bit, so a model trained with `Tensor` saves as, and loads into, the
//! ordinary model. Parameters keep their `ParamId`s and module paths.

mod attention;
mod block;
mod encoder;
mod linear;
mod lora;
mod lora_block;

use std::ops::Range;

use burn::module::{Param, ParamId};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_core::model::ShardError;

use kiln_core::tensor_parallel::TpBackend;
use kiln_kernels::KernelBackend;

pub use attention::TpCausalSelfAttention;
pub use block::TpPreNormBlock;
pub use encoder::TpEncoderLayer;
pub use linear::{ColumnParallelLinear, RowParallelLinear};
pub use lora::{ColumnParallelLora, QuantBase, RowParallelLora, ShardBase};
pub use lora_block::TpLoraBlock;

/// A backend with Kiln's kernels and the tensor-parallel operators: what the sharded blocks
/// run on (every backend Kiln trains on is one). One trait, because Burn's `Module` derive
/// carries a module's first backend bound over to the inner backend, and only the first.
pub trait ShardedBackend: KernelBackend + TpBackend {}

impl<B: KernelBackend + TpBackend> ShardedBackend for B {}

/// Shard `rank`'s part of `width` split `size` ways.
pub(crate) fn part(width: usize, rank: usize, size: usize) -> Range<usize> {
    let each = width / size;
    rank * each..(rank + 1) * each
}

/// Checks that `what` (of `size`) divides by `tp`.
pub(crate) fn divides(what: &str, size: usize, tp: usize) -> Result<(), ShardError> {
    if size.is_multiple_of(tp) {
        Ok(())
    } else {
        Err(ShardError::Indivisible {
            what: what.to_string(),
            size,
            tp,
        })
    }
}

/// `value` as the parameter `id`: a fresh autodiff leaf (no graph shared with the whole model
/// or another shard) that tracks its gradient when `trainable`.
pub(crate) fn leaf<B: Backend, const D: usize>(
    id: ParamId,
    value: Tensor<B, D>,
    trainable: bool,
) -> Param<Tensor<B, D>> {
    Param::initialized(id, value.detach().set_require_grad(trainable))
}

/// `param` itself, as a fresh leaf under the same id: what a shard holds of a replicated
/// parameter.
pub fn replicate<B: Backend, const D: usize>(param: &Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
    let value = param.val();
    let trainable = value.is_require_grad();
    leaf(param.id, value, trainable)
}

/// `module` with every float parameter a fresh leaf over the same values and id: a shard's copy
/// of replicated layers (norms, embeddings), whose graph then touches no other shard's.
pub fn fresh<B: Backend, M: burn::module::Module<B>>(module: &M) -> M {
    struct Fresh;
    impl<B: Backend> burn::module::ModuleMapper<B> for Fresh {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            replicate(&param)
        }
    }
    module.clone().map(&mut Fresh)
}

/// Refuses a layer with dropout: each shard would draw its own mask on activations that must
/// stay the same on every shard.
pub(crate) fn no_dropout(what: &str, prob: f64) -> Result<(), ShardError> {
    if prob > 0.0 {
        return Err(ShardError::Unsupported {
            what: what.to_string(),
            why: format!(
                "dropout {prob} would draw a different mask on each shard; use dropout 0 \
                 with tensor parallelism"
            ),
        });
    }
    Ok(())
}

/// Refuses more shards than heads, and heads that do not divide by the shards.
pub(crate) fn heads(heads: usize, tp: usize) -> Result<(), ShardError> {
    if tp > heads {
        return Err(ShardError::TooMany {
            what: "attention heads".to_string(),
            size: heads,
            tp,
        });
    }
    divides("attention heads", heads, tp)
}

/// `param`'s slice `range` of dimension `dim`, as a fresh leaf under the same id.
pub(crate) fn slice<B: Backend, const D: usize>(
    param: &Param<Tensor<B, D>>,
    dim: usize,
    range: Range<usize>,
) -> Param<Tensor<B, D>> {
    let value = param.val();
    let trainable = value.is_require_grad();
    let len = range.len();
    // Detached first: narrowing the tracked leaf would add a node to the whole model's graph
    // for every shard, nodes no backward ever consumes.
    leaf(
        param.id,
        value.detach().narrow(dim, range.start, len),
        trainable,
    )
}

/// The shards' parameters joined along `dim` on the first shard's device (each shard lives on
/// its rank's device), under the first shard's id, as a leaf like it.
pub(crate) fn join<B: Backend, const D: usize>(
    parts: &[&Param<Tensor<B, D>>],
    dim: usize,
) -> Param<Tensor<B, D>> {
    let first = parts[0].val();
    let (trainable, device) = (first.is_require_grad(), first.device());
    let values = parts
        .iter()
        .map(|p| p.val().detach().to_device(&device))
        .collect();
    leaf(parts[0].id, Tensor::cat(values, dim), trainable)
}
