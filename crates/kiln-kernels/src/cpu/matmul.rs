//! Strided f32 matrix products on the CPU through `gemm` (the crate Burn's CPU backends
//! multiply with), behind views whose bounds are checked before the unsafe call.
//!
//! A view reads a matrix where it lies: one head's columns of `[len, d_model]` rows are a view
//! with row stride `d_model`, and a transpose is the same view with its strides swapped, so
//! attention multiplies heads and transposes without gathering them into copies.
//!
//! [`product`] is the linear layers' matmul: its result is written once, into memory nobody
//! touched before. Burn's Flex matmul zero-fills its output as bytes, then copies it into an
//! allocation aligned for any element (`FlexTensor::empty`): three passes over every output
//! where the product needs one, a tenth of the LoRA step on one thread.

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use gemm::Parallelism;

/// Products of at least this many multiply-adds split over the caller's Rayon pool, as Burn's
/// own CPU matmul does; smaller ones stay on the calling thread.
const PARALLEL_WORK: usize = 192 * 192 * 192;

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

    /// A 2-D f32 tensor where it lies: a transpose or a slice is a view, not a copy. `None`
    /// for another dtype or rank, or a negative stride.
    pub(super) fn of(t: &'a FlexTensor) -> Option<Self> {
        let layout = t.layout();
        if t.dtype() != DType::F32 || layout.num_dims() != 2 {
            return None;
        }
        let [rows, cols] = layout.shape().dims::<2>();
        let [rs, cs] = [layout.strides()[0], layout.strides()[1]].map(usize::try_from);
        let (rs, cs) = (rs.ok()?, cs.ok()?);
        let data = &t.storage::<f32>()[layout.start_offset()..];
        if rows > 0 && cols > 0 {
            let last = (rows - 1) * rs + (cols - 1) * cs;
            assert!(
                last < data.len(),
                "a tensor's layout reaches past its buffer"
            );
        }
        Some(Self {
            data,
            rows,
            cols,
            rs,
            cs,
        })
    }

    /// Its number of rows.
    pub(super) fn row_count(&self) -> usize {
        self.rows
    }

    /// Its number of columns.
    pub(super) fn col_count(&self) -> usize {
        self.cols
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
    let (m, n) = (lhs.rows, rhs.cols);
    assert!(
        dst.rows == m && dst.cols == n,
        "matmul of {m}×{} by {}×{n} into {}×{}",
        lhs.cols,
        rhs.rows,
        dst.rows,
        dst.cols
    );
    // SAFETY: `dst` is borrowed mutably, so it overlaps neither operand, and its `m × n`
    // elements at row stride `dst.rs` lie inside its slice (`block_start` checked it).
    unsafe {
        gemm_into(
            dst.data.as_mut_ptr(),
            dst.rs,
            lhs,
            rhs,
            scale,
            accumulate,
            Parallelism::None,
        );
    }
}

/// `lhs·rhs` (`m × k` by `k × n`) as a new row-major `m × n` buffer, split over the caller's
/// Rayon pool when it is large.
///
/// # Panics
/// When the shapes do not chain.
pub(super) fn product(lhs: View<'_>, rhs: View<'_>) -> Vec<f32> {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    let len = m * n;
    let parallelism = if m.saturating_mul(k).saturating_mul(n) >= PARALLEL_WORK {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    };
    let mut out = Vec::with_capacity(len);
    // SAFETY: the buffer holds `m × n` elements at row stride `n` and is the caller's alone.
    // Without `accumulate`, gemm writes every element of the destination without reading it
    // (with `k = 0` it stores zeros), so all `len` are initialised when it returns.
    unsafe {
        gemm_into(out.as_mut_ptr(), n, lhs, rhs, 1.0, false, parallelism);
        out.set_len(len);
    }
    out
}

/// `dst = lhs·rhs · scale` (or `+=` when `accumulate`) for a row-major `dst` at row stride
/// `dst_rs`.
///
/// # Safety
/// `dst` must be valid for writes of `m × n` elements at row stride `dst_rs` (and for reads
/// too when `accumulate`), and overlap neither operand.
///
/// # Panics
/// When the shapes do not chain.
unsafe fn gemm_into(
    dst: *mut f32,
    dst_rs: usize,
    lhs: View<'_>,
    rhs: View<'_>,
    scale: f32,
    accumulate: bool,
    parallelism: Parallelism,
) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert!(rhs.rows == k, "matmul of {m}×{k} by {}×{n}", rhs.rows);
    if m == 0 || n == 0 {
        return;
    }
    let stride = |s: usize| isize::try_from(s).expect("a stride fits an isize");
    // SAFETY: every view's last element lies inside its slice (checked when the view was
    // made; a transpose reads the same elements), and the caller vouches for `dst`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            stride(dst_rs),
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
            parallelism,
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
