//! The QLoRA matmul kernel against the plain-Burn reference, forward and backward, on wgpu
//! (lavapipe in CI), for both code books, f32 and f16, and shapes that fit no tile exactly.
//!
//! Tolerances. The kernel and the reference decode the same codes and scales to the same f32
//! values, so they differ only in summation order and in rounding the result:
//! - f32: a sum of `k ≤ 203` products in f32 has a relative error of at most `k·2⁻²⁴ ≈ 1.2e-5`
//!   of `Σ|xᵢwᵢ|`, itself a few times the result's scale here: 1e-4 of the result's scale.
//! - f16: the inputs are f16 values (the reference gets the same values in f32), the kernel
//!   accumulates in f32 and rounds once to f16 (2⁻¹¹ ≈ 4.9e-4 relative); the backward adds one
//!   more f16 rounding of an intermediate (`dy`, `t`): 4e-3 of the result's scale.
//! - The adapter's gradients (`dt = s·dy·Bᵀ`, `dB = s·tᵀ·dy`, hence dx and dA) go through
//!   Burn's own matmul, which is TF32 on CUDA tensor cores: in f32 they get the runtime's
//!   `MATMUL_F32_TOL` as well. `t = x·A` is computed here without a matmul, so that `y` tests
//!   the kernel alone at its own tolerance.

mod common;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, f16};
use common::*;
use kiln_kernels::cube::{QLORA_DENSE_ROWS, QLORA_VECTOR_ROWS};
use kiln_kernels::quant::{HostQuantized, QuantizedWeight};
use kiln_kernels::{KernelBackend, QuantFormat, ScaleDtype, ops, reference};

struct Case {
    m: usize,
    k: usize,
    n: usize,
    r: usize,
    format: QuantFormat,
    scale_dtype: ScaleDtype,
}

struct Data {
    x: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    probe: Vec<f32>,
    q: HostQuantized,
}

const LORA_SCALE: f32 = 2.0;

fn data(c: &Case, half: bool) -> Data {
    let w = values(c.k * c.n, 0.1, 1, false);
    Data {
        x: values(c.m * c.k, 1.0, 2, half),
        a: values(c.k * c.r, 0.2, 3, half),
        b: values(c.r * c.n, 0.2, 4, half),
        probe: values(c.m * c.n, 1.0, 5, half),
        q: HostQuantized::quantize(&w, c.k, c.n, c.format, c.scale_dtype),
    }
}

/// Output and the gradients of `Σ y·probe` w.r.t. x, A and B, through the fused op
/// (`fused`) or through the reference composite under Burn's own autodiff.
fn run<B: AutodiffBackend + KernelBackend>(
    c: &Case,
    d: &Data,
    fused: bool,
    device: &B::Device,
) -> [Vec<f32>; 4] {
    let weight = QuantizedWeight::<B>::from_host(&d.q, c.scale_dtype, device);
    let x = tensor::<B, 2>(&d.x, [c.m, c.k], device).require_grad();
    let a = tensor::<B, 2>(&d.a, [c.k, c.r], device).require_grad();
    let b = tensor::<B, 2>(&d.b, [c.r, c.n], device).require_grad();
    // `x·A` as an exact f32 sum (no matmul, whose precision is the runtime's: TF32 on CUDA).
    let t = (x.clone().unsqueeze_dim::<3>(2) * a.clone().unsqueeze_dim::<3>(0))
        .sum_dim(1)
        .squeeze_dim::<2>(1);
    let y = if fused {
        ops::qlora_matmul(x.clone(), &weight, t, b.clone(), LORA_SCALE).unwrap()
    } else {
        reference::qlora::forward(x.clone(), &weight.primitive(), t, b.clone(), LORA_SCALE)
    };
    let probe = tensor::<B, 2>(&d.probe, [c.m, c.n], device);
    let grads = (y.clone() * probe).sum().backward();
    let g = |t: &Tensor<B, 2>| to_vec(t.grad(&grads).unwrap());
    [to_vec(y), g(&x), g(&a), g(&b)]
}

fn check<G: Backend<Device = GpuDevice> + KernelBackend>(c: Case, half: bool, tol: f32)
where
    burn::backend::Autodiff<G>: AutodiffBackend + KernelBackend<Device = GpuDevice>,
{
    let d = data(&c, half);
    let expected = run::<AdCpu>(&c, &d, false, &Default::default());
    let got = run::<burn::backend::Autodiff<G>>(&c, &d, true, &gpu());
    // The gradients pass through Burn's matmul (the adapter's terms); `y` does too from
    // QLORA_DENSE_ROWS rows on, where the decoded weight is multiplied by Burn's matmul.
    let through_matmul = if half { tol } else { tol.max(MATMUL_F32_TOL) };
    let y_tol = if c.m >= QLORA_DENSE_ROWS {
        through_matmul
    } else {
        tol
    };
    for (i, (name, (g, e))) in ["y", "dx", "dA", "dB"]
        .iter()
        .zip(got.iter().zip(&expected))
        .enumerate()
    {
        assert_close(
            &format!("{name} ({}x{}x{}, {:?})", c.m, c.k, c.n, c.format),
            g,
            e,
            if i == 0 { y_tol } else { through_matmul },
        );
    }
}

fn case(m: usize, k: usize, n: usize, format: QuantFormat) -> Case {
    Case {
        m,
        k,
        n,
        r: 5,
        format,
        scale_dtype: ScaleDtype::F32,
    }
}

#[test]
fn nf4_f32_matches_the_reference() {
    // 37 rows (64-row tiles), k = 203: not a multiple of the word, the step or the block.
    check::<Gpu32>(case(37, 203, 75, QuantFormat::Nf4), false, 1e-4);
    check::<Fused32>(case(37, 203, 75, QuantFormat::Nf4), false, 1e-4);
}

/// 70 rows: past `QLORA_DENSE_ROWS`, the weight decoded to a dense buffer and Burn's matmul.
#[test]
fn int4_f32_matches_the_reference() {
    check::<Gpu32>(case(70, 136, 130, QuantFormat::Int4), false, 1e-4);
    check::<Fused32>(case(70, 136, 130, QuantFormat::Int4), false, 1e-4);
}

/// Up to `QLORA_VECTOR_ROWS` rows: the matrix-vector kernels (one reading of the weight for
/// every row), at 1 row (decoding), a few, and the most they take.
#[test]
fn few_rows_use_the_vector_kernels_and_match() {
    assert_eq!(QLORA_VECTOR_ROWS, 16);
    check::<Gpu32>(case(1, 96, 33, QuantFormat::Nf4), false, 1e-4);
    check::<Gpu32>(case(5, 200, 70, QuantFormat::Int4), false, 1e-4);
    check::<Gpu32>(case(16, 136, 9, QuantFormat::Nf4), false, 1e-4);
    check::<Fused32>(case(5, 200, 70, QuantFormat::Int4), false, 1e-4);
}

#[test]
fn a_long_reduction_with_few_rows_is_split_and_matches() {
    // The vector kernels. Forward: 5 cubes of 8 columns, k = 4100 (513 words, the last one
    // part-filled) → 4 parts of 129 words. Backward (dx reduces over n = 2000): 1 cube of
    // outputs → 31 parts of 65 columns.
    check::<Gpu32>(case(3, 4100, 40, QuantFormat::Nf4), false, 1e-4);
    check::<Gpu32>(case(2, 40, 2000, QuantFormat::Int4), false, 1e-4);
    check::<Gpu16>(case(1, 1100, 70, QuantFormat::Nf4), true, 4e-3);
    // The tiled kernel (17 to 63 rows): 1 column tile, k = 2000 → 7 splits of 288 rows (the
    // last one shorter); backward over n = 2000 likewise.
    check::<Gpu32>(case(20, 2000, 40, QuantFormat::Nf4), false, 1e-4);
    check::<Gpu32>(case(24, 40, 2000, QuantFormat::Int4), false, 1e-4);
}

/// Many cubes side by side: 5 row tiles × 4 column tiles, each cube writing a tile next to
/// others. Lavapipe runs cubes one after another; a GPU runs them at once, so a cube that
/// wrote outside its tile, or read what another one writes, shows here on a GPU.
#[test]
fn many_tiles_side_by_side_match() {
    check::<Gpu32>(case(300, 256, 200, QuantFormat::Nf4), false, 1e-4);
    check::<Gpu16>(case(130, 192, 260, QuantFormat::Int4), true, 4e-3);
}

/// Split-K with many partials over several column tiles: 3 column tiles × 9 splits (the
/// tiled kernel), and 19 cubes of columns × 2 parts (the vector kernel).
#[test]
fn many_splits_over_several_column_tiles_match() {
    check::<Gpu32>(case(40, 2304, 150, QuantFormat::Int4), false, 1e-4);
    check::<Gpu32>(case(4, 2304, 150, QuantFormat::Int4), false, 1e-4);
}

#[test]
fn f16_with_f16_scales_matches_the_reference() {
    let mut c = case(37, 203, 75, QuantFormat::Nf4);
    c.scale_dtype = ScaleDtype::F16;
    check::<Gpu16>(c, true, 4e-3);
    check::<Gpu16>(case(3, 64, 65, QuantFormat::Int4), true, 4e-3);
    check::<Fused16>(case(3, 64, 65, QuantFormat::Int4), true, 4e-3);
}

/// On the CPU (Flex) the op runs through Kiln's backward and its one-pass decode of the
/// weight, which must equal Burn's autodiff of the reference composite (decoded by Burn's
/// tensor ops): both code books, f32 and f16 scales, a `k` that ends inside a word and a block.
#[test]
fn the_cpu_decode_and_backward_match_the_reference() {
    let mut f16_scales = case(5, 200, 33, QuantFormat::Nf4);
    f16_scales.scale_dtype = ScaleDtype::F16;
    for c in [
        case(9, 130, 17, QuantFormat::Nf4),
        case(3, 64, 65, QuantFormat::Int4),
        f16_scales,
    ] {
        let d = data(&c, false);
        let device = Default::default();
        let expected = run::<AdCpu>(&c, &d, false, &device);
        let got = run::<AdCpu>(&c, &d, true, &device);
        for (name, (g, e)) in ["y", "dx", "dA", "dB"]
            .iter()
            .zip(got.iter().zip(&expected))
        {
            assert_close(&format!("{name} (k = {})", c.k), g, e, 1e-5);
        }
    }
}

#[test]
fn the_weight_is_stored_in_at_most_0_57_bytes_per_parameter() {
    let (k, n) = (256, 96);
    let w = values(k * n, 0.1, 9, false);
    for (scale, bound) in [(ScaleDtype::F32, 0.5625), (ScaleDtype::F16, 0.53125)] {
        let q = HostQuantized::quantize(&w, k, n, QuantFormat::Nf4, scale);
        let weight = QuantizedWeight::<Cpu>::from_host(&q, scale, &Default::default());
        let per_param = weight.storage_bytes() as f64 / (k * n) as f64;
        assert!(
            per_param <= 0.57,
            "{scale:?}: {per_param} bytes per parameter"
        );
        assert_eq!(per_param, bound);
        // And on the GPU backend, whose default int type would be wider: still i32 words.
        let weight = QuantizedWeight::<Gpu32>::from_host(&q, scale, &gpu());
        assert_eq!(weight.storage_bytes() as f64 / (k * n) as f64, bound);
    }
}

#[test]
fn bad_shapes_are_clear_errors() {
    let device = Default::default();
    let c = case(4, 64, 8, QuantFormat::Nf4);
    let d = data(&c, false);
    let weight = QuantizedWeight::<Cpu>::from_host(&d.q, ScaleDtype::F32, &device);
    let x = Tensor::<Cpu, 2>::zeros([4, 63], &device);
    let t = Tensor::<Cpu, 2>::zeros([4, 5], &device);
    let b = Tensor::<Cpu, 2>::zeros([5, 8], &device);
    let err = ops::qlora_matmul(x, &weight, t, b, 1.0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "qlora_matmul: the input's last dimension (k) is 63 but must be 64"
    );
    let _ = f16::ONE;
}
