//! The QLoRA matmul with few rows (decoding, a handful of sequences): `out = lhs · deq(W)`
//! (forward, plus the adapter's `s·t·B`) and `out = lhs · deq(W)ᵀ` (the input gradient) as
//! matrix-vector products that read each 4-bit word of `W` once, for all rows at a time.
//!
//! With `m ≤` [`ROWS`] rows a product is bound by reading the weight, not by arithmetic: a
//! tiled kernel pads its 16- or 64-row tiles and stages every word through shared memory,
//! which the H200 measured at 7–11× behind cuBLAS's dense f16 product. Here:
//! - **Forward** (`out[r, c] = Σ_k lhs[r, k]·W[k, c]`): the packed weight is `[n, words]`, so
//!   an output column's codes are one contiguous row. A column belongs to a group of
//!   [`LANES`] units that walk its words side by side (adjacent lanes, adjacent words: one
//!   coalesced read), each keeping an f32 sum per row of `lhs`; the lanes' sums meet in a plane
//!   reduction where the runtime has one of [`LANES`] units, else in shared memory.
//! - **Input gradient** (`out[r, k] = Σ_c lhs[r, c]·W[k, c]`): a unit owns one byte of a word,
//!   two outputs along `k`, and walks the columns; adjacent units hold adjacent bytes, so a
//!   plane reads 32 contiguous bytes per column and needs no reduction between its lanes.
//!
//! Both cut their reduction across cubes (split-K) when the outputs alone make too few cubes
//! for a GPU; the f32 partials are added by [`super::qlora::split_sum`], which also adds the
//! adapter's term.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::features::Plane;
use cubecl::prelude::*;

use super::layout::{dense_input, dense_output};
use super::qlora::{CubeWeight, TARGET_CUBES, lora_args, low_rank, split_sum, stage_codebook};
use crate::quant::format::{BLOCK, CODES_PER_WORD};

/// Up to this many rows of input, the QLoRA matmul runs as this file's matrix-vector kernels.
pub const ROWS: usize = 16;

/// Units that share one output column of the forward kernel: a GPU's plane (warp).
const LANES: usize = 32;
/// Output columns per cube of the forward kernel.
const COLUMNS: usize = 8;
/// Units per cube of both kernels.
const UNITS: usize = LANES * COLUMNS;
/// Codes a unit of the input-gradient kernel decodes per column: one byte of a word.
const CODES_PER_UNIT: usize = 2;
/// Units per packed word in the input-gradient kernel.
const UNITS_PER_WORD: usize = CODES_PER_WORD / CODES_PER_UNIT;

/// `out[r, c] = Σ_k lhs[r, k]·deq(k, c)` over this cube's split of the words, for `rows`
/// rows at once (+ `scale·t·B` when `lora` and not `split`).
#[cube(launch)]
#[allow(clippy::too_many_arguments, unused_assignments)]
fn forward_kernel<F: Float, S: Float>(
    lhs: &Tensor<F>,
    packed: &Tensor<i32>,
    scales: &Tensor<S>,
    codebook: &Tensor<f32>,
    t: &Tensor<F>,
    b: &Tensor<F>,
    out: &mut Tensor<F>,
    partial: &mut Tensor<f32>,
    scale: f32,
    split_words: u32,
    #[comptime] rows: usize,
    #[comptime] lora: bool,
    #[comptime] split: bool,
    #[comptime] plane: bool,
    #[define(F, S)] _dtypes: [StorageType; 2],
) {
    let k = lhs.shape(1);
    let cols = out.shape(1);
    let words = packed.shape(1);
    let nblocks = scales.shape(1);
    let lane = UNIT_POS_X as usize;
    let col = CUBE_POS_X as usize * COLUMNS + UNIT_POS_Y as usize;

    let book = stage_codebook(codebook);
    sync_cube();

    let mut acc = Array::<f32>::new(rows);
    #[unroll]
    for r in 0..rows {
        acc[r] = 0.0;
    }
    let first = CUBE_POS_Y as usize * split_words as usize;
    let end = usize::min(first + split_words as usize, words);
    if col < cols {
        let mut word = first + lane;
        while word < end {
            let bits = u32::cast_from(packed[col * words + word]);
            let s = f32::cast_from(scales[col * nblocks + word * CODES_PER_WORD / BLOCK]);
            let k0 = word * CODES_PER_WORD;
            #[unroll]
            for j in 0..CODES_PER_WORD {
                let kk = k0 + j;
                if kk < k {
                    let w = book[((bits >> (4 * j) as u32) & 15u32) as usize] * s;
                    #[unroll]
                    for r in 0..rows {
                        acc[r] += f32::cast_from(lhs[r * k + kk]) * w;
                    }
                }
            }
            word += LANES;
        }
    }

    // The column's total of row `r` ends in lane `r`, which writes it. Every unit reaches the
    // reduction: no unit has returned early.
    let mut total = 0.0f32;
    if comptime!(plane) {
        #[unroll]
        for r in 0..rows {
            let sum = plane_sum(acc[r]);
            if lane == r {
                total = sum;
            }
        }
    } else {
        let mut shared = SharedMemory::<f32>::new(rows * UNITS);
        let unit = UNIT_POS as usize;
        #[unroll]
        for r in 0..rows {
            shared[r * UNITS + unit] = acc[r];
        }
        sync_cube();
        if lane < rows {
            let base = lane * UNITS + UNIT_POS_Y as usize * LANES;
            for l in 0..LANES {
                total += shared[base + l];
            }
        }
    }

    if lane < rows && col < cols {
        if comptime!(split) {
            partial[CUBE_POS_Y as usize * rows * cols + lane * cols + col] = total;
        } else {
            if comptime!(lora) {
                total += scale * low_rank(t, b, lane, col, t.shape(1), cols);
            }
            out[lane * cols + col] = F::cast_from(total);
        }
    }
}

/// `out[r, k] = Σ_c lhs[r, c]·deq(k, c)` over this cube's split of the columns `c`, for
/// `rows` rows at once; each unit owns the two outputs `k` of one byte of a word.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn input_grad_kernel<F: Float, S: Float>(
    lhs: &Tensor<F>,
    packed: &Tensor<i32>,
    scales: &Tensor<S>,
    codebook: &Tensor<f32>,
    out: &mut Tensor<F>,
    partial: &mut Tensor<f32>,
    split_cols: u32,
    #[comptime] rows: usize,
    #[comptime] split: bool,
    #[define(F, S)] _dtypes: [StorageType; 2],
) {
    let n = lhs.shape(1);
    let k = out.shape(1);
    let words = packed.shape(1);
    let nblocks = scales.shape(1);
    let byte = CUBE_POS_X as usize * UNITS + UNIT_POS as usize;
    let word = byte / UNITS_PER_WORD;
    let shift = u32::cast_from(byte % UNITS_PER_WORD * CODES_PER_UNIT * 4);
    let block = word * CODES_PER_WORD / BLOCK;

    let book = stage_codebook(codebook);
    sync_cube();

    let mut acc = Array::<f32>::new(rows * CODES_PER_UNIT);
    #[unroll]
    for i in 0..rows * CODES_PER_UNIT {
        acc[i] = 0.0;
    }
    let first = CUBE_POS_Y as usize * split_cols as usize;
    let end = usize::min(first + split_cols as usize, n);
    if word < words {
        for c in first..end {
            let bits = u32::cast_from(packed[c * words + word]) >> shift;
            let s = f32::cast_from(scales[c * nblocks + block]);
            let w0 = book[(bits & 15u32) as usize] * s;
            let w1 = book[((bits >> 4u32) & 15u32) as usize] * s;
            #[unroll]
            for r in 0..rows {
                // One address for every unit of the cube: a broadcast read.
                let g = f32::cast_from(lhs[r * n + c]);
                acc[r * CODES_PER_UNIT] += g * w0;
                acc[r * CODES_PER_UNIT + 1] += g * w1;
            }
        }
    }

    let k0 = byte * CODES_PER_UNIT;
    let split_base = CUBE_POS_Y as usize * rows * k;
    #[unroll]
    for r in 0..rows {
        #[unroll]
        for e in 0..CODES_PER_UNIT {
            let kk = k0 + e;
            if kk < k {
                let v = acc[r * CODES_PER_UNIT + e];
                if comptime!(split) {
                    partial[split_base + r * k + kk] = v;
                } else {
                    out[r * k + kk] = F::cast_from(v);
                }
            }
        }
    }
}

/// Whether the forward kernel can add its lanes with a plane reduction: the runtime has plane
/// operations and its planes are exactly [`LANES`] units wide, so each column's group is one
/// plane (CUDA's warps; lavapipe has none and takes the shared-memory path).
fn plane_of_lanes<R: CubeRuntime>(client: &ComputeClient<R>) -> bool {
    let props = client.properties();
    let hw = &props.hardware;
    props.features.plane.contains(Plane::Ops)
        && hw.plane_size_min as usize == LANES
        && hw.plane_size_max as usize == LANES
}

/// How many parts to cut a reduction of `len` into so that `cubes` cubes become about
/// [`TARGET_CUBES`], each part at least `min_len` long: the length of a part.
fn split_len(cubes: usize, len: usize, min_len: usize) -> usize {
    let parts = TARGET_CUBES
        .div_ceil(cubes.max(1))
        .clamp(1, (len / min_len).max(1));
    len.div_ceil(parts).max(1)
}

/// `lhs · deq(W)` (+ `s·t·B` given `lora = (t, b, s)`), or `lhs · deq(W)ᵀ` when `transposed`,
/// for `lhs` of at most [`ROWS`] rows.
pub(crate) fn qlora_vec<R: CubeRuntime>(
    lhs: CubeTensor<R>,
    weight: CubeWeight<R>,
    lora: Option<(CubeTensor<R>, CubeTensor<R>, f32)>,
    transposed: bool,
) -> CubeTensor<R> {
    let lhs = dense_input(lhs);
    let packed = dense_input(weight.packed);
    let scales = dense_input(weight.scales);
    let codebook = dense_input(weight.codebook);
    let rows = lhs.meta.shape()[0];
    debug_assert!(rows <= ROWS, "{rows} rows for the vector kernels");
    let words = packed.meta.shape()[1];
    let cols = if transposed { weight.k } else { weight.n };
    let client = lhs.client.clone();
    let dtype = lhs.dtype;
    let scale_dtype = scales.dtype;
    let out = dense_output(&lhs, Shape::new([rows, cols]), dtype);
    if cols == 0 || rows == 0 {
        return out;
    }
    let dim = CubeDim::new_2d(LANES as u32, COLUMNS as u32);

    // The reduction's parts: words of a column (forward), each lane walking at least four; or
    // columns (input gradient), where a cube reads 256 bytes of weight per column and writes
    // 4 bytes per row for each of its 512 outputs, so a part of at least `16·rows` columns
    // writes partials of at most half the weight's bytes it reads.
    let (cubes_x, part, parts) = if transposed {
        let cubes = (words * UNITS_PER_WORD).div_ceil(UNITS);
        let part = split_len(cubes, weight.n, (16 * rows).max(64));
        (cubes, part, weight.n.div_ceil(part))
    } else {
        let cubes = cols.div_ceil(COLUMNS);
        let part = split_len(cubes, words, 4 * LANES);
        (cubes, part, words.div_ceil(part))
    };
    let split = parts > 1;
    let partial = dense_output(
        &lhs,
        Shape::new([if split { parts * rows * cols } else { 1 }]),
        DType::F32,
    );
    let count = CubeCount::Static(cubes_x as u32, parts as u32, 1);
    if transposed {
        input_grad_kernel::launch::<R>(
            &client,
            count,
            dim,
            lhs.into_tensor_arg(),
            packed.into_tensor_arg(),
            scales.into_tensor_arg(),
            codebook.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            part as u32,
            rows,
            split,
            [dtype.into(), scale_dtype.into()],
        );
        return if split {
            split_sum(partial, None, out, parts)
        } else {
            out
        };
    }
    let (t, b, scale, with_lora) = lora_args(lora, &lhs);
    forward_kernel::launch::<R>(
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
        part as u32,
        rows,
        with_lora,
        split,
        plane_of_lanes(&client),
        [dtype.into(), scale_dtype.into()],
    );
    if split {
        split_sum(partial, with_lora.then_some((t, b, scale)), out, parts)
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_reaches_the_target_cubes_within_its_shortest_part() {
        // Decoding a 4096-wide product's input gradient: 8 cubes of outputs, 32 parts of 128.
        assert_eq!(split_len(8, 4096, 64), 128);
        // A short reduction is not cut below its shortest part.
        assert_eq!(split_len(8, 100, 64), 100);
        // Enough cubes already: one part.
        assert_eq!(split_len(512, 4096, 64), 4096);
    }
}
