//! Many tensors cast to one float dtype, side by side in a flat buffer.

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor};

use crate::FlatLayout;

/// `tensors` cast to `dtype`, laid out by `layout` with zeros in the padding.
pub fn cast_many<B: Backend>(
    tensors: Vec<Tensor<B, 1>>,
    layout: &FlatLayout,
    dtype: FloatDType,
    device: &B::Device,
) -> Tensor<B, 1> {
    let parts = tensors.into_iter().map(|t| t.cast(dtype)).collect();
    layout.join(parts, device, dtype.into())
}
