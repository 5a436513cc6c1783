//! The QLoRA matmul by materialising `deq(W)`.

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorPrimitive};

use crate::quant::format::CODES_PER_WORD;
use crate::quant::{BLOCK, QuantizedPrimitive};

/// `deq(W)`, `[k, n]`, in the dtype of the code book times the scales' (f32 unless cast).
pub fn dequantize<B: Backend>(w: &QuantizedPrimitive<B>) -> Tensor<B, 2> {
    let packed: Tensor<B, 2, Int> = Tensor::from_primitive(w.packed.clone());
    let scales: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(w.scales.clone()));
    let codebook: Tensor<B, 1> = Tensor::from_primitive(TensorPrimitive::Float(w.codebook.clone()));
    let [n, words] = packed.dims();
    let blocks = scales.dims()[1];
    // Code j of each word sits in bits 4j..4j+4; an arithmetic shift of a negative word fills
    // with ones, which the mask removes.
    let codes = Tensor::stack::<3>(
        (0..CODES_PER_WORD)
            .map(|j| {
                packed
                    .clone()
                    .bitwise_right_shift_scalar((4 * j as i32).elem())
                    .bitwise_and_scalar(0xF_i32.elem())
            })
            .collect(),
        2,
    )
    .reshape([n * words * CODES_PER_WORD]);
    let values = codebook
        .select(0, codes)
        .reshape([n, words * CODES_PER_WORD])
        .narrow(1, 0, w.k);
    let scales = scales
        .cast(values.dtype())
        .unsqueeze_dim::<3>(2)
        .repeat_dim(2, BLOCK)
        .reshape([n, blocks * BLOCK])
        .narrow(1, 0, w.k);
    (values * scales).transpose()
}

/// `y = x·deq(W) + s·t·B` with `x: [m, k]`, `t = x·A: [m, r]`, `b: [r, n]`.
pub fn forward<B: Backend>(
    x: Tensor<B, 2>,
    w: &QuantizedPrimitive<B>,
    t: Tensor<B, 2>,
    b: Tensor<B, 2>,
    scale: f32,
) -> Tensor<B, 2> {
    let deq = dequantize(w).cast(x.dtype());
    x.matmul(deq) + t.matmul(b).mul_scalar(scale)
}

/// `dy·deq(W)ᵀ`: the base weight's share of the input gradient.
pub fn input_grad<B: Backend>(dy: Tensor<B, 2>, w: &QuantizedPrimitive<B>) -> Tensor<B, 2> {
    let deq = dequantize(w).cast(dy.dtype());
    dy.matmul(deq.transpose())
}
