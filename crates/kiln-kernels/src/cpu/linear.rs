//! The linear layer's epilogue on the CPU: `epilogue(y + b)` in one pass over the product,
//! in place, with the arithmetic in the order of Burn's composite (`(y + b) + r`, then ReLU),
//! so that the result is the composite's to the bit. Rows split over the caller's Rayon pool:
//! on one thread of two, the LoRA step's seven residual epilogues a layer were the largest
//! piece of work the other thread waited for.

use rayon::prelude::*;

use super::TASK_ELEMENTS;
use super::simd::{Kernel, vectorized};
use crate::Epilogue;

/// `y [rows, n] ← epilogue(y + b)`, a residual `[rows, n]`, `b [n]`.
///
/// # Panics
/// When a row of `y` is not `b`'s length or the residual is not `y`'s.
pub(super) fn epilogue(y: &mut [f32], n: usize, b: Option<&[f32]>, epilogue: Epilogue<&[f32]>) {
    if let Some(b) = b {
        assert_eq!(b.len(), n, "a bias of {} for rows of {n}", b.len());
    }
    if let Some(r) = epilogue.residual() {
        assert_eq!(
            r.len(),
            y.len(),
            "a residual of {} for {}",
            r.len(),
            y.len()
        );
    }
    if n == 0 {
        return;
    }
    // Whole rows per task, so that each task's bias lines up with its rows.
    let rows = (TASK_ELEMENTS / n).max(1);
    y.par_chunks_mut(rows * n)
        .enumerate()
        .for_each(|(task, y)| {
            let start = task * rows * n;
            let epilogue = epilogue.clone().map(|r| &r[start..start + y.len()]);
            vectorized(Pass { y, n, b, epilogue });
        });
}

struct Pass<'a> {
    y: &'a mut [f32],
    n: usize,
    b: Option<&'a [f32]>,
    epilogue: Epilogue<&'a [f32]>,
}

impl Kernel for Pass<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        // `epilogue` returned before any task for `n = 0` (rows of no width).
        let Self { y, n, b, epilogue } = self;
        if let Some(b) = b {
            for row in y.chunks_exact_mut(n) {
                for (v, &bias) in row.iter_mut().zip(b) {
                    *v += bias;
                }
            }
        }
        match epilogue {
            Epilogue::None => {}
            Epilogue::Residual(r) => {
                for (v, &r) in y.iter_mut().zip(r) {
                    *v += r;
                }
            }
            Epilogue::Relu => {
                for v in y.iter_mut() {
                    *v = v.max(0.0);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_then_residual_then_relu_in_burns_order() {
        let y0: Vec<f32> = (0..6).map(|i| i as f32 - 2.5).collect();
        let b = [0.25f32, -1.0, 0.5];
        let r: Vec<f32> = (0..6).map(|i| 0.1 * i as f32).collect();

        let mut y = y0.clone();
        epilogue(&mut y, 3, Some(&b), Epilogue::Residual(&r));
        let want: Vec<f32> = (0..6).map(|i| (y0[i] + b[i % 3]) + r[i]).collect();
        assert_eq!(y, want);

        let mut y = y0.clone();
        epilogue(&mut y, 3, Some(&b), Epilogue::Relu);
        let want: Vec<f32> = (0..6).map(|i| (y0[i] + b[i % 3]).max(0.0)).collect();
        assert_eq!(y, want);

        let mut y = y0.clone();
        epilogue(&mut y, 3, None, Epilogue::None);
        assert_eq!(y, y0);
    }

    /// Rows over several tasks with a short last one: each task's residual and bias line up
    /// with its own rows.
    #[test]
    fn rows_split_over_tasks_keep_their_residual_and_bias() {
        let (rows, n) = (130, 300);
        assert!(rows * n > 2 * TASK_ELEMENTS && (rows * n) % ((TASK_ELEMENTS / n) * n) != 0);
        let y0: Vec<f32> = (0..rows * n).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n).map(|j| j as f32 * 0.01).collect();
        let r: Vec<f32> = (0..rows * n).map(|i| (i as f32 * 0.91).cos()).collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("a pool");
        let mut y = y0.clone();
        pool.install(|| epilogue(&mut y, n, Some(&b), Epilogue::Residual(&r)));
        let want: Vec<f32> = (0..rows * n).map(|i| (y0[i] + b[i % n]) + r[i]).collect();
        assert_eq!(y, want);
    }
}
