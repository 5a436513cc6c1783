//! The linear layer, its epilogue and the column sum of its bias's gradient, in plain Burn ops.

use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;

use crate::Epilogue;

/// `x·w (+ b)`: `x [rows, k]`, `w [k, n]`, `b [n]` → `[rows, n]`.
pub fn forward<B: Backend>(
    x: Tensor<B, 2>,
    w: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
) -> Tensor<B, 2> {
    epilogue(x.matmul(w), b, Epilogue::None)
}

/// `epilogue(y + b)`: `y [rows, n]`, `b [n]`, a residual `[rows, n]`.
pub fn epilogue<B: Backend>(
    y: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
    epilogue: Epilogue<Tensor<B, 2>>,
) -> Tensor<B, 2> {
    let y = match b {
        Some(b) => y + b.unsqueeze_dim(0),
        None => y,
    };
    match epilogue {
        Epilogue::None => y,
        Epilogue::Residual(r) => y + r,
        Epilogue::Relu => relu(y),
    }
}

/// `Σ over the rows of x [rows, cols]`: `[cols]`.
pub fn column_sum<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 1> {
    let cols = x.dims()[1];
    x.sum_dim(0).reshape([cols])
}
