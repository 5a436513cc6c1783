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

use std::mem::MaybeUninit;

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use gemm::Parallelism;
use rayon::prelude::*;

/// Products of at least this many multiply-adds split over the caller's Rayon pool; smaller
/// ones stay on the calling thread. Burn's own CPU matmul splits from 192³ (7.1 M), which left
/// a LoRA step's rank-16 products (`[256, 768] × [768, 16]`: 3.1 M) on one thread of two while
/// the other waited. gemm 0.19 on two AVX-512 cores, best of 25: 3.1 M in 0.057 → 0.029 ms,
/// 1 M (`[256, 256] × [256, 16]`) 0.018 → 0.010, `[256, 64] × [64, 64]` 0.019 → 0.011; below
/// that gemm keeps small products on one thread itself (`[64, 768] × [768, 16]`: 0.014 both).
const PARALLEL_WORK: usize = 1 << 20;

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

    /// Its rows `rows`, a view into the same elements.
    ///
    /// # Panics
    /// When the range reaches past its rows.
    pub(super) fn row_block(self, rows: std::ops::Range<usize>) -> Self {
        assert!(rows.end <= self.rows, "rows {rows:?} of {}", self.rows);
        Self {
            data: &self.data[(rows.start * self.rs).min(self.data.len())..],
            rows: rows.len(),
            ..self
        }
    }

    /// Its columns `cols`, a view into the same elements.
    ///
    /// # Panics
    /// When the range reaches past its columns.
    pub(super) fn columns(self, cols: std::ops::Range<usize>) -> Self {
        assert!(cols.end <= self.cols, "columns {cols:?} of {}", self.cols);
        Self {
            data: &self.data[(cols.start * self.cs).min(self.data.len())..],
            cols: cols.len(),
            ..self
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
            [dst.rs, 1],
            lhs,
            rhs,
            scale,
            accumulate,
        );
    }
}

/// `lhs·rhs` (`m × k` by `k × n`) as a new row-major `m × n` buffer, split over the caller's
/// Rayon pool when it is large ([`split_gemm`]).
///
/// # Panics
/// When the shapes do not chain.
pub(super) fn product(lhs: View<'_>, rhs: View<'_>) -> Vec<f32> {
    let (m, n) = (lhs.rows, rhs.cols);
    if column_major_is_cheaper(&lhs, &rhs) {
        // Column by column, each column `ld ≥ m` apart ([`column_stride`]), then transposed.
        let ld = column_stride(m);
        let mut columns = Vec::with_capacity(n * ld);
        // SAFETY: the buffer holds `n` columns of `ld ≥ m` elements and is the caller's alone;
        // gemm writes rows `0..m` of every column (as below), which is what the transpose reads.
        unsafe {
            split_gemm(columns.as_mut_ptr(), [1, ld], lhs, rhs);
            return transpose_columns(columns.spare_capacity_mut(), ld, m, n);
        }
    }
    let len = m * n;
    let mut out = Vec::with_capacity(len);
    // SAFETY: the buffer holds `m × n` elements at strides `[n, 1]` and is the caller's
    // alone. Without `accumulate`, gemm writes every element of the destination without
    // reading it (with `k = 0` it stores zeros), and the parts cover every element once, so all
    // `len` are initialised when it returns.
    unsafe {
        split_gemm(out.as_mut_ptr(), [n, 1], lhs, rhs);
        out.set_len(len);
    }
    out
}

/// Parts of a split product start at multiples of this many rows or columns: whole 64-byte
/// lines of a row-major output, and whole micro-tiles of gemm's AVX-512 kernels.
const PART_ALIGN: usize = 64;

/// `dst = lhs·rhs`, cut into one part per thread of the caller's Rayon pool when it has at
/// least [`PARALLEL_WORK`] multiply-adds, each part one single-threaded gemm.
///
/// The cut runs along the output's columns when the right operand is the larger (a weight
/// against a few hundred tokens), else along its rows, so each thread packs its own share of
/// the large operand and all of the small one. gemm's own threading packs the operand its
/// threads share on the calling thread while the others wait, and wakes them for every block:
/// on two cores the LoRA step's calling thread did 1.7× the other's packing, and the other
/// was idle a quarter of the step.
///
/// # Safety
/// As [`gemm_into`]'s, without `accumulate`.
unsafe fn split_gemm(dst: *mut f32, strides: [usize; 2], lhs: View<'_>, rhs: View<'_>) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    let threads = if m.saturating_mul(k).saturating_mul(n) >= PARALLEL_WORK {
        rayon::current_num_threads()
    } else {
        1
    };
    let by_columns = n >= m;
    let extent = if by_columns { n } else { m };
    let part = extent.div_ceil(threads).next_multiple_of(PART_ALIGN);
    if threads <= 1 || part >= extent {
        // SAFETY: the caller's contract.
        unsafe { gemm_into(dst, strides, lhs, rhs, 1.0, false) };
        return;
    }
    let dst = Output(dst);
    (0..extent.div_ceil(part)).into_par_iter().for_each(|i| {
        let range = i * part..((i + 1) * part).min(extent);
        let (lhs, rhs, offset) = if by_columns {
            (lhs, rhs.columns(range.clone()), range.start * strides[1])
        } else {
            (lhs.row_block(range.clone()), rhs, range.start * strides[0])
        };
        // SAFETY: part `i` is the block of `dst` at rows (or columns) `range`, which no other
        // part writes; it lies inside `dst` by the caller's contract.
        unsafe { gemm_into(dst.at(offset), strides, lhs, rhs, 1.0, false) };
    });
}

/// A product's output, shared by the tasks that write its disjoint parts.
#[derive(Clone, Copy)]
struct Output(*mut f32);

// SAFETY: the tasks of one product write disjoint elements through it (see `split_gemm`), and
// the buffer outlives them: `into_par_iter().for_each` returns when every task is done.
unsafe impl Send for Output {}
unsafe impl Sync for Output {}

impl Output {
    /// The element `offset` places past the output's first.
    ///
    /// # Safety
    /// `offset` lies inside the output.
    unsafe fn at(self, offset: usize) -> *mut f32 {
        // SAFETY: the caller's contract.
        unsafe { self.0.add(offset) }
    }
}

/// Whether `lhs·rhs` costs less written column by column and then transposed.
///
/// gemm computes into a column-major destination; for a row-major one it multiplies the
/// transposed problem, so the right operand becomes its left one and is packed in panels of
/// consecutive rows. When that operand is a transposed view (a weight `[in, out]` read as
/// `wᵀ` in every input gradient), the pack gathers its `k × n` elements one by one at a
/// stride of a whole row. A column-major destination packs the row-major left operand instead
/// (`m × k`, gathered alike) and the result pays one tiled transpose (`m × n`), so it wins
/// when `m·(k + n) < k·n`: for few rows, as a fine-tuning batch of a few hundred tokens
/// against a projection or a vocabulary head. Measured on one AVX-512 core with gemm 0.19:
/// `[256, 2048] × [2048, 768]ᵀ` 5.35 → 4.81 ms, the `[256, 32000]` head's gradient 92 →
/// 73 ms, 64 rows 2.10 → 1.12 ms, even at 512 rows and slower from 1,024, as the rule says.
/// Below 16 rows gemm has matrix-vector paths of its own, which stay as they are.
fn column_major_is_cheaper(lhs: &View<'_>, rhs: &View<'_>) -> bool {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    let gathered_rhs = rhs.rs == 1 && rhs.cs != 1 && n > 1;
    let row_major_lhs = lhs.cs == 1 && k > 1;
    gathered_rhs
        && row_major_lhs
        && m >= 16
        && m.saturating_mul(k.saturating_add(n)) < k.saturating_mul(n)
}

/// The distance between the columns of a column-major product of `m` rows: `m` rounded up to
/// whole 64-byte lines, plus one line where that is an even number of lines.
///
/// A transpose reads 8 columns side by side. At a distance of a power of two (512 or 2,048
/// tokens), the lines it reads fall into the same few sets of the L1 cache and evict each
/// other; an odd number of lines between columns spreads them over every set. One core,
/// `[2048, 512]` columns: 1.07 ms tiled at distance 512, 0.55 ms in 8 × 8 blocks at 528.
fn column_stride(m: usize) -> usize {
    const LINE: usize = 16;
    let ld = m.next_multiple_of(LINE);
    if (ld / LINE).is_multiple_of(2) {
        ld + LINE
    } else {
        ld
    }
}

/// The `m × n` product that `split_gemm` wrote column by column into `columns` (`n` columns of
/// `m` rows, `ld` apart) as a new row-major `m × n` buffer.
///
/// # Safety
/// Rows `0..m` of each of the `n` columns of `columns` are initialised.
///
/// # Panics
/// When `columns` holds fewer than `n` columns `ld ≥ m` apart.
unsafe fn transpose_columns(
    columns: &[MaybeUninit<f32>],
    ld: usize,
    m: usize,
    n: usize,
) -> Vec<f32> {
    assert!(
        ld >= m && columns.len() >= n * ld,
        "{n} columns of {m} rows, {ld} apart, in {}",
        columns.len()
    );
    let len = m * n;
    if len == 0 {
        return Vec::new();
    }
    let avx = has_avx();
    let mut out = Vec::with_capacity(len);
    // A task per 8 rows of the result (8 rows of every column), over the caller's Rayon pool.
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(BLOCK * n)
        .enumerate()
        .for_each(|(task, dst)| {
            let i0 = task * BLOCK;
            let rows = dst.len() / n;
            for j0 in (0..n).step_by(BLOCK) {
                let cols = BLOCK.min(n - j0);
                let (src, dst) = (&columns[j0 * ld + i0..], &mut dst[j0..]);
                match avx && rows == BLOCK && cols == BLOCK {
                    // SAFETY: `has_avx` said this CPU has AVX.
                    true => unsafe { block_8x8(src, ld, dst, n) },
                    false => block(src, ld, dst, n, [rows, cols]),
                }
            }
        });
    // SAFETY: the tasks' blocks cover every `(i, j)` of the result once, each copied from an
    // element the caller vouches is initialised.
    unsafe { out.set_len(len) };
    out
}

/// Rows and columns of [`block_8x8`].
const BLOCK: usize = 8;

/// Whether this CPU runs [`block_8x8`] (AVX); asked once per transpose, not per block.
fn has_avx() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `dst[i·ds + j] = src[j·ss + i]` for `i < rows, j < cols`: a block transposed one element
/// at a time (the edges of the product, and CPUs without AVX).
fn block(
    src: &[MaybeUninit<f32>],
    ss: usize,
    dst: &mut [MaybeUninit<f32>],
    ds: usize,
    [rows, cols]: [usize; 2],
) {
    for j in 0..cols {
        for i in 0..rows {
            dst[i * ds + j] = src[j * ss + i];
        }
    }
}

/// [`block`] of 8 × 8 in AVX registers ([`block_8x8_avx`]).
///
/// # Safety
/// The CPU has AVX ([`has_avx`]).
///
/// # Panics
/// When a slice is shorter than the block it holds.
#[inline]
unsafe fn block_8x8(src: &[MaybeUninit<f32>], ss: usize, dst: &mut [MaybeUninit<f32>], ds: usize) {
    assert!(
        src.len() >= 7 * ss + BLOCK && dst.len() >= 7 * ds + BLOCK,
        "an 8 × 8 block past its slices"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller vouches for AVX, and both blocks lie inside their slices (asserted
    // above).
    unsafe {
        block_8x8_avx(src.as_ptr().cast(), ss, dst.as_mut_ptr().cast(), ds)
    };
    #[cfg(not(target_arch = "x86_64"))]
    block(src, ss, dst, ds, [BLOCK, BLOCK]);
}

/// An 8 × 8 [`block`] in AVX registers: eight rows loaded, interleaved in pairs, fours and
/// halves, stored as eight columns.
///
/// # Safety
/// AVX is present; `src` is readable and `dst` writable for 8 rows of 8 at their strides.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn block_8x8_avx(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract covers every load and store below.
    unsafe {
        let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * ss)));
        let t = [
            _mm256_unpacklo_ps(r[0], r[1]),
            _mm256_unpackhi_ps(r[0], r[1]),
            _mm256_unpacklo_ps(r[2], r[3]),
            _mm256_unpackhi_ps(r[2], r[3]),
            _mm256_unpacklo_ps(r[4], r[5]),
            _mm256_unpackhi_ps(r[4], r[5]),
            _mm256_unpacklo_ps(r[6], r[7]),
            _mm256_unpackhi_ps(r[6], r[7]),
        ];
        let u = [
            _mm256_shuffle_ps::<0x44>(t[0], t[2]),
            _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
            _mm256_shuffle_ps::<0x44>(t[1], t[3]),
            _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
            _mm256_shuffle_ps::<0x44>(t[4], t[6]),
            _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
            _mm256_shuffle_ps::<0x44>(t[5], t[7]),
            _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
        ];
        let columns = [
            _mm256_permute2f128_ps::<0x20>(u[0], u[4]),
            _mm256_permute2f128_ps::<0x20>(u[1], u[5]),
            _mm256_permute2f128_ps::<0x20>(u[2], u[6]),
            _mm256_permute2f128_ps::<0x20>(u[3], u[7]),
            _mm256_permute2f128_ps::<0x31>(u[0], u[4]),
            _mm256_permute2f128_ps::<0x31>(u[1], u[5]),
            _mm256_permute2f128_ps::<0x31>(u[2], u[6]),
            _mm256_permute2f128_ps::<0x31>(u[3], u[7]),
        ];
        for (i, column) in columns.into_iter().enumerate() {
            _mm256_storeu_ps(dst.add(i * ds), column);
        }
    }
}

/// `dst = lhs·rhs · scale` (or `+=` when `accumulate`) for a `dst` whose element `(i, j)` lies
/// at `i·dst_rs + j·dst_cs`.
///
/// # Safety
/// `dst` must be valid for writes of `m × n` elements at those strides (and for reads too
/// when `accumulate`), and overlap neither operand.
///
/// # Panics
/// When the shapes do not chain.
unsafe fn gemm_into(
    dst: *mut f32,
    [dst_rs, dst_cs]: [usize; 2],
    lhs: View<'_>,
    rhs: View<'_>,
    scale: f32,
    accumulate: bool,
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
            stride(dst_cs),
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
            // One thread: `split_gemm` splits large products itself.
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

    /// A row-major left operand by a transposed weight, few rows against many: the product
    /// is written column by column and transposed, and still equals the definition.
    #[test]
    fn few_rows_by_a_transposed_weight_go_column_major_and_match() {
        let (m, k, n) = (19, 70, 37);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.91).cos()).collect();
        let (lhs, rhs) = (
            View::rows(&a, k, 0..m, 0..k),
            View::rows(&w, k, 0..n, 0..k).t(),
        );
        assert!(column_major_is_cheaper(&lhs, &rhs));
        let out = product(lhs, rhs);
        for i in 0..m {
            for j in 0..n {
                let expected: f32 = (0..k).map(|kk| a[i * k + kk] * w[j * k + kk]).sum();
                assert!((out[i * n + j] - expected).abs() < 1e-4, "({i}, {j})");
            }
        }
        // Many rows, or a row-major right operand, keep the row-major destination.
        let tall: Vec<f32> = vec![0.0; 4096 * k];
        assert!(!column_major_is_cheaper(
            &View::rows(&tall, k, 0..4096, 0..k),
            &rhs
        ));
        assert!(!column_major_is_cheaper(
            &lhs,
            &View::rows(&w, n, 0..k, 0..n)
        ));
    }

    /// Products large enough to split over a pool of three threads: by the output's columns
    /// into a row-major and a column-major destination, and by its rows, each cut at a size
    /// that leaves a short last part. Every element against the definition, in f64.
    #[test]
    fn split_products_cover_every_element_once() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("a pool");
        let cases = [
            // (m, k, n, right operand transposed): the cut, and the destination's layout.
            (40, 160, 200, false), // columns, row-major
            (40, 160, 200, true),  // columns, column-major (few rows by a transposed weight)
            (200, 160, 40, false), // rows, row-major
        ];
        for (m, k, n, transposed) in cases {
            assert!(m * k * n >= PARALLEL_WORK);
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.91).cos()).collect();
            let lhs = View::rows(&a, k, 0..m, 0..k);
            // `b` read as `k × n`: row-major, or the transpose of an `n × k` weight.
            let rhs = if transposed {
                View::rows(&b, k, 0..n, 0..k).t()
            } else {
                View::rows(&b, n, 0..k, 0..n)
            };
            let b_at = |kk: usize, j: usize| {
                if transposed {
                    b[j * k + kk]
                } else {
                    b[kk * n + j]
                }
            };
            assert_eq!(column_major_is_cheaper(&lhs, &rhs), transposed);
            let out = pool.install(|| product(lhs, rhs));
            for i in 0..m {
                for j in 0..n {
                    let expected: f64 = (0..k)
                        .map(|kk| f64::from(a[i * k + kk]) * f64::from(b_at(kk, j)))
                        .sum();
                    let got = f64::from(out[i * n + j]);
                    assert!(
                        (got - expected).abs() < 1e-3,
                        "{m}×{k}×{n} (transposed {transposed}) at ({i}, {j}): {got} against {expected}"
                    );
                }
            }
        }
    }

    /// Columns `ld` apart (the padding never read) into rows, in whole 8 × 8 blocks and in the
    /// partial blocks at the last rows and columns.
    #[test]
    fn columns_transpose_into_rows_in_whole_and_partial_blocks() {
        for (m, n) in [(16, 16), (21, 35), (64, 9), (512, 24)] {
            let ld = column_stride(m);
            assert!(ld >= m && (ld / 16) % 2 == 1, "{m} rows {ld} apart");
            let columns: Vec<MaybeUninit<f32>> = (0..n * ld)
                .map(|e| {
                    let (j, i) = (e / ld, e % ld);
                    MaybeUninit::new(if i < m {
                        (j * 1000 + i) as f32
                    } else {
                        f32::NAN
                    })
                })
                .collect();
            // SAFETY: every element of `columns` is initialised.
            let rows = unsafe { transpose_columns(&columns, ld, m, n) };
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(
                        rows[i * n + j],
                        (j * 1000 + i) as f32,
                        "{m}×{n} at ({i}, {j})"
                    );
                }
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
