//! The global squared norm and non-finite count of a set of tensors.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

/// `[Σ x² over finite x, count of non-finite x]` over all `tensors`, as a `[2]` f32 tensor.
pub fn sq_norm<B: Backend>(tensors: Vec<Tensor<B, 1>>, device: &B::Device) -> Tensor<B, 1> {
    let mut total = Tensor::<B, 1>::zeros([2], (device, DType::F32));
    for t in tensors {
        let t = t.cast(DType::F32);
        let bad = t.clone().is_nan().bool_or(t.clone().is_inf());
        let sq = t.mask_fill(bad.clone(), 0.0).square().sum();
        let count = bad.int().sum().float().cast(DType::F32);
        total = total + Tensor::cat(vec![sq, count], 0);
    }
    total
}
