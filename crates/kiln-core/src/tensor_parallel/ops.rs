//! The four operators on `Tensor`s of any rank: what tensor-parallel layers call.
//!
//! Names follow Megatron-LM's (`copy_to_tensor_model_parallel_region` and its kin). On a group
//! of one rank each is the identity.

use burn::tensor::{Tensor, TensorPrimitive};

use super::{TpBackend, TpGroup};

fn apply<B: TpBackend, const D: usize>(
    x: Tensor<B, D>,
    group: &TpGroup<B>,
    op: fn(burn::tensor::ops::FloatTensor<B>, &TpGroup<B>) -> burn::tensor::ops::FloatTensor<B>,
) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(op(
        x.into_primitive().tensor(),
        group,
    )))
}

/// `f`: `x` unchanged; in the backward, the gradient summed over the group. Applied to the
/// replicated input of column-parallel layers, whose partial input gradients must add up.
pub fn copy_to_tp<B: TpBackend, const D: usize>(
    x: Tensor<B, D>,
    group: &TpGroup<B>,
) -> Tensor<B, D> {
    apply(x, group, B::tp_copy)
}

/// `g`: `x` summed over the group (every rank gets the same sum, added in rank order); in the
/// backward, the gradient unchanged. Joins the partial outputs of row-parallel layers.
pub fn reduce_from_tp<B: TpBackend, const D: usize>(
    x: Tensor<B, D>,
    group: &TpGroup<B>,
) -> Tensor<B, D> {
    apply(x, group, B::tp_reduce)
}

/// The ranks' `x` side by side along the last dimension (`[.., n]` → `[.., size · n]`, rank
/// order); in the backward, this rank's slice of the gradient. A column-parallel layer's
/// `gather_output`.
pub fn gather_from_tp<B: TpBackend, const D: usize>(
    x: Tensor<B, D>,
    group: &TpGroup<B>,
) -> Tensor<B, D> {
    apply(x, group, B::tp_gather)
}

/// This rank's slice of the last dimension (`[.., n]` → `[.., n / size]`); in the backward,
/// the slices' gradients gathered. A row-parallel layer's input when it is not already split.
///
/// # Panics
/// When the last dimension does not divide by the group's size.
pub fn scatter_to_tp<B: TpBackend, const D: usize>(
    x: Tensor<B, D>,
    group: &TpGroup<B>,
) -> Tensor<B, D> {
    apply(x, group, B::tp_scatter)
}
