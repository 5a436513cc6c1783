//! Column sums over the whole GPU: `out[c] = s·Σ_r a[r, c]` (a bias's gradient; a mean, with
//! `s = 1/rows`), or `Σ_r a[r, c]·b[r, c]·w[r]` (RMSNorm's gain gradient), in a fixed order and
//! without atomics.
//!
//! A cube sums `width` adjacent columns over a chunk of rows: its units stand `width` to a row
//! (adjacent units read adjacent values of one row) and `UNITS / width` rows deep, then add
//! their columns down a tree in shared memory. `width` is chosen so that the columns alone
//! make at least [`MIN_CUBES`] cubes; with fewer columns than that, the rows are cut into
//! [`MIN_CUBES`] chunks whose f32 partial sums a second launch adds. Burn's own `sum_dim`
//! (without autotune) gives each output column one unit: a 64-wide bias over 3,840 rows ran on
//! one cube.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::layout::{dense_input, dense_output, row_input};
use super::reduce::UNITS;

/// The fewest cubes a large column sum launches on: enough to occupy a GPU's multiprocessors.
pub(crate) const MIN_CUBES: usize = 32;
/// Below this many values, a column sum is small enough for one launch however few its cubes.
pub(crate) const SMALL: usize = 10_000;

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn column_partials_kernel<F: Float, O: Float>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    w: &Tensor<F>,
    out: &mut Tensor<O>,
    rows_per_chunk: u32,
    scale: f32,
    #[comptime] width: usize,
    #[comptime] product: bool,
    #[define(F, O)] _dtypes: [StorageType; 2],
) {
    let rows = a.shape(0);
    let cols = a.shape(1);
    let unit = UNIT_POS as usize;
    let lanes = comptime!(UNITS / width);
    let lane = unit / width;
    let col = CUBE_POS_X as usize * width + unit % width;
    let first = CUBE_POS_Y as usize * rows_per_chunk as usize;
    let end = usize::min(first + rows_per_chunk as usize, rows);
    let mut acc = 0.0f32;
    if col < cols {
        let mut r = first + lane;
        while r < end {
            let mut v = f32::cast_from(a[r * a.stride(0) + col * a.stride(1)]);
            if comptime!(product) {
                v *= f32::cast_from(b[r * b.stride(0) + col]) * f32::cast_from(w[r]);
            }
            acc += v;
            r += lanes;
        }
    }
    // Add the lanes of each column down a tree: every unit reaches every barrier.
    let mut shared = SharedMemory::<f32>::new(UNITS);
    shared[unit] = acc;
    sync_cube();
    let levels = comptime!((UNITS / width).trailing_zeros() as usize);
    #[unroll]
    for level in 0..levels {
        let stride = comptime!((UNITS / width) >> (level + 1));
        if lane < stride {
            shared[unit] += shared[unit + stride * width];
        }
        sync_cube();
    }
    if lane == 0 && col < cols {
        out[CUBE_POS_Y as usize * cols + col] = O::cast_from(shared[unit] * scale);
    }
}

/// The launch plan of a `[rows, cols]` column sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Adjacent columns per cube (a power of two dividing `UNITS`).
    pub width: usize,
    /// Chunks the rows are cut into (1: a single launch).
    pub chunks: usize,
}

impl Plan {
    /// Columns alone fill [`MIN_CUBES`] cubes where there are enough of them; a large sum over
    /// fewer columns cuts its rows instead; a small one runs in one launch as it comes.
    pub(crate) fn for_shape(rows: usize, cols: usize) -> Self {
        let fits = |width: usize| cols.div_ceil(width) >= MIN_CUBES;
        // The widest power of two that still leaves MIN_CUBES column blocks (1 at least).
        let mut width = 1;
        while width * 2 <= 32 && fits(width * 2) {
            width *= 2;
        }
        if fits(width) || rows * cols <= SMALL {
            let width = if fits(width) {
                width
            } else {
                cols.next_power_of_two().clamp(1, 32)
            };
            return Self { width, chunks: 1 };
        }
        Self {
            width: cols.next_power_of_two().clamp(1, 32),
            chunks: MIN_CUBES.min(rows),
        }
    }

    /// The cubes of the launch over `cols` columns: column blocks × row chunks.
    pub(crate) fn cubes(&self, cols: usize) -> (usize, usize) {
        (cols.div_ceil(self.width), self.chunks)
    }
}

/// `scale·Σ_r a[r, c]` (or `scale·Σ_r a[r, c]·b[r, c]·w[r]` given `product = (b, w)`) as a
/// `[cols]` tensor of `a`'s dtype, scaled in f32 before the cast. `a` is read with its strides
/// as they are: pitched rows, or a transposed view (a row sum of its original, such as a
/// sequence's loss over its tokens) cost no copy.
pub(crate) fn column_sum<R: CubeRuntime>(
    a: CubeTensor<R>,
    product: Option<(CubeTensor<R>, CubeTensor<R>)>,
    scale: f32,
) -> CubeTensor<R> {
    let [rows, cols] = a.meta.shape().dims::<2>();
    let dtype = a.dtype;
    let out = dense_output(&a, Shape::new([cols]), dtype);
    if cols == 0 {
        return out;
    }
    let plan = Plan::for_shape(rows, cols);
    let (b, w, with_product) = match product {
        Some((b, w)) => (row_input(b), dense_input(w), true),
        // Never read: `product` is false at compile time.
        None => (a.clone(), a.clone(), false),
    };
    let client = a.client.clone();
    let launch = |a: CubeTensor<R>,
                  b: CubeTensor<R>,
                  w: CubeTensor<R>,
                  out: CubeTensor<R>,
                  plan: Plan,
                  rows: usize,
                  scale: f32,
                  product: bool| {
        let (x, y) = plan.cubes(cols);
        let (in_dtype, out_dtype) = (a.dtype, out.dtype);
        column_partials_kernel::launch::<R>(
            &client,
            CubeCount::Static(x as u32, y as u32, 1),
            CubeDim::new_1d(UNITS as u32),
            a.into_tensor_arg(),
            b.into_tensor_arg(),
            w.into_tensor_arg(),
            out.into_tensor_arg(),
            rows.div_ceil(plan.chunks).max(1) as u32,
            scale,
            plan.width,
            product,
            [in_dtype.into(), out_dtype.into()],
        );
    };
    if plan.chunks == 1 {
        launch(a, b, w, out.clone(), plan, rows, scale, with_product);
        return out;
    }
    // Dense, so that the total reads its columns at stride 1.
    let partials = dense_output(&a, Shape::new([plan.chunks, cols]), DType::F32);
    launch(a, b, w, partials.clone(), plan, rows, 1.0, with_product);
    let total = Plan {
        width: plan.width,
        chunks: 1,
    };
    let p = partials.clone();
    launch(
        partials,
        p.clone(),
        p,
        out.clone(),
        total,
        plan.chunks,
        scale,
        false,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_sums_run_on_enough_cubes() {
        for (rows, cols) in [
            (3840, 64),
            (30_720, 5),
            (1920, 256),
            (512, 4096),
            (100, 200),
        ] {
            let plan = Plan::for_shape(rows, cols);
            let (x, y) = plan.cubes(cols);
            assert!(
                rows * cols <= SMALL || x * y >= MIN_CUBES,
                "{rows}x{cols}: {plan:?} gives {} cubes",
                x * y
            );
            assert!(UNITS.is_multiple_of(plan.width));
        }
    }

    #[test]
    fn small_sums_are_one_launch() {
        assert_eq!(Plan::for_shape(100, 5).chunks, 1);
        assert_eq!(Plan::for_shape(30_720, 64).chunks, 1);
        assert_eq!(Plan::for_shape(30_720, 5).chunks, MIN_CUBES);
    }
}
