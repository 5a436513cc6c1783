//! Rotary position embeddings over contiguous rows: each head's row of `d` values rotated by
//! its position's tables in two passes over its halves, as plain loops the compiler
//! vectorises. Burn's composite broadcasts the `[seq, d]` tables over the heads, a stride
//! pattern Flex runs element by element.

use rayon::prelude::*;

use super::simd::{Kernel, vectorized};

/// `y = x·cos + swap(x)·sin` per row of `x [batch, seq, heads, d]` (rows of `d` contiguous),
/// with `cos`, `sin` `[seq, d]` or `[batch·seq, d]` (a row per token). The products and the sum round as the composite's do: no
/// fused multiply-add, so the result is the reference's bit for bit.
pub(crate) fn forward(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    [seq, heads, d]: [usize; 3],
) -> Vec<f32> {
    let mut y = vec![0.0f32; x.len()];
    let position = heads * d;
    // A table row per position of a sequence, or per token of the batch.
    let rows = cos.len() / d;
    debug_assert!(rows == seq || rows == x.len() / position);
    y.par_chunks_mut(position)
        .zip(x.par_chunks(position))
        .enumerate()
        .for_each(|(row, (y, x))| {
            let p = row % rows;
            let table = p * d..(p + 1) * d;
            vectorized(Rotate {
                x,
                y,
                cos: &cos[table.clone()],
                sin: &sin[table],
            });
        });
    y
}

/// One position's heads.
struct Rotate<'a> {
    x: &'a [f32],
    y: &'a mut [f32],
    cos: &'a [f32],
    sin: &'a [f32],
}

impl Kernel for Rotate<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let d = self.cos.len();
        let half = d / 2;
        let (cos, sin) = (self.cos.split_at(half), self.sin.split_at(half));
        for (x, y) in self.x.chunks_exact(d).zip(self.y.chunks_exact_mut(d)) {
            let (x1, x2) = x.split_at(half);
            let (y1, y2) = y.split_at_mut(half);
            for (((y, &a), &b), (&c, &s)) in
                y1.iter_mut().zip(x1).zip(x2).zip(cos.0.iter().zip(sin.0))
            {
                *y = a * c + b * s;
            }
            for (((y, &a), &b), (&c, &s)) in
                y2.iter_mut().zip(x2).zip(x1).zip(cos.1.iter().zip(sin.1))
            {
                *y = a * c + b * s;
            }
        }
    }
}
