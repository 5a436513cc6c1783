//! The QLoRA matmul: `out = lhs · deq(W)` (forward, plus the fused `s·t·B` epilogue) or
//! `out = lhs · deq(W)ᵀ` (the input gradient), by the number of rows `m` of `lhs`:
//! - `m ≤` [`super::qlora_vec::ROWS`] (decoding, a handful of sequences): the matrix-vector
//!   kernels of `qlora_vec.rs`, which read each 4-bit word once for all rows.
//! - up to [`DENSE_ROWS`]: this file's tiled kernel, dequantising each `W` tile into shared
//!   memory. One cube computes a `BM × BN` tile of `out` with `(BM/TM)·(BN/TN)` units, each
//!   holding a `TM × TN` block of f32 accumulators in registers. Per step of `BK` along the
//!   reduction it stages `lhs[BM, BK]` and the dequantised `W[BK, BN]` in shared memory: every
//!   unit decodes one 32-bit word (8 codes), so `deq(W)` exists only tile by tile, in shared
//!   memory, and never in global memory. `BK = 32` divides the 64-row scale block, so a tile
//!   column has one scale. When the output has too few tiles to fill a GPU, the reduction is
//!   split across cubes (split-K): each writes f32 partial sums and [`split_sum`] adds them and
//!   the adapter's term. No plane (warp) operations: only shared memory and `sync_cube`, which
//!   every CubeCL runtime has (lavapipe included).
//! - from [`DENSE_ROWS`] on (training batches): the weight is decoded once per call into a
//!   dense buffer of the input's dtype ([`dequantize`]) and multiplied by Burn's own matmul,
//!   which runs on a GPU's tensor cores: the tiled kernel's scalar tiles were 43× behind cuBLAS
//!   at 4,096 rows on an H100. bitsandbytes trains the same way.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::layout::{dense_input, dense_output};
use crate::quant::format::{BLOCK, CODES_PER_WORD};

/// From this many rows of the input on, the weight is decoded to a dense buffer and multiplied
/// by Burn's matmul (see the [module docs](self)); below, by a kernel that reads the 4-bit
/// weight only.
pub const DENSE_ROWS: usize = 64;

#[cube(launch)]
fn dequantize_kernel<F: Float, S: Float>(
    packed: &Tensor<i32>,
    scales: &Tensor<S>,
    codebook: &Tensor<f32>,
    out: &mut Tensor<F>,
    #[define(F, S)] _dtypes: [StorageType; 2],
) {
    // `out` is `W [k, n]`; `packed` is `[n, words]`, a column's codes along `k`. A unit decodes
    // one word, 8 rows of one column; adjacent units take adjacent columns, so their writes to
    // each row are adjacent.
    let k = out.shape(0);
    let n = out.shape(1);
    let words = packed.shape(1);
    let nblocks = scales.shape(1);
    let unit = ABSOLUTE_POS;
    if unit >= n * words {
        terminate!();
    }
    let col = unit % n;
    let word = unit / n;
    let bits = u32::cast_from(packed[col * words + word]);
    #[unroll]
    for j in 0..CODES_PER_WORD {
        let row = word * CODES_PER_WORD + j;
        if row < k {
            let code = ((bits >> (4 * j) as u32) & 15u32) as usize;
            let v = codebook[code] * f32::cast_from(scales[col * nblocks + row / BLOCK]);
            out[row * n + col] = F::cast_from(v);
        }
    }
}

/// `deq(W)` as a dense `[k, n]` tensor of `dtype`: one launch over the packed words.
pub(crate) fn dequantize<R: CubeRuntime>(weight: CubeWeight<R>, dtype: DType) -> CubeTensor<R> {
    let packed = dense_input(weight.packed);
    let scales = dense_input(weight.scales);
    let codebook = dense_input(weight.codebook);
    let out = dense_output(&packed, Shape::new([weight.k, weight.n]), dtype);
    let units = weight.n * packed.meta.shape()[1];
    if units == 0 {
        return out;
    }
    let client = packed.client.clone();
    let dim = CubeDim::new(&client, units);
    let scale_dtype = scales.dtype;
    dequantize_kernel::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, units, dim),
        dim,
        packed.into_tensor_arg(),
        scales.into_tensor_arg(),
        codebook.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        [dtype.into(), scale_dtype.into()],
    );
    out
}

/// Rows of the reduction staged per step: half a scale block, four words per column.
const BK: usize = 32;
/// Columns of `out` per cube.
const BN: usize = 64;
/// Rows of `out` per cube.
const BM: usize = 64;
/// Rows and columns of `out` per unit: each staged value is reused 4 times.
const TM: usize = 4;
const TN: usize = 4;
/// Units per cube: one packed word of the `BK × BN` tile each.
const UNITS: usize = BK * BN / CODES_PER_WORD;

/// `out[m, c] = Σ_red lhs[m, red] · deq(red, c)` (+ `scale · Σ_q t[m, q] · b[q, c]` when
/// `lora`), where `deq(red, c)` is `W[red, c]`, or `W[c, red]` when `transposed`.
/// `packed` is `[n, words]`, `scales` `[n, blocks]` for `W: [k, n]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments, unused_assignments)]
fn qlora_matmul_kernel<F: Float, S: Float>(
    lhs: &Tensor<F>,
    packed: &Tensor<i32>,
    scales: &Tensor<S>,
    codebook: &Tensor<f32>,
    t: &Tensor<F>,
    b: &Tensor<F>,
    out: &mut Tensor<F>,
    partial: &mut Tensor<f32>,
    scale: f32,
    split_len: u32,
    #[comptime] transposed: bool,
    #[comptime] lora: bool,
    #[comptime] split: bool,
    #[define(F, S)] _dtypes: [StorageType; 2],
) {
    let m_total = out.shape(0);
    let cols = out.shape(1);
    let red_total = lhs.shape(1);
    let words = packed.shape(1);
    let nblocks = scales.shape(1);
    let unit = UNIT_POS as usize;
    let row0 = CUBE_POS_Y as usize * BM;
    let col0 = CUBE_POS_X as usize * BN;
    let units_x = BN / TN;
    let tx = unit % units_x;
    let ty = unit / units_x;

    let book = stage_codebook(codebook);
    let mut lhs_tile = SharedMemory::<f32>::new(BM * BK);
    let mut w_tile = SharedMemory::<f32>::new(BK * BN);
    let mut acc = Array::<f32>::new(TM * TN);
    #[unroll]
    for i in 0..TM * TN {
        acc[i] = 0.0;
    }
    let mut a_reg = Array::<f32>::new(TM);
    let mut b_reg = Array::<f32>::new(TN);
    sync_cube();

    // Split-K: cube z reduces rows [z·split_len, (z+1)·split_len) of the reduction. split_len
    // is a multiple of BK, so no staged tile straddles two splits.
    let red_begin = CUBE_POS_Z as usize * split_len as usize;
    let red_end = usize::min(red_begin + split_len as usize, red_total);
    let mut red0 = red_begin;
    while red0 < red_end {
        // Stage lhs[row0.., red0..] (zero outside the matrix).
        let mut idx = unit;
        while idx < BM * BK {
            let r = row0 + idx / BK;
            let c = red0 + idx % BK;
            let mut v = 0.0f32;
            if r < m_total && c < red_total {
                v = f32::cast_from(lhs[r * red_total + c]);
            }
            lhs_tile[idx] = v;
            idx += UNITS;
        }

        // Decode one word: 8 consecutive rows of `k` of one column `n` of W. Transposed, tile
        // rows are n (the reduction) and tile columns k; otherwise tile rows are k.
        let tile_step = comptime!(if transposed { 1usize } else { BN });
        let mut n = 0usize;
        let mut kword = 0usize;
        let mut tile_pos = 0usize;
        if comptime!(transposed) {
            let r = unit / (BN / CODES_PER_WORD);
            let wc = unit % (BN / CODES_PER_WORD);
            n = red0 + r;
            kword = col0 / CODES_PER_WORD + wc;
            tile_pos = r * BN + wc * CODES_PER_WORD;
        } else {
            let wr = unit / BN;
            let c = unit % BN;
            n = col0 + c;
            kword = red0 / CODES_PER_WORD + wr;
            tile_pos = wr * CODES_PER_WORD * BN + c;
        }
        let k_extent = if comptime!(transposed) {
            cols
        } else {
            red_total
        };
        let n_extent = if comptime!(transposed) {
            red_total
        } else {
            cols
        };
        let mut word = 0u32;
        let valid = n < n_extent && kword < words;
        if valid {
            word = u32::cast_from(packed[n * words + kword]);
        }
        #[unroll]
        for j in 0..CODES_PER_WORD {
            let k = kword * CODES_PER_WORD + j;
            let mut v = 0.0f32;
            if valid && k < k_extent {
                let code = ((word >> (4 * j) as u32) & 15u32) as usize;
                v = book[code] * f32::cast_from(scales[n * nblocks + k / BLOCK]);
            }
            w_tile[tile_pos + j * tile_step] = v;
        }
        sync_cube();

        #[unroll]
        for kk in 0..BK {
            #[unroll]
            for i in 0..TM {
                a_reg[i] = lhs_tile[(ty * TM + i) * BK + kk];
            }
            #[unroll]
            for j in 0..TN {
                b_reg[j] = w_tile[kk * BN + tx * TN + j];
            }
            #[unroll]
            for i in 0..TM {
                #[unroll]
                for j in 0..TN {
                    acc[i * TN + j] += a_reg[i] * b_reg[j];
                }
            }
        }
        sync_cube();
        red0 += BK;
    }

    let rank = t.shape(1);
    let split_base = CUBE_POS_Z as usize * m_total * cols;
    #[unroll]
    for i in 0..TM {
        let r = row0 + ty * TM + i;
        #[unroll]
        for j in 0..TN {
            let c = col0 + tx * TN + j;
            if r < m_total && c < cols {
                let mut v = acc[i * TN + j];
                if comptime!(split) {
                    // The epilogue runs once, in `split_sum_kernel`, after every split.
                    partial[split_base + r * cols + c] = v;
                } else {
                    if comptime!(lora) {
                        v += scale * low_rank(t, b, r, c, rank, cols);
                    }
                    out[r * cols + c] = F::cast_from(v);
                }
            }
        }
    }
}

/// The weight's 16-entry code book, copied into shared memory by the cube's first units. The
/// caller's next `sync_cube` makes it visible to every unit.
#[cube]
pub(super) fn stage_codebook(codebook: &Tensor<f32>) -> SharedMemory<f32> {
    let mut book = SharedMemory::<f32>::new(16usize);
    if UNIT_POS < 16 {
        book[UNIT_POS as usize] = codebook[UNIT_POS as usize];
    }
    book
}

/// The adapter's `(t, b, scale)` as launch arguments, and whether there is one: without, `like`
/// (any tensor of the output's dtype) stands in for `t` and `b`, never read.
pub(super) fn lora_args<R: CubeRuntime>(
    lora: Option<(CubeTensor<R>, CubeTensor<R>, f32)>,
    like: &CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>, f32, bool) {
    match lora {
        Some((t, b, s)) => (dense_input(t), dense_input(b), s, true),
        None => (like.clone(), like.clone(), 0.0, false),
    }
}

/// `Σ_q t[r, q] · b[q, c]`: the adapter's term of one output.
#[cube]
pub(super) fn low_rank<F: Float>(
    t: &Tensor<F>,
    b: &Tensor<F>,
    r: usize,
    c: usize,
    rank: usize,
    cols: usize,
) -> f32 {
    let mut low = 0.0f32;
    for q in 0..rank {
        low += f32::cast_from(t[r * rank + q]) * f32::cast_from(b[q * cols + c]);
    }
    low
}

/// Sums the split-K partials `[splits, m, cols]` into `out` and adds the adapter's term.
#[cube(launch)]
fn split_sum_kernel<F: Float>(
    partial: &Tensor<f32>,
    t: &Tensor<F>,
    b: &Tensor<F>,
    out: &mut Tensor<F>,
    scale: f32,
    splits: u32,
    #[comptime] lora: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS;
    let len = out.len();
    if i >= len {
        terminate!();
    }
    let mut v = 0.0f32;
    for z in 0..splits as usize {
        v += partial[z * len + i];
    }
    if comptime!(lora) {
        let cols = out.shape(1);
        v += scale * low_rank(t, b, i / cols, i % cols, t.shape(1), cols);
    }
    out[i] = F::cast_from(v);
}

/// How many ways to split the reduction: with few rows there are only `cols / 64` tiles,
/// too few cubes to keep a GPU busy over a long reduction, so the reduction is cut until
/// there are about [`TARGET_CUBES`], each split keeping at least [`MIN_SPLIT`] rows.
fn splits(m: usize, cols: usize, red: usize) -> usize {
    let tiles = cols.div_ceil(BN) * m.div_ceil(BM);
    TARGET_CUBES
        .div_ceil(tiles)
        .clamp(1, (red / MIN_SPLIT).max(1))
}

/// Cubes a split-K launch aims for: a few per multiprocessor of a large GPU.
pub(super) const TARGET_CUBES: usize = 256;
/// The shortest reduction a split is given.
const MIN_SPLIT: usize = 256;

/// Adds the f32 partials `[splits, m, cols]` of a split-K launch into `out` (`[m, cols]`), with
/// the adapter's term `s·t·B` given `lora = (t, b, s)`: one element-wise launch.
pub(super) fn split_sum<R: CubeRuntime>(
    partial: CubeTensor<R>,
    lora: Option<(CubeTensor<R>, CubeTensor<R>, f32)>,
    out: CubeTensor<R>,
    splits: usize,
) -> CubeTensor<R> {
    let client = out.client.clone();
    let len = out.meta.shape().num_elements();
    let dim = CubeDim::new(&client, len);
    let (t, b, scale, with_lora) = lora_args(lora, &out);
    let dtype = out.dtype;
    split_sum_kernel::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, len, dim),
        dim,
        partial.into_tensor_arg(),
        t.into_tensor_arg(),
        b.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        scale,
        splits as u32,
        with_lora,
        dtype.into(),
    );
    out
}

/// The weight's tensors, as the CubeCL backends hold them.
#[derive(Clone)]
pub(crate) struct CubeWeight<R: CubeRuntime> {
    pub packed: CubeTensor<R>,
    pub scales: CubeTensor<R>,
    pub codebook: CubeTensor<R>,
    pub k: usize,
    pub n: usize,
}

/// `lhs · deq(W)` (+ `s·t·B` given `lora = (t, b, s)`), or `lhs · deq(W)ᵀ` when `transposed`,
/// by the tiled kernel.
pub(crate) fn qlora_matmul<R: CubeRuntime>(
    lhs: CubeTensor<R>,
    weight: CubeWeight<R>,
    lora: Option<(CubeTensor<R>, CubeTensor<R>, f32)>,
    transposed: bool,
) -> CubeTensor<R> {
    let lhs = dense_input(lhs);
    let packed = dense_input(weight.packed);
    let scales = dense_input(weight.scales);
    let codebook = dense_input(weight.codebook);
    let m = lhs.meta.shape()[0];
    let cols = if transposed { weight.k } else { weight.n };
    let client = lhs.client.clone();
    let dtype = lhs.dtype;
    let out = dense_output(&lhs, Shape::new([m, cols]), dtype);
    let red = lhs.meta.shape()[1];
    let split_len = red.div_ceil(splits(m, cols, red)).div_ceil(BK) * BK;
    let splits = red.div_ceil(split_len.max(BK)).max(1);
    let count = CubeCount::Static(
        cols.div_ceil(BN) as u32,
        m.div_ceil(BM) as u32,
        splits as u32,
    );
    // `[splits, m, cols]` indexed densely by the kernels; unused (one element) without a split.
    let partial = dense_output(
        &lhs,
        Shape::new([if splits > 1 { splits * m * cols } else { 1 }]),
        DType::F32,
    );
    let dim = CubeDim::new_1d(UNITS as u32);
    const { assert!((BM / TM) * (BN / TN) == UNITS) };
    let (t, b, scale, with_lora) = lora_args(lora, &lhs);
    let scale_dtype = scales.dtype;
    qlora_matmul_kernel::launch::<R>(
        &client,
        count,
        dim,
        lhs.into_tensor_arg(),
        packed.into_tensor_arg(),
        scales.into_tensor_arg(),
        codebook.into_tensor_arg(),
        t.clone().into_tensor_arg(),
        b.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        partial.clone().into_tensor_arg(),
        scale,
        split_len.max(BK) as u32,
        transposed,
        with_lora,
        splits > 1,
        [dtype.into(), scale_dtype.into()],
    );
    if splits > 1 {
        split_sum(partial, with_lora.then_some((t, b, scale)), out, splits)
    } else {
        out
    }
}
