//! The linear layer and the column sum of its bias's gradient, in plain Burn ops.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// `x·w (+ b)`: `x [rows, k]`, `w [k, n]`, `b [n]` → `[rows, n]`.
pub fn forward<B: Backend>(
    x: Tensor<B, 2>,
    w: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
) -> Tensor<B, 2> {
    let y = x.matmul(w);
    match b {
        Some(b) => y + b.unsqueeze_dim(0),
        None => y,
    }
}

/// `Σ over the rows of x [rows, cols]`: `[cols]`.
pub fn column_sum<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 1> {
    let cols = x.dims()[1];
    x.sum_dim(0).reshape([cols])
}
