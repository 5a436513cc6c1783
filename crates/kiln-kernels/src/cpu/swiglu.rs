//! SwiGLU gating, `silu(gate)·up`, and its backward, one pass over the elements with the
//! vectorised `exp`. The composite of Burn's ops makes five full-size temporaries forward
//! (the sigmoid's negation, exponential, sum and reciprocal, and two products) and calls the
//! library's `expf` per element.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::TASK_ELEMENTS;
use super::buffer::written;
use super::simd::{Kernel, exp, vectorized};

/// `σ(a) = 1 / (1 + e^(−a))`.
#[inline(always)]
fn sigmoid(a: f32) -> f32 {
    1.0 / (1.0 + exp(-a))
}

/// `silu(gate)·up`.
pub(crate) fn forward(gate: &[f32], up: &[f32]) -> Vec<f32> {
    assert_eq!(gate.len(), up.len(), "SwiGLU of unequal halves");
    // SAFETY: the chunks cover the buffer, and each element of a chunk is written.
    unsafe {
        written(gate.len(), |y| {
            y.par_chunks_mut(TASK_ELEMENTS)
                .zip(
                    gate.par_chunks(TASK_ELEMENTS)
                        .zip(up.par_chunks(TASK_ELEMENTS)),
                )
                .for_each(|(y, (gate, up))| vectorized(Forward { gate, up, y }))
        })
    }
}

/// `(d gate, d up)` with `silu'(a) = σ(a)·(1 + a·(1 − σ(a)))`.
pub(crate) fn backward(dy: &[f32], gate: &[f32], up: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let n = gate.len();
    assert!(
        dy.len() == n && up.len() == n,
        "SwiGLU's backward of unequal inputs"
    );
    let mut dup = Vec::with_capacity(n);
    // SAFETY: the chunks cover both buffers, and each element of a chunk is written; `dup`'s
    // length is set only after `written` returns, so a panic leaves it empty.
    let dgate = unsafe {
        written(n, |dgate| {
            dgate
                .par_chunks_mut(TASK_ELEMENTS)
                .zip(dup.spare_capacity_mut()[..n].par_chunks_mut(TASK_ELEMENTS))
                .zip(dy.par_chunks(TASK_ELEMENTS))
                .zip(
                    gate.par_chunks(TASK_ELEMENTS)
                        .zip(up.par_chunks(TASK_ELEMENTS)),
                )
                .for_each(|(((dgate, dup), dy), (gate, up))| {
                    vectorized(Backward {
                        dy,
                        gate,
                        up,
                        dgate,
                        dup,
                    })
                })
        })
    };
    // SAFETY: written in full above, chunk for chunk with `dgate`.
    unsafe { dup.set_len(n) };
    (dgate, dup)
}

struct Forward<'a> {
    gate: &'a [f32],
    up: &'a [f32],
    y: &'a mut [MaybeUninit<f32>],
}

impl Kernel for Forward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        for ((y, &a), &u) in self.y.iter_mut().zip(self.gate).zip(self.up) {
            y.write(a * sigmoid(a) * u);
        }
    }
}

struct Backward<'a> {
    dy: &'a [f32],
    gate: &'a [f32],
    up: &'a [f32],
    dgate: &'a mut [MaybeUninit<f32>],
    dup: &'a mut [MaybeUninit<f32>],
}

impl Kernel for Backward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let outputs = self.dgate.iter_mut().zip(self.dup.iter_mut());
        let inputs = self.dy.iter().zip(self.gate).zip(self.up);
        for ((dgate, dup), ((&dy, &a), &u)) in outputs.zip(inputs) {
            let s = sigmoid(a);
            dgate.write(dy * u * (s * (1.0 + a * (1.0 - s))));
            dup.write(dy * (a * s));
        }
    }
}
