//! RMSNorm over the last dimension of a `[rows, d]` tensor.
//!
//! The statistics are taken in f32 whatever the input's dtype, as the kernel does (and Burn's
//! `RmsNorm` and transformers' `LlamaRMSNorm`): a mean of squares in f16 loses the digits the
//! normalisation divides by. The results are rounded to the input's dtype once.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

/// `(y, rstd)` with `y = x · rstd · γ`, `rstd = 1/√(mean(x²) + ε)` per row (`[rows]`).
pub fn forward<B: Backend>(
    x: Tensor<B, 2>,
    gamma: Tensor<B, 1>,
    eps: f32,
) -> (Tensor<B, 2>, Tensor<B, 1>) {
    let dtype = x.dtype();
    let x = x.cast(DType::F32);
    let rstd = x
        .clone()
        .square()
        .mean_dim(1)
        .add_scalar(eps)
        .sqrt()
        .recip();
    let y = x * rstd.clone() * gamma.cast(DType::F32).unsqueeze::<2>();
    (y.cast(dtype), rstd.squeeze_dim::<1>(1).cast(dtype))
}

/// `(dx, dγ)`. With `x̂ = x·rstd` and `g = dy·γ`: `dx = rstd·(g − x̂·mean(g·x̂))`,
/// `dγ = Σ_rows dy·x̂`.
pub fn backward<B: Backend>(
    dy: Tensor<B, 2>,
    x: Tensor<B, 2>,
    gamma: Tensor<B, 1>,
    rstd: Tensor<B, 1>,
) -> (Tensor<B, 2>, Tensor<B, 1>) {
    let dtype = x.dtype();
    let dx = input_grad(dy.clone(), x.clone(), gamma, rstd.clone());
    let xhat = x.cast(DType::F32) * rstd.cast(DType::F32).unsqueeze_dim::<2>(1);
    let dgamma = (dy.cast(DType::F32) * xhat).sum_dim(0).squeeze_dim(0);
    (dx, dgamma.cast(dtype))
}

/// `dx` alone (a frozen gain's backward).
pub fn input_grad<B: Backend>(
    dy: Tensor<B, 2>,
    x: Tensor<B, 2>,
    gamma: Tensor<B, 1>,
    rstd: Tensor<B, 1>,
) -> Tensor<B, 2> {
    let dtype = x.dtype();
    let [dy, x] = [dy, x].map(|t| t.cast(DType::F32));
    let rstd = rstd.cast(DType::F32).unsqueeze_dim::<2>(1);
    let xhat = x * rstd.clone();
    let g = dy * gamma.cast(DType::F32).unsqueeze::<2>();
    let proj = (g.clone() * xhat.clone()).mean_dim(1);
    ((g - xhat * proj) * rstd).cast(dtype)
}
