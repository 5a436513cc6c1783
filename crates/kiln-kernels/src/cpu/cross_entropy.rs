//! Softmax cross-entropy per row of `[rows, classes]` logits, forward and backward, in one
//! pass per row (Burn's loss makes a log-softmax tensor, a one-hot mask and a gather). Rows
//! are split over the caller's Rayon pool.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::TASK_ELEMENTS;
use super::buffer::written;
use super::simd::{Kernel, exp, sum_map, vectorized};

/// Rows per task: about [`TASK_ELEMENTS`] logits, and at least one row.
fn rows_per_task(classes: usize) -> usize {
    (TASK_ELEMENTS / classes.max(1)).max(1)
}

/// `(loss, lse)` per row: `lse = log Σ exp(logits)`, `loss = lse − logits[target]`.
/// Targets have been checked to lie in `0..classes`.
pub(crate) fn forward(logits: &[f32], targets: &[usize], classes: usize) -> (Vec<f32>, Vec<f32>) {
    let mut loss = vec![0.0; targets.len()];
    let mut lse = vec![0.0; targets.len()];
    let rows = rows_per_task(classes);
    loss.par_chunks_mut(rows)
        .zip(lse.par_chunks_mut(rows))
        .zip(
            logits
                .par_chunks(rows * classes)
                .zip(targets.par_chunks(rows)),
        )
        .for_each(|((loss, lse), (logits, targets))| {
            vectorized(Forward {
                logits,
                targets,
                classes,
                loss,
                lse,
            })
        });
    (loss, lse)
}

struct Forward<'a> {
    logits: &'a [f32],
    targets: &'a [usize],
    classes: usize,
    loss: &'a mut [f32],
    lse: &'a mut [f32],
}

impl Kernel for Forward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let rows = self.logits.chunks_exact(self.classes).zip(self.targets);
        for ((row, &t), (loss, lse)) in rows.zip(self.loss.iter_mut().zip(self.lse.iter_mut())) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            *lse = max + sum_map(row, |z| exp(z - max)).ln();
            *loss = *lse - row[t];
        }
    }
}

/// `dlogits = (softmax − onehot(target)) · dloss`, the softmax recomputed from `lse`.
pub(crate) fn backward(
    dloss: &[f32],
    logits: &[f32],
    targets: &[usize],
    lse: &[f32],
    classes: usize,
) -> Vec<f32> {
    let n = targets.len();
    assert!(
        logits.len() == n * classes && lse.len() == n && dloss.len() == n,
        "the cross-entropy's backward of {} logits, {} targets, {} sums and {} gradients",
        logits.len(),
        n,
        lse.len(),
        dloss.len()
    );
    let rows = rows_per_task(classes);
    // SAFETY: the tasks' rows cover the buffer, and each writes every element of its rows.
    unsafe {
        written(logits.len(), |dlogits| {
            dlogits
                .par_chunks_mut(rows * classes)
                .zip(logits.par_chunks(rows * classes))
                .zip(
                    targets
                        .par_chunks(rows)
                        .zip(lse.par_chunks(rows).zip(dloss.par_chunks(rows))),
                )
                .for_each(|((dlogits, logits), (targets, (lse, dloss)))| {
                    vectorized(Backward {
                        dloss,
                        logits,
                        targets,
                        lse,
                        classes,
                        dlogits,
                    })
                })
        })
    }
}

struct Backward<'a> {
    dloss: &'a [f32],
    logits: &'a [f32],
    targets: &'a [usize],
    lse: &'a [f32],
    classes: usize,
    dlogits: &'a mut [MaybeUninit<f32>],
}

impl Kernel for Backward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let rows = self.dlogits.chunks_exact_mut(self.classes);
        let rows = rows
            .zip(self.logits.chunks_exact(self.classes))
            .zip(self.targets);
        for (((out, row), &t), (&lse, &g)) in rows.zip(self.lse.iter().zip(self.dloss)) {
            for (o, &z) in out.iter_mut().zip(row) {
                o.write(exp(z - lse) * g);
            }
            // The target's term `p·g − g`, rounded as the one-hot difference was.
            out[t].write(exp(row[t] - lse) * g - g);
        }
    }
}
