//! A weight's gradient `xᵀ·dy` cut along its reduction on a GPU: `x [rows, m]` and
//! `dy [rows, n]` over a large batch give a small `[m, n]` output (a few of a matmul's tiles)
//! from a long sum over the rows, and Burn's matmul computes each output tile on one cube: a
//! 64 × 64 gradient over 15,360 rows (the AD step at batch 256) ran on one cube of the GPU.
//!
//! Cut into `parts` runs of rows, the product is a batched matmul of `parts` small products
//! side by side (`[parts, m, rows/parts] · [parts, rows/parts, n]`, views of `x` and `dy`, no
//! copy when they are dense), one tile each, whose `[parts, m·n]` partial sums Kiln's column
//! sum adds over the whole GPU in a fixed order: one more launch for `parts` times the cubes.
//! The rule is a function of the shape alone, decided on the host without a search.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, TensorMetadata};

use crate::{KernelBackend, Transpose};

/// Rows and columns of the output one cube of Burn's matmul covers: its tiles are 32 to 128 on
/// a side (unit tiles without tensor cores, `cmma` stages with them), so 64 estimates them.
const TILE: usize = 64;
/// The fewest cubes a product is cut to reach: enough to occupy a GPU's multiprocessors (the
/// column sums' rule too).
const MIN_CUBES: usize = 32;
/// Reductions shorter than this run as they are: cutting them saves less than the extra launch
/// costs (the AD step's 1,920 rows at batch 32 stay one product).
const CUT_FROM: usize = 4096;
/// The shortest run of rows a part gets.
const MIN_PART: usize = 256;

/// How many parts `xᵀ·dy` with `x [rows, m]`, `dy [rows, n]` is cut into along the rows, or
/// `None` to run it as one product: when its output is fewer tiles than [`MIN_CUBES`] and its
/// reduction at least [`CUT_FROM`] long, the most parts up to what fills [`MIN_CUBES`] that
/// divide `rows` into runs of at least [`MIN_PART`].
pub fn parts(rows: usize, m: usize, n: usize) -> Option<usize> {
    let tiles = m.div_ceil(TILE) * n.div_ceil(TILE);
    if tiles == 0 || tiles >= MIN_CUBES || rows < CUT_FROM {
        return None;
    }
    let most = MIN_CUBES.div_ceil(tiles);
    (2..=most)
        .rev()
        .find(|&p| rows.is_multiple_of(p) && rows / p >= MIN_PART)
}

/// `xᵀ·dy` as [`parts`] decides: one product, or a batched product of parts and their column
/// sum. For the GPU backends' [`KernelBackend::weight_grad`].
pub(crate) fn weight_grad<B: KernelBackend>(
    x: FloatTensor<B>,
    dy: FloatTensor<B>,
) -> FloatTensor<B> {
    let [rows, m] = x.shape().dims::<2>();
    let n = dy.shape().dims::<2>()[1];
    let Some(parts) = parts(rows, m, n) else {
        return B::matmul(x, dy, Transpose::Lhs);
    };
    let run = rows / parts;
    let x = B::float_swap_dims(B::float_reshape(x, Shape::new([parts, run, m])), 1, 2);
    let dy = B::float_reshape(dy, Shape::new([parts, run, n]));
    let partials = B::float_reshape(B::float_matmul(x, dy), Shape::new([parts, m * n]));
    B::float_reshape(B::column_sum(partials), Shape::new([m, n]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_reductions_into_few_tiles_are_cut_to_fill_the_gpu() {
        // The AD step's 64 × 64 weights at batch 256 (15,360 rows): 32 parts of 480.
        assert_eq!(parts(15_360, 64, 64), Some(32));
        // Its 64 × 256 feed-forward: 4 tiles, 8 parts.
        assert_eq!(parts(15_360, 64, 256), Some(8));
        // At batch 32 (1,920 rows) the product stays whole, as does a wide output.
        assert_eq!(parts(1920, 64, 64), None);
        assert_eq!(parts(15_360, 512, 512), None);
        // Parts divide the rows and are never shorter than MIN_PART.
        assert_eq!(parts(4099, 64, 64), None);
        let p = parts(5000, 64, 64).unwrap();
        assert!(5000 % p == 0 && 5000 / p >= MIN_PART, "{p}");
    }
}
