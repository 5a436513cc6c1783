//! Rotary position embeddings in the half-split layout of Hugging Face's LLaMA: per position
//! `p`, `y = x·cos_p + rotate_half(x)·sin_p` with `rotate_half(x) = cat(−x₂, x₁)`.
//!
//! The tables hold the sign: `sin` is `[−sin, +sin]` over the two halves, so the rotation is
//! `x·cos + swap(x)·sin` where `swap` exchanges the halves, the same products and sums as
//! Hugging Face's, bit for bit. Its backward is the same rotation with `−sin`: `swap` is its own
//! transpose and `swap(sin) = −sin`.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

/// `x [batch, seq, heads, d]` rotated by the tables `cos`, `sin` of its positions: `[seq, d]`,
/// the same for every sequence, or `[batch·seq, d]`, a row per token.
pub fn forward<B: Backend>(x: Tensor<B, 4>, cos: Tensor<B, 2>, sin: Tensor<B, 2>) -> Tensor<B, 4> {
    let [batch, seq, _, d] = x.dims();
    let batch = if cos.dims()[0] == seq { 1 } else { batch };
    let half = d / 2;
    let swap: Vec<i64> = (half..d).chain(0..half).map(|i| i as i64).collect();
    let swap = Tensor::<B, 1, Int>::from_data(TensorData::new(swap, [d]), &x.device());
    let table = |t: Tensor<B, 2>| t.reshape([batch, seq, 1, d]);
    x.clone() * table(cos) + x.select(3, swap) * table(sin)
}
