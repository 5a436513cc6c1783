//! Strided f32 matrix products on the CPU through `gemm` (the crate Burn's CPU backends
//! multiply with), behind views whose bounds are checked before the unsafe call.
//!
//! A view reads a matrix where it lies: one head's columns of `[len, d_model]` rows are a view
//! with row stride `d_model`, and a transpose is the same view with its strides swapped, so
//! attention multiplies heads and transposes without gathering them into copies.

use gemm::Parallelism;

/// A read-only `rows × cols` matrix: element `(i, j)` at `data[i·rs + j·cs]`.
#[derive(Clone, Copy, Debug)]
pub(super) struct View<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

/// Where rows `rows` of the columns `cols` of a row-major matrix of width `stride` start in a
/// buffer of `len` elements.
///
/// # Panics
/// When the block's last element lies past the buffer.
fn block_start(
    len: usize,
    stride: usize,
    rows: &std::ops::Range<usize>,
    cols: &std::ops::Range<usize>,
) -> usize {
    let start = rows.start * stride + cols.start;
    if !rows.is_empty() && !cols.is_empty() {
        let last = start + (rows.len() - 1) * stride + cols.len() - 1;
        assert!(last < len, "a matrix view reaches past its buffer");
    }
    start.min(len)
}

impl<'a> View<'a> {
    /// Rows `rows` of the columns `cols` of a row-major matrix of width `stride` in `data`.
    pub(super) fn rows(
        data: &'a [f32],
        stride: usize,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
    ) -> Self {
        let start = block_start(data.len(), stride, &rows, &cols);
        Self {
            data: &data[start..],
            rows: rows.len(),
            cols: cols.len(),
            rs: stride,
            cs: 1,
        }
    }

    /// The transpose: the same elements, strides swapped.
    pub(super) fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
}

/// A writable `rows × cols` matrix, laid out as [`View`]'s.
#[derive(Debug)]
pub(super) struct ViewMut<'a> {
    data: &'a mut [f32],
    rows: usize,
    cols: usize,
    rs: usize,
}

impl<'a> ViewMut<'a> {
    /// Rows `rows` of the columns `cols` of a row-major matrix of width `stride` in `data`.
    pub(super) fn rows(
        data: &'a mut [f32],
        stride: usize,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
    ) -> Self {
        let start = block_start(data.len(), stride, &rows, &cols);
        Self {
            data: &mut data[start..],
            rows: rows.len(),
            cols: cols.len(),
            rs: stride,
        }
    }
}

/// `dst = lhs·rhs · scale`, or `dst += lhs·rhs · scale` when `accumulate`, on this thread.
///
/// # Panics
/// When the shapes do not chain (`lhs` is `m × k`, `rhs` `k × n`, `dst` `m × n`). The views
/// checked their bounds when they were made.
pub(super) fn matmul(dst: ViewMut<'_>, lhs: View<'_>, rhs: View<'_>, scale: f32, accumulate: bool) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert!(
        rhs.rows == k && dst.rows == m && dst.cols == n,
        "matmul of {m}×{k} by {}×{n} into {}×{}",
        rhs.rows,
        dst.rows,
        dst.cols
    );
    if m == 0 || n == 0 {
        return;
    }
    let stride = |s: usize| isize::try_from(s).expect("a stride fits an isize");
    // SAFETY: every view's last element lies inside its slice (`block_start` checked it when
    // the view was made; a transpose reads the same elements), `dst` is borrowed mutably and
    // so overlaps neither operand, and the strides are those the views were checked with.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr(),
            1,
            stride(dst.rs),
            accumulate,
            lhs.data.as_ptr(),
            stride(lhs.cs),
            stride(lhs.rs),
            rhs.data.as_ptr(),
            stride(rhs.cs),
            stride(rhs.rs),
            1.0,
            scale,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Products of views, transposed and strided, against the definition.
    #[test]
    fn strided_and_transposed_products_match_the_definition() {
        // A 3×5 block at columns 2..7 of a 4×9 matrix, and a 5×2 matrix read transposed from a
        // 2×5 one.
        let a: Vec<f32> = (0..36).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..10).map(|i| (i as f32 * 0.91).cos()).collect();
        let lhs = View::rows(&a, 9, 1..4, 2..7);
        let rhs = View::rows(&b, 5, 0..2, 0..5).t();
        let mut out = vec![1.0f32; 3 * 4];
        matmul(ViewMut::rows(&mut out, 4, 0..3, 1..3), lhs, rhs, 2.0, true);
        for i in 0..3 {
            for j in 0..4 {
                let expected = if (1..3).contains(&j) {
                    let jj = j - 1;
                    1.0 + 2.0
                        * (0..5)
                            .map(|k| a[(i + 1) * 9 + 2 + k] * b[jj * 5 + k])
                            .sum::<f32>()
                } else {
                    1.0
                };
                assert!((out[i * 4 + j] - expected).abs() < 1e-5, "({i}, {j})");
            }
        }
    }

    #[test]
    #[should_panic(expected = "past its buffer")]
    fn a_view_past_its_buffer_is_refused() {
        let a = vec![0.0f32; 10];
        let _ = View::rows(&a, 5, 0..3, 0..2);
    }
}
