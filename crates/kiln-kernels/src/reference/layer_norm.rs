//! LayerNorm over the last dimension of a `[rows, d]` tensor, as Burn's `LayerNorm` computes it.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// `(y, mean, rstd)`: `y = (x − mean)·rstd·γ + β` with the biased variance and
/// `rstd = 1/√(var + ε)`; `mean` and `rstd` are `[rows]`.
pub fn forward<B: Backend>(
    x: Tensor<B, 2>,
    gamma: Tensor<B, 1>,
    beta: Tensor<B, 1>,
    eps: f32,
) -> (Tensor<B, 2>, Tensor<B, 1>, Tensor<B, 1>) {
    let (var, mean) = x.clone().var_mean_bias(1);
    let rstd = var.add_scalar(eps).sqrt().recip();
    let y = (x - mean.clone()) * rstd.clone() * gamma.unsqueeze::<2>() + beta.unsqueeze::<2>();
    (y, mean.squeeze_dim(1), rstd.squeeze_dim(1))
}

/// `(dx, dγ, dβ)`. With `x̂ = (x − mean)·rstd` and `g = dy·γ`:
/// `dx = rstd·(g − mean(g) − x̂·mean(g·x̂))`, `dγ = Σ_rows dy·x̂`, `dβ = Σ_rows dy`.
pub fn backward<B: Backend>(
    dy: Tensor<B, 2>,
    x: Tensor<B, 2>,
    gamma: Tensor<B, 1>,
    mean: Tensor<B, 1>,
    rstd: Tensor<B, 1>,
) -> (Tensor<B, 2>, Tensor<B, 1>, Tensor<B, 1>) {
    let rstd = rstd.unsqueeze_dim::<2>(1);
    let xhat = (x - mean.unsqueeze_dim::<2>(1)) * rstd.clone();
    let g = dy.clone() * gamma.unsqueeze::<2>();
    let mean_g = g.clone().mean_dim(1);
    let mean_gx = (g.clone() * xhat.clone()).mean_dim(1);
    let dx = (g - mean_g - xhat.clone() * mean_gx) * rstd;
    let dgamma = (dy.clone() * xhat).sum_dim(0).squeeze_dim(0);
    let dbeta = dy.sum_dim(0).squeeze_dim(0);
    (dx, dgamma, dbeta)
}
