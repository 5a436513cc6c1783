//! RMSNorm over the rows of a `[rows, d]` matrix, forward and the input's gradient, in one pass
//! over each row (the composite makes a tensor per step: the square, its mean, the root, the
//! reciprocal, two products, and as many again backward).

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::buffer::written;
use super::simd::{Kernel, dot, vectorized};

/// Rows per task: a rank's threads share the rows of a step.
const ROWS: usize = 64;

/// `(y, rstd)`: `y = x·rstd·γ`, `rstd = 1/√(mean(x²) + ε)` per row.
pub(crate) fn forward(x: &[f32], gamma: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>) {
    let d = gamma.len();
    assert!(
        d > 0 && x.len().is_multiple_of(d),
        "RMSNorm of {} values in rows of {d}",
        x.len()
    );
    let mut rstd = vec![0.0; x.len() / d];
    // SAFETY: the tasks' rows cover the buffer, and each writes every element of its rows.
    let y = unsafe {
        written(x.len(), |y| {
            y.par_chunks_mut(ROWS * d)
                .zip(rstd.par_chunks_mut(ROWS))
                .zip(x.par_chunks(ROWS * d))
                .for_each(|((y, rstd), x)| {
                    vectorized(Forward {
                        x,
                        gamma,
                        eps,
                        y,
                        rstd,
                    })
                })
        })
    };
    (y, rstd)
}

struct Forward<'a> {
    x: &'a [f32],
    gamma: &'a [f32],
    eps: f32,
    y: &'a mut [MaybeUninit<f32>],
    rstd: &'a mut [f32],
}

impl Kernel for Forward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let d = self.gamma.len();
        let rows = self.x.chunks_exact(d).zip(self.y.chunks_exact_mut(d));
        for ((x, y), rstd) in rows.zip(self.rstd.iter_mut()) {
            let r = 1.0 / (dot(x, x) / d as f32 + self.eps).sqrt();
            for ((y, &x), &g) in y.iter_mut().zip(x).zip(self.gamma) {
                y.write(x * r * g);
            }
            *rstd = r;
        }
    }
}

/// `dx = rstd·(g − x̂·mean(g·x̂))` with `x̂ = x·rstd` and `g = dy·γ` (a frozen gain's backward;
/// `dγ` is the reference's).
pub(crate) fn input_grad(dy: &[f32], x: &[f32], gamma: &[f32], rstd: &[f32]) -> Vec<f32> {
    let d = gamma.len();
    assert!(
        d > 0 && x.len().is_multiple_of(d) && dy.len() == x.len() && rstd.len() == x.len() / d,
        "RMSNorm's backward of {} values, {} gradients and {} rows in rows of {d}",
        x.len(),
        dy.len(),
        rstd.len()
    );
    // SAFETY: the tasks' rows cover the buffer, and each writes every element of its rows.
    unsafe {
        written(x.len(), |dx| {
            dx.par_chunks_mut(ROWS * d)
                .zip(dy.par_chunks(ROWS * d).zip(x.par_chunks(ROWS * d)))
                .zip(rstd.par_chunks(ROWS))
                .for_each(|((dx, (dy, x)), rstd)| {
                    vectorized(InputGrad {
                        dy,
                        x,
                        gamma,
                        rstd,
                        dx,
                    })
                })
        })
    }
}

struct InputGrad<'a> {
    dy: &'a [f32],
    x: &'a [f32],
    gamma: &'a [f32],
    rstd: &'a [f32],
    dx: &'a mut [MaybeUninit<f32>],
}

impl Kernel for InputGrad<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let d = self.gamma.len();
        let rows = self.dy.chunks_exact(d).zip(self.x.chunks_exact(d));
        for (((dy, x), dx), &r) in rows.zip(self.dx.chunks_exact_mut(d)).zip(self.rstd) {
            // mean(g·x̂) = rstd·Σ dy·γ·x / d, one pass; then dx per element.
            let mut proj = 0.0f32;
            for ((&dy, &x), &g) in dy.iter().zip(x).zip(self.gamma) {
                proj += dy * g * x;
            }
            let proj = proj * r / d as f32;
            for (((dx, &dy), &x), &g) in dx.iter_mut().zip(dy).zip(x).zip(self.gamma) {
                dx.write(r * (dy * g - x * r * proj));
            }
        }
    }
}
