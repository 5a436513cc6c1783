//! RMSNorm over the last dimension of a `[rows, d]` tensor.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// `(y, rstd)` with `y = x · rstd · γ`, `rstd = 1/√(mean(x²) + ε)` per row (`[rows]`).
pub fn forward<B: Backend>(
    x: Tensor<B, 2>,
    gamma: Tensor<B, 1>,
    eps: f32,
) -> (Tensor<B, 2>, Tensor<B, 1>) {
    let rstd = x
        .clone()
        .square()
        .mean_dim(1)
        .add_scalar(eps)
        .sqrt()
        .recip();
    let y = x * rstd.clone() * gamma.unsqueeze::<2>();
    (y, rstd.squeeze_dim(1))
}

/// `(dx, dγ)`. With `x̂ = x·rstd` and `g = dy·γ`: `dx = rstd·(g − x̂·mean(g·x̂))`,
/// `dγ = Σ_rows dy·x̂`.
pub fn backward<B: Backend>(
    dy: Tensor<B, 2>,
    x: Tensor<B, 2>,
    gamma: Tensor<B, 1>,
    rstd: Tensor<B, 1>,
) -> (Tensor<B, 2>, Tensor<B, 1>) {
    let rstd = rstd.unsqueeze_dim::<2>(1);
    let xhat = x * rstd.clone();
    let g = dy.clone() * gamma.unsqueeze::<2>();
    let proj = (g.clone() * xhat.clone()).mean_dim(1);
    let dx = (g - xhat.clone() * proj) * rstd;
    let dgamma = (dy * xhat).sum_dim(0).squeeze_dim(0);
    (dx, dgamma)
}
