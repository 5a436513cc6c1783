//! LayerNorm over the rows of a `[rows, d]` matrix, forward and backward, in one pass over
//! each row (Burn's composite makes a tensor per step: mean, centred, variance, scale, shift,
//! and twice as many in the backward).

use super::simd::{Kernel, dot, sum, sum_map, vectorized};

/// `(y, mean, rstd)`: `y = (x − mean)·rstd·γ + β` with the biased variance, as Burn's
/// `LayerNorm`; `mean` and `rstd = 1/√(var + ε)` per row for the backward.
pub(crate) fn forward(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / gamma.len();
    let mut y = vec![0.0; x.len()];
    let (mut mean, mut rstd) = (vec![0.0; rows], vec![0.0; rows]);
    vectorized(Forward {
        x,
        gamma,
        beta,
        eps,
        y: &mut y,
        mean: &mut mean,
        rstd: &mut rstd,
    });
    (y, mean, rstd)
}

struct Forward<'a> {
    x: &'a [f32],
    gamma: &'a [f32],
    beta: &'a [f32],
    eps: f32,
    y: &'a mut [f32],
    mean: &'a mut [f32],
    rstd: &'a mut [f32],
}

impl Kernel for Forward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let d = self.gamma.len();
        let rows = self.x.chunks_exact(d).zip(self.y.chunks_exact_mut(d));
        let stats = self.mean.iter_mut().zip(self.rstd.iter_mut());
        for ((x, y), (mean, rstd)) in rows.zip(stats) {
            let (m, r) = moments(x, self.eps);
            for (((y, &x), &g), &b) in y.iter_mut().zip(x).zip(self.gamma).zip(self.beta) {
                *y = (x - m) * r * g + b;
            }
            (*mean, *rstd) = (m, r);
        }
    }
}

/// The row's mean and `1/√(var + ε)`, two passes over it (the one-pass formula loses digits
/// when the mean is large next to the spread).
#[inline(always)]
fn moments(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = sum(x) / n;
    let var = sum_map(x, |v| (v - mean) * (v - mean)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `(dx, dγ, dβ)`. With `x̂ = (x − mean)·rstd` and `g = dy·γ`:
/// `dx = rstd·(g − mean(g) − x̂·mean(g·x̂))`, `dγ = Σ_rows dy·x̂`, `dβ = Σ_rows dy`.
pub(crate) fn backward(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let d = gamma.len();
    let mut dx = vec![0.0; x.len()];
    let (mut dgamma, mut dbeta) = (vec![0.0; d], vec![0.0; d]);
    vectorized(Backward {
        dy,
        x,
        gamma,
        mean,
        rstd,
        dx: &mut dx,
        dgamma: &mut dgamma,
        dbeta: &mut dbeta,
    });
    (dx, dgamma, dbeta)
}

struct Backward<'a> {
    dy: &'a [f32],
    x: &'a [f32],
    gamma: &'a [f32],
    mean: &'a [f32],
    rstd: &'a [f32],
    dx: &'a mut [f32],
    dgamma: &'a mut [f32],
    dbeta: &'a mut [f32],
}

impl Kernel for Backward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let d = self.gamma.len();
        let n = d as f32;
        let (mut xhat, mut g) = (vec![0.0f32; d], vec![0.0f32; d]);
        let rows = self.dy.chunks_exact(d).zip(self.x.chunks_exact(d));
        let rows = rows.zip(self.dx.chunks_exact_mut(d));
        for (((dy, x), dx), (&m, &r)) in rows.zip(self.mean.iter().zip(self.rstd)) {
            let inputs = x.iter().zip(dy).zip(self.gamma);
            for ((xhat, g), ((&x, &dy), &gamma)) in xhat.iter_mut().zip(g.iter_mut()).zip(inputs) {
                *xhat = (x - m) * r;
                *g = dy * gamma;
            }
            let mean_g = sum(&g) / n;
            let mean_gx = dot(&g, &xhat) / n;
            for ((dx, &g), &xhat) in dx.iter_mut().zip(&g).zip(&xhat) {
                *dx = r * (g - mean_g - xhat * mean_gx);
            }
            let params = self.dgamma.iter_mut().zip(self.dbeta.iter_mut());
            for (((dgamma, dbeta), &dy), &xhat) in params.zip(dy).zip(&xhat) {
                *dgamma += dy * xhat;
                *dbeta += dy;
            }
        }
    }
}
