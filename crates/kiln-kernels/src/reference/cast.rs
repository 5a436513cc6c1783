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
    let mut parts = Vec::new();
    for (i, t) in tensors.into_iter().enumerate() {
        parts.push(t.cast(dtype));
        let pad = layout.padding(i);
        if pad > 0 {
            parts.push(Tensor::zeros([pad], (device, dtype.into())));
        }
    }
    if parts.is_empty() {
        Tensor::zeros([0], (device, dtype.into()))
    } else {
        Tensor::cat(parts, 0)
    }
}
