//! The fused kernels (RMSNorm, SwiGLU, ReLU, rotary embeddings, softmax cross-entropy,
//! LayerNorm, causal attention, AdamW, global norm) against the plain-Burn reference on wgpu
//! (lavapipe in CI), f32 and f16, with sizes that are not multiples of the 256-unit cubes.
//! Gradients are compared with Burn's own autodiff of the reference composite, so the
//! hand-written backward formulas are checked too.
//!
//! Tolerances (relative to the scale of the expected tensor, see `assert_close`):
//! - f32, 1e-5: each value is a short f32 expression or a sum of at most a few hundred
//!   terms in f32 (≤ 300·2⁻²⁴ ≈ 1.8e-5 worst case, far less in practice); the kernels
//!   differ from the reference only in the order of the sums.
//! - f16, 3e-3: inputs are f16 values seen identically by both sides; the kernel computes in
//!   f32 and rounds its output once (2⁻¹¹ ≈ 4.9e-4), and saved intermediates (rstd, lse)
//!   are stored in f16 between forward and backward, adding about one more rounding each.

mod common;

use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use common::*;
use kiln_kernels::{AdamWStep, KernelBackend, ops, reference};

const F32_TOL: f32 = 1e-5;
const F16_TOL: f32 = 3e-3;
/// f32 results of a matrix product on the GPU: CUDA runs Burn's f32 matmul on the tensor cores
/// in TF32 (10 bits of mantissa), which the H200 put at 2.3e-4 of the output's scale for the
/// narrow linear layer (2026-11-30); wgpu's products are plain f32.
const GPU_PRODUCT_F32_TOL: f32 = if cfg!(feature = "cuda") {
    1e-3
} else {
    F32_TOL
};

fn compare(what: &str, got: &[Vec<f32>], expected: &[Vec<f32>], names: &[&str], tol: f32) {
    assert_eq!(got.len(), expected.len(), "{what}: the results compared");
    assert_eq!(got.len(), names.len(), "{what}: the results named");
    for ((g, e), name) in got.iter().zip(expected).zip(names) {
        assert_close(&format!("{what} {name}"), g, e, tol);
    }
}

/// Compares `$run` through the fused op with the composite under Burn's autodiff: on the CPU
/// (Flex: its CPU kernel for cross-entropy, the reference for the others), on wgpu in f32,
/// and on wgpu in f16 (against f16-rounded inputs), each on the plain CubeCL backend and under
/// Burn's fusion.
macro_rules! check_everywhere {
    ($what:literal, $run:ident, $names:expr) => {
        check_everywhere!($what, $run, $names, F32_TOL)
    };
    // `$gpu_f32`: the tolerance of the GPU's f32 results (the CPU's stay at F32_TOL).
    ($what:literal, $run:ident, $names:expr, $gpu_f32:expr) => {{
        let cpu = Default::default();
        let expected = $run::<AdCpu>(false, false, &cpu);
        let names = $names;
        compare(
            concat!($what, " cpu"),
            &$run::<AdCpu>(true, false, &cpu),
            &expected,
            &names,
            F32_TOL,
        );
        compare(
            concat!($what, " f32"),
            &$run::<Autodiff<Gpu32>>(true, false, &gpu()),
            &expected,
            &names,
            $gpu_f32,
        );
        compare(
            concat!($what, " fused f32"),
            &$run::<Autodiff<Fused32>>(true, false, &gpu()),
            &expected,
            &names,
            $gpu_f32,
        );
        let expected = $run::<AdCpu>(false, true, &cpu);
        compare(
            concat!($what, " f16"),
            &$run::<Autodiff<Gpu16>>(true, true, &gpu()),
            &expected,
            &names,
            F16_TOL,
        );
        compare(
            concat!($what, " fused f16"),
            &$run::<Autodiff<Fused16>>(true, true, &gpu()),
            &expected,
            &names,
            F16_TOL,
        );
    }};
}

// ---------------------------------------------------------------- RMSNorm

const ROWS: usize = 13;
const D: usize = 300;

fn rms<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    rms_shaped::<B>(ROWS, D, true, fused, half, device)
}

/// A frozen gain (a fine-tuned model's norms): the backward computes `dx` alone. Many narrow
/// rows: more than one of the CPU kernel's tasks.
fn rms_frozen<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    rms_shaped::<B>(700, 17, false, fused, half, device)
}

/// Many rows of a narrow norm: `dγ`'s sum down the rows is cut into chunks (the column sum's
/// second launch), which 13 rows never are.
fn rms_tall<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    rms_shaped::<B>(700, 17, true, fused, half, device)
}

fn rms_shaped<B: AutodiffBackend + KernelBackend>(
    rows: usize,
    d: usize,
    train_gamma: bool,
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    let x = tensor::<B, 3>(&values(rows * d, 2.0, 1, half), [1, rows, d], device).require_grad();
    let gamma = tensor::<B, 1>(&values(d, 1.5, 2, half), [d], device);
    let gamma = if train_gamma {
        gamma.require_grad()
    } else {
        gamma
    };
    let probe = tensor::<B, 3>(&values(rows * d, 1.0, 3, half), [1, rows, d], device);
    let y = if fused {
        ops::rms_norm(x.clone(), gamma.clone(), 1e-5).unwrap()
    } else {
        let (y, _) =
            reference::rms_norm::forward(x.clone().reshape([rows, d]), gamma.clone(), 1e-5);
        y.reshape([1, rows, d])
    };
    let grads = (y.clone() * probe).sum().backward();
    let mut got = vec![to_vec(y), to_vec(x.grad(&grads).unwrap())];
    got.extend(gamma.grad(&grads).map(to_vec));
    got
}

#[test]
fn rms_norm_matches_the_reference() {
    check_everywhere!("rms_norm", rms, ["y", "dx", "dgamma"]);
    check_everywhere!("rms_norm tall", rms_tall, ["y", "dx", "dgamma"]);
    check_everywhere!("rms_norm frozen gain", rms_frozen, ["y", "dx"]);
}

// ---------------------------------------------------------------- linear

/// What follows the matmul in a linear test.
#[derive(Clone, Copy, PartialEq)]
enum Tail {
    Plain,
    Residual,
    Relu,
}

/// `x·w + b` and its gradients against Burn's matmul and broadcast add: a bias of 5 columns over
/// 2,100 rows (its gradient's sum cut into chunks), and one of 64 (a cube per 2 columns); with
/// a residual added or a ReLU applied in the same pass, against Burn's add and ReLU after it.
#[allow(clippy::too_many_arguments)]
fn linear<B: AutodiffBackend + KernelBackend>(
    rows: usize,
    k: usize,
    n: usize,
    bias: bool,
    tail: Tail,
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    let x = tensor::<B, 3>(&values(rows * k, 1.0, 41, half), [1, rows, k], device).require_grad();
    let w = tensor::<B, 2>(&values(k * n, 0.5, 42, half), [k, n], device).require_grad();
    let b = bias.then(|| tensor::<B, 1>(&values(n, 0.5, 43, half), [n], device).require_grad());
    let r = (tail == Tail::Residual).then(|| {
        tensor::<B, 3>(&values(rows * n, 1.0, 45, half), [1, rows, n], device).require_grad()
    });
    let probe = tensor::<B, 3>(&values(rows * n, 1.0, 44, half), [1, rows, n], device);
    let y = if fused {
        let (x, w, b) = (x.clone(), w.clone(), b.clone());
        match (tail, r.clone()) {
            (Tail::Residual, Some(r)) => ops::linear_residual(x, w, b, r),
            (Tail::Relu, _) => ops::linear_relu(x, w, b),
            _ => ops::linear(x, w, b),
        }
        .unwrap()
    } else {
        let y = reference::linear::forward(x.clone().reshape([rows, k]), w.clone(), b.clone())
            .reshape([1, rows, n]);
        match (tail, r.clone()) {
            (Tail::Residual, Some(r)) => y + r,
            (Tail::Relu, _) => burn::tensor::activation::relu(y),
            _ => y,
        }
    };
    let grads = (y.clone() * probe).sum().backward();
    let mut out = vec![
        to_vec(y),
        to_vec(x.grad(&grads).unwrap()),
        to_vec(w.grad(&grads).unwrap()),
    ];
    out.extend(b.map(|b| to_vec(b.grad(&grads).unwrap())));
    out.extend(r.map(|r| to_vec(r.grad(&grads).unwrap())));
    out
}

fn linear_narrow<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    linear::<B>(2100, 7, 5, true, Tail::Plain, fused, half, device)
}

fn linear_wide<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    linear::<B>(300, 9, 64, true, Tail::Plain, fused, half, device)
}

/// Over enough rows that the GPU backends cut the weight's gradient into parts (`split_k`).
fn linear_tall<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    linear::<B>(8192, 7, 24, true, Tail::Plain, fused, half, device)
}

fn linear_unbiased<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    linear::<B>(30, 9, 11, false, Tail::Plain, fused, half, device)
}

fn linear_residual<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    linear::<B>(300, 9, 37, true, Tail::Residual, fused, half, device)
}

fn linear_residual_unbiased<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    linear::<B>(30, 9, 11, false, Tail::Residual, fused, half, device)
}

fn linear_relu<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    linear::<B>(300, 9, 37, true, Tail::Relu, fused, half, device)
}

#[test]
fn linear_matches_the_reference() {
    check_everywhere!(
        "linear narrow",
        linear_narrow,
        ["y", "dx", "dw", "db"],
        GPU_PRODUCT_F32_TOL
    );
    check_everywhere!(
        "linear wide",
        linear_wide,
        ["y", "dx", "dw", "db"],
        GPU_PRODUCT_F32_TOL
    );
    check_everywhere!(
        "linear tall",
        linear_tall,
        ["y", "dx", "dw", "db"],
        GPU_PRODUCT_F32_TOL
    );
    check_everywhere!(
        "linear unbiased",
        linear_unbiased,
        ["y", "dx", "dw"],
        GPU_PRODUCT_F32_TOL
    );
    check_everywhere!(
        "linear residual",
        linear_residual,
        ["y", "dx", "dw", "db", "dr"],
        GPU_PRODUCT_F32_TOL
    );
    check_everywhere!(
        "linear residual unbiased",
        linear_residual_unbiased,
        ["y", "dx", "dw", "dr"],
        GPU_PRODUCT_F32_TOL
    );
    check_everywhere!(
        "linear relu",
        linear_relu,
        ["y", "dx", "dw", "db"],
        GPU_PRODUCT_F32_TOL
    );
}

// ---------------------------------------------------------------- SwiGLU

const LEN: usize = 1001;

fn swiglu<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    let gate = tensor::<B, 2>(&values(LEN, 6.0, 4, half), [7, 143], device).require_grad();
    let up = tensor::<B, 2>(&values(LEN, 2.0, 5, half), [7, 143], device).require_grad();
    let probe = tensor::<B, 2>(&values(LEN, 1.0, 6, half), [7, 143], device);
    let y = if fused {
        ops::swiglu(gate.clone(), up.clone()).unwrap()
    } else {
        reference::swiglu::forward(gate.clone(), up.clone())
    };
    let grads = (y.clone() * probe).sum().backward();
    vec![
        to_vec(y),
        to_vec(gate.grad(&grads).unwrap()),
        to_vec(up.grad(&grads).unwrap()),
    ]
}

#[test]
fn swiglu_matches_the_reference() {
    check_everywhere!("swiglu", swiglu, ["y", "dgate", "dup"]);
}

// ---------------------------------------------------------------- rotary embeddings

/// Rotary embeddings of `[2, 5, 3, 12]` by tables of `rows` rows in the op's form (`sin` =
/// `[−s, +s]` over the halves, which the op's backward relies on), against the `select`
/// composite under Burn's autodiff.
fn rope_with<B: AutodiffBackend + KernelBackend>(
    rows: usize,
    [fused, half]: [bool; 2],
    device: &B::Device,
) -> Vec<Vec<f32>> {
    let shape = [2, 5, 3, 12];
    let len = shape.iter().product();
    let x = tensor::<B, 4>(&values(len, 2.0, 41, half), shape, device).require_grad();
    let cos = tensor::<B, 2>(&values(rows * 12, 1.0, 42, half), [rows, 12], device);
    let s: Vec<f32> = values(rows * 6, 1.0, 43, half);
    let sin: Vec<f32> = s
        .chunks(6)
        .flat_map(|s| s.iter().map(|v| -v).chain(s.iter().copied()))
        .collect();
    let sin = tensor::<B, 2>(&sin, [rows, 12], device);
    let probe = tensor::<B, 4>(&values(len, 1.0, 44, half), shape, device);
    let y = if fused {
        ops::rope(x.clone(), cos, sin).unwrap()
    } else {
        reference::rope::forward(x.clone(), cos, sin)
    };
    let grads = (y.clone() * probe).sum().backward();
    vec![to_vec(y), to_vec(x.grad(&grads).unwrap())]
}

/// Rotary embeddings by a table row per token (`[2·5, 12]`), as packed sequences use.
fn rope_per_token<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    rope_with::<B>(2 * 5, [fused, half], device)
}

fn rope<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    rope_with::<B>(5, [fused, half], device)
}

#[test]
fn rope_matches_the_reference() {
    check_everywhere!("rope", rope, ["y", "dx"]);
    check_everywhere!("rope per token", rope_per_token, ["y", "dx"]);
}

// ---------------------------------------------------------------- ReLU

fn relu<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    let x = tensor::<B, 2>(&values(LEN, 3.0, 31, half), [7, 143], device).require_grad();
    let probe = tensor::<B, 2>(&values(LEN, 1.0, 32, half), [7, 143], device);
    let y = if fused {
        ops::relu(x.clone())
    } else {
        reference::relu::forward(x.clone())
    };
    let grads = (y.clone() * probe).sum().backward();
    vec![to_vec(y), to_vec(x.grad(&grads).unwrap())]
}

#[test]
fn relu_matches_the_reference() {
    check_everywhere!("relu", relu, ["y", "dx"]);
}

// ---------------------------------------------------------------- cross-entropy

const CE_ROWS: usize = 11;
const CLASSES: usize = 1000;

fn targets() -> Vec<i64> {
    (0..CE_ROWS)
        .map(|r| ((r * 389 + 7) % CLASSES) as i64)
        .collect()
}

fn cross_entropy<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    let logits = tensor::<B, 2>(
        &values(CE_ROWS * CLASSES, 8.0, 7, half),
        [CE_ROWS, CLASSES],
        device,
    )
    .require_grad();
    let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(targets(), [CE_ROWS]), device);
    let weights = tensor::<B, 1>(&values(CE_ROWS, 1.0, 8, half), [CE_ROWS], device);
    let loss = if fused {
        ops::cross_entropy(logits.clone(), targets).unwrap()
    } else {
        reference::cross_entropy::forward(logits.clone(), targets).0
    };
    // The losses are f32 whatever the logits' dtype.
    assert_eq!(loss.dtype(), burn::tensor::DType::F32);
    let weights = weights.cast(burn::tensor::FloatDType::F32);
    let grads = (loss.clone() * weights).sum().backward();
    let dlogits = logits.grad(&grads).unwrap();
    assert_eq!(
        dlogits.dtype(),
        logits.dtype(),
        "the gradient in the logits' dtype"
    );
    vec![to_vec(loss), to_vec(dlogits)]
}

#[test]
fn cross_entropy_matches_the_reference() {
    check_everywhere!("cross_entropy", cross_entropy, ["loss", "dlogits"]);
}

/// The mean of the losses (whose gradient reaches the cross-entropy as one broadcast scalar),
/// a mean over more values than one cube sums alone, and a table added to every row, against
/// Burn's `mean` and broadcast add.
fn mean_and_broadcast_rows<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    const LONG: usize = 12_345;
    const TABLE_ROWS: usize = 40;
    let logits = tensor::<B, 2>(
        &values(CE_ROWS * CLASSES, 8.0, 7, half),
        [CE_ROWS, CLASSES],
        device,
    )
    .require_grad();
    let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(targets(), [CE_ROWS]), device);
    let long = tensor::<B, 1>(&values(LONG, 1.0, 9, half), [LONG], device).require_grad();
    let table = tensor::<B, 1>(&values(D, 1.0, 10, half), [D], device).require_grad();
    let rows = tensor::<B, 2>(
        &values(TABLE_ROWS * D, 1.0, 11, half),
        [TABLE_ROWS, D],
        device,
    );
    let weights = tensor::<B, 2>(
        &values(TABLE_ROWS * D, 1.0, 12, half),
        [TABLE_ROWS, D],
        device,
    );
    let losses = ops::cross_entropy(logits.clone(), targets).unwrap();
    let (loss, mean, sum) = if fused {
        let sum = rows + ops::broadcast_rows(table.clone(), TABLE_ROWS);
        (ops::mean(losses), ops::mean(long.clone()), sum)
    } else {
        let sum = rows + table.clone().reshape([1, D]);
        (losses.mean(), long.clone().mean(), sum)
    };
    let f32 = burn::tensor::FloatDType::F32;
    let total = loss.clone() + mean.clone().cast(f32) + (sum * weights).sum().cast(f32);
    let grads = total.backward();
    vec![
        to_vec(loss),
        to_vec(mean),
        to_vec(logits.grad(&grads).unwrap()),
        to_vec(long.grad(&grads).unwrap()),
        to_vec(table.grad(&grads).unwrap()),
    ]
}

/// Row sums as column sums of a transposed view (a sequence's loss over its tokens), over
/// rows long enough that the GPU cuts them into chunks, against Burn's `sum_dim`.
fn row_sums<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    const SEQS: usize = 3;
    const LEN: usize = 4099;
    let x = tensor::<B, 2>(&values(SEQS * LEN, 1.0, 13, half), [SEQS, LEN], device).require_grad();
    let weights = tensor::<B, 1>(&values(SEQS, 1.0, 14, half), [SEQS], device);
    let sums = if fused {
        ops::column_sum(x.clone().transpose())
    } else {
        x.clone().sum_dim(1).reshape([SEQS])
    };
    let grads = (sums.clone() * weights).sum().backward();
    vec![to_vec(sums), to_vec(x.grad(&grads).unwrap())]
}

#[test]
fn mean_and_broadcast_rows_match_burns() {
    check_everywhere!(
        "mean and broadcast_rows",
        mean_and_broadcast_rows,
        ["loss", "mean", "dlogits", "dlong", "dtable"]
    );
    check_everywhere!("row sums", row_sums, ["sums", "dx"]);
}

#[test]
fn an_out_of_range_target_gives_a_nan_loss_on_the_gpu() {
    let device = gpu();
    let logits = tensor::<Gpu32, 2>(&values(2 * 5, 1.0, 9, false), [2, 5], &device);
    let targets = Tensor::<Gpu32, 1, Int>::from_data(TensorData::new(vec![1i64, 5], [2]), &device);
    let loss = to_vec(ops::cross_entropy(logits, targets).unwrap());
    assert!(loss[0].is_finite() && loss[1].is_nan(), "{loss:?}");
}

// ---------------------------------------------------------------- LayerNorm

/// More rows than one column-sum chunk (64) and a width that is no multiple of its 32 columns.
const LN_ROWS: usize = 150;
const LN_D: usize = 75;

fn layer_norm<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    // A mean away from zero, so that the centring is exercised.
    let x = tensor::<B, 3>(
        &values(LN_ROWS * LN_D, 2.0, 11, half),
        [1, LN_ROWS, LN_D],
        device,
    )
    .add_scalar(0.75)
    .require_grad();
    let gamma = tensor::<B, 1>(&values(LN_D, 1.5, 12, half), [LN_D], device).require_grad();
    let beta = tensor::<B, 1>(&values(LN_D, 0.5, 13, half), [LN_D], device).require_grad();
    let probe = tensor::<B, 3>(
        &values(LN_ROWS * LN_D, 1.0, 14, half),
        [1, LN_ROWS, LN_D],
        device,
    );
    let y = if fused {
        ops::layer_norm(x.clone(), gamma.clone(), beta.clone(), 1e-5).unwrap()
    } else {
        let (y, _, _) = reference::layer_norm::forward(
            x.clone().reshape([LN_ROWS, LN_D]),
            gamma.clone(),
            beta.clone(),
            1e-5,
        );
        y.reshape([1, LN_ROWS, LN_D])
    };
    let grads = (y.clone() * probe).sum().backward();
    vec![
        to_vec(y),
        to_vec(x.grad(&grads).unwrap()),
        to_vec(gamma.grad(&grads).unwrap()),
        to_vec(beta.grad(&grads).unwrap()),
    ]
}

#[test]
fn layer_norm_matches_the_reference() {
    check_everywhere!("layer_norm", layer_norm, ["y", "dx", "dgamma", "dbeta"]);
}

// ---------------------------------------------------------------- causal attention

const BATCH: usize = 2;
const HEADS: usize = 3;
const D_HEAD: usize = 5;
const KV_LEN: usize = 9;

/// Each query's first key in packed rows of `KV_LEN` positions: examples of 1, 5 and 3
/// tokens in the first row, 4 and 5 in the second.
const PACKED_STARTS: [[i64; KV_LEN]; 2] =
    [[0, 1, 1, 1, 1, 1, 6, 6, 6], [0, 0, 0, 0, 4, 4, 4, 4, 4]];

/// Attention of the last `q_len` positions over `KV_LEN` keys, `heads` query heads sharing
/// `kv_heads` key and value heads, through the fused op or the written-out reference; the
/// output and the three input gradients. `packed`: the rows of [`PACKED_STARTS`].
///
/// The reference is given the shared heads repeated by a `select` of this test's own, so the
/// grouped path of every backend (the CubeCL kernels read shared heads in place and sum their
/// gradients in the launch) is checked against autodiff of a plain repetition.
fn attention<B: AutodiffBackend + KernelBackend>(
    q_len: usize,
    [heads, kv_heads]: [usize; 2],
    packed: bool,
    [fused, half]: [bool; 2],
    device: &B::Device,
) -> Vec<Vec<f32>> {
    let (width, kv_width) = (heads * D_HEAD, kv_heads * D_HEAD);
    let starts = packed.then(|| {
        let starts: Vec<i64> = PACKED_STARTS[..BATCH]
            .iter()
            .flat_map(|row| row[KV_LEN - q_len..].iter().copied())
            .collect();
        Tensor::<B, 2, Int>::from_data(TensorData::new(starts, [BATCH, q_len]), device)
    });
    let input = |len: usize, width: usize, seed: u64| {
        tensor::<B, 3>(
            &values(BATCH * len * width, 1.5, seed, half),
            [BATCH, len, width],
            device,
        )
        .require_grad()
    };
    let q = input(q_len, width, 21);
    let (k, v) = (input(KV_LEN, kv_width, 22), input(KV_LEN, kv_width, 23));
    let probe = tensor::<B, 3>(
        &values(BATCH * q_len * width, 1.0, 24, half),
        [BATCH, q_len, width],
        device,
    );
    let out = if fused {
        match starts {
            Some(starts) => {
                ops::packed_causal_attention(q.clone(), k.clone(), v.clone(), heads, starts)
            }
            None => ops::causal_attention(q.clone(), k.clone(), v.clone(), heads),
        }
        .unwrap()
    } else {
        let shared: Vec<i64> = (0..heads)
            .map(|h| (h / (heads / kv_heads)) as i64)
            .collect();
        let shared = Tensor::<B, 1, Int>::from_data(TensorData::new(shared, [heads]), device);
        let repeat = |t: Tensor<B, 3>| {
            t.reshape([BATCH, KV_LEN, kv_heads, D_HEAD])
                .select(2, shared.clone())
                .reshape([BATCH, KV_LEN, width])
        };
        let (k, v) = (repeat(k.clone()), repeat(v.clone()));
        reference::attention::forward(q.clone(), k, v, heads, starts).0
    };
    let grads = (out.clone() * probe).sum().backward();
    vec![
        to_vec(out),
        to_vec(q.grad(&grads).unwrap()),
        to_vec(k.grad(&grads).unwrap()),
        to_vec(v.grad(&grads).unwrap()),
    ]
}

fn self_attention<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    attention::<B>(KV_LEN, [HEADS, HEADS], false, [fused, half], device)
}

fn last_queries_attention<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    attention::<B>(4, [HEADS, HEADS], false, [fused, half], device)
}

/// Grouped-query attention: 6 query heads over 2 key and value heads (LLaMA's and Qwen's
/// layout).
fn grouped_attention<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    attention::<B>(KV_LEN, [6, 2], false, [fused, half], device)
}

/// Multi-query attention (one key and value head), the last queries only (a cached step).
fn multi_query_attention<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    attention::<B>(4, [HEADS, 1], false, [fused, half], device)
}

/// Packed rows of examples that attend only within themselves, grouped heads.
fn packed_attention<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    attention::<B>(KV_LEN, [6, 2], true, [fused, half], device)
}

/// Packed rows, the last queries only (starts are positions among the keys).
fn packed_last_queries<B: AutodiffBackend + KernelBackend>(
    fused: bool,
    half: bool,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    attention::<B>(4, [HEADS, HEADS], true, [fused, half], device)
}

#[test]
fn causal_attention_matches_the_reference() {
    let names = ["out", "dq", "dk", "dv"];
    check_everywhere!("packed attention", packed_attention, names);
    check_everywhere!("packed last queries", packed_last_queries, names);
    check_everywhere!("self attention", self_attention, names);
    check_everywhere!("last queries", last_queries_attention, names);
    check_everywhere!("grouped-query attention", grouped_attention, names);
    check_everywhere!("multi-query attention", multi_query_attention, names);
}

// ---------------------------------------------------------------- AdamW

fn adamw<B: Backend + KernelBackend>(fused: bool, half: bool, device: &B::Device) -> Vec<Vec<f32>> {
    const N: usize = 1003;
    let t = |seed, scale| tensor::<B, 2>(&values(N, scale, seed, half), [17, 59], device);
    let (mut p, mut m, mut v) = (t(10, 1.0), t(11, 0.1), t(12, 0.01).abs());
    // Three steps, so the bias corrections and the carried moments all matter.
    for time in 1..=3 {
        let step = AdamWStep {
            lr: 1e-2,
            beta_1: 0.9,
            beta_2: 0.99,
            epsilon: 1e-5,
            weight_decay: 0.1,
            time,
        };
        let g = t(20 + time as u64, 1.0);
        (p, m, v) = if fused {
            ops::adamw_step(p, g, m, v, &step).unwrap()
        } else {
            reference::adamw::step(p, g, m, v, &step)
        };
    }
    vec![to_vec(p), to_vec(m), to_vec(v)]
}

#[test]
fn adamw_matches_the_reference() {
    let names = ["param", "m", "v"];
    let expected = adamw::<Cpu>(false, false, &Default::default());
    compare(
        "adamw f32",
        &adamw::<Gpu32>(true, false, &gpu()),
        &expected,
        &names,
        F32_TOL,
    );
    compare(
        "adamw fused f32",
        &adamw::<Fused32>(true, false, &gpu()),
        &expected,
        &names,
        F32_TOL,
    );
    let expected = adamw::<Cpu>(false, true, &Default::default());
    compare(
        "adamw f16",
        &adamw::<Gpu16>(true, true, &gpu()),
        &expected,
        &names,
        F16_TOL,
    );
    compare(
        "adamw fused f16",
        &adamw::<Fused16>(true, true, &gpu()),
        &expected,
        &names,
        F16_TOL,
    );
}

/// The reference step is Burn's own AdamW: same parameters after the same steps.
#[test]
fn the_adamw_formula_is_burns() {
    use burn::optim::{AdamWConfig, SimpleOptimizer};
    let device = Default::default();
    let optim = AdamWConfig::new()
        .with_beta_1(0.9)
        .with_beta_2(0.99)
        .with_epsilon(1e-5)
        .with_weight_decay(0.1)
        .build();
    let mut burn_p = tensor::<Cpu, 1>(&values(64, 1.0, 30, false), [64], &device);
    let mut state = None;
    let mut ours = (burn_p.clone(), burn_p.zeros_like(), burn_p.zeros_like());
    for time in 1..=3u32 {
        let g = tensor::<Cpu, 1>(&values(64, 1.0, 40 + time as u64, false), [64], &device);
        (burn_p, state) = optim.step(1e-2, burn_p, g.clone(), state);
        let step = AdamWStep {
            lr: 1e-2,
            beta_1: 0.9,
            beta_2: 0.99,
            epsilon: 1e-5,
            weight_decay: 0.1,
            time,
        };
        ours = reference::adamw::step(ours.0, g, ours.1, ours.2, &step);
    }
    assert_close("adamw vs burn", &to_vec(ours.0), &to_vec(burn_p), 1e-6);
}

// ---------------------------------------------------------------- global norm

fn norm_inputs<B: Backend>(half: bool, poison: bool, device: &B::Device) -> Vec<Tensor<B, 1>> {
    // One value, one tensor smaller than a cube, one needing the grid-stride loop (more than
    // 256 cubes × 256 units).
    let mut big = values(70_001, 0.5, 13, half);
    if poison {
        big[5] = f32::NAN;
        big[69_999] = f32::INFINITY;
        big[12] = f32::NEG_INFINITY;
    }
    vec![
        tensor(&[3.0], [1], device),
        tensor(&values(300, 1.0, 14, half), [300], device),
        tensor(&[], [0], device),
        tensor(&big, [70_001], device),
    ]
}

#[test]
fn the_global_norm_matches_the_reference_and_counts_non_finite_values() {
    for poison in [false, true] {
        let expected = ops::grad_norm(
            norm_inputs::<Cpu>(false, poison, &Default::default()),
            &Default::default(),
        );
        let got = ops::grad_norm(norm_inputs::<Gpu32>(false, poison, &gpu()), &gpu());
        assert_close("sq_norm", &[got.sq_norm], &[expected.sq_norm], F32_TOL);
        assert_eq!(got.non_finite, expected.non_finite);
        let fused = ops::grad_norm(norm_inputs::<Fused32>(false, poison, &gpu()), &gpu());
        assert_eq!(fused, got, "the same kernel under fusion");
        assert_eq!(got.non_finite, if poison { 3 } else { 0 });
        // Independent of both: the sum of squares in f64 on the host.
        let exact: f64 = norm_inputs::<Cpu>(false, poison, &Default::default())
            .into_iter()
            .flat_map(to_vec)
            .filter(|v| v.is_finite())
            .map(|v| (v as f64) * (v as f64))
            .sum();
        assert!(
            ((got.sq_norm as f64) - exact).abs() <= 1e-5 * exact,
            "{} vs {exact}",
            got.sq_norm
        );

        let half = ops::grad_norm(norm_inputs::<Gpu16>(true, poison, &gpu()), &gpu());
        let expected = ops::grad_norm(
            norm_inputs::<Cpu>(true, poison, &Default::default()),
            &Default::default(),
        );
        // f16 inputs, f32 sums on both sides: only the order of the sums differs.
        assert_close("sq_norm f16", &[half.sq_norm], &[expected.sq_norm], F32_TOL);
        assert_eq!(half.non_finite, expected.non_finite);
    }
    assert_eq!(
        ops::grad_norm(Vec::<Tensor<Gpu32, 1>>::new(), &gpu()).sq_norm,
        0.0
    );
}

/// More tensors than one launch binds on wgpu (31 buffers): the norm runs in chunks and still
/// counts every tensor once.
#[test]
fn the_global_norm_over_many_tensors_matches_the_reference() {
    fn inputs<B: Backend>(device: &B::Device) -> Vec<Tensor<B, 1>> {
        (0..45)
            .map(|i| {
                let len = 1 + (i * 37) % 300;
                tensor(&values(len, 1.0, 100 + i as u64, false), [len], device)
            })
            .collect()
    }
    let expected = ops::grad_norm::<Cpu>(inputs(&Default::default()), &Default::default());
    let got = ops::grad_norm::<Gpu32>(inputs(&gpu()), &gpu());
    assert_close("sq_norm", &[got.sq_norm], &[expected.sq_norm], F32_TOL);
    assert_eq!(got.non_finite, 0);
    let fused = ops::grad_norm::<Fused32>(inputs(&gpu()), &gpu());
    assert_eq!(fused, got);
}

// ---------------------------------------------------------------- flat buffers

/// Tensors whose lengths break the device's alignment (5, 130 and 3 values) and a 2-D one, cast to f16 and back in one pass each: every tensor comes back whole (f16-rounded),
/// though each is a view of a padded segment of one flat buffer; then each is used in a
/// computation of its own, which must see only its own values.
fn cast_round_trip<B: Backend + KernelBackend>(device: &B::Device) {
    let lens = [5, 64, 130, 3];
    let originals: Vec<Vec<f32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| values(len, 2.0, 20 + i as u64, true))
        .collect();
    let mut tensors: Vec<Tensor<B, 2>> = originals
        .iter()
        .map(|v| tensor::<B, 2>(v, [1, v.len()], device))
        .collect();
    tensors.push(tensor::<B, 2>(&originals[2], [10, 13], device));
    let half = ops::cast_many(tensors, burn::tensor::FloatDType::F16, device);
    let back = ops::cast_many(half, burn::tensor::FloatDType::F32, device);
    for (i, (got, expected)) in back
        .iter()
        .zip(originals.iter().chain([&originals[2]]))
        .enumerate()
    {
        assert_eq!(got.dtype(), burn::tensor::DType::F32);
        assert_close(&format!("tensor {i}"), &to_vec(got.clone()), expected, 0.0);
        let doubled = to_vec(got.clone() * 2.0);
        let expected: Vec<f32> = expected.iter().map(|v| v * 2.0).collect();
        assert_close(&format!("2 × tensor {i}"), &doubled, &expected, 0.0);
    }
}

#[test]
fn cast_many_views_come_back_whole() {
    cast_round_trip::<Cpu>(&Default::default());
    cast_round_trip::<Gpu32>(&gpu());
    cast_round_trip::<Fused32>(&gpu());
    cast_round_trip::<Gpu16>(&gpu());
    cast_round_trip::<Fused16>(&gpu());
}

/// `adamw_many_copy` from flat parameters (odd lengths, so the copy's f16 layout pads
/// differently from the f32 one) equals `adamw_many` from the parameters one by one, and its
/// copy equals the stepped parameters cast to f16.
fn adamw_copy_round<B: Backend + KernelBackend>(device: &B::Device) {
    use burn::tensor::{DType, FloatDType};
    use kiln_kernels::FlatLayout;
    let lens = vec![5, 130, 64, 3];
    let layout = FlatLayout::new(lens.clone(), B::flat_alignment(device, DType::F32));
    let copy_layout = FlatLayout::new(lens.clone(), B::flat_alignment(device, DType::F16));
    let seg = |seed: u64, scale: f32| -> Vec<Tensor<B, 1>> {
        lens.iter()
            .enumerate()
            .map(|(i, &n)| tensor::<B, 1>(&values(n, scale, seed + i as u64, false), [n], device))
            .collect()
    };
    let (params, grads) = (seg(30, 1.0), seg(40, 1.0));
    let join = |parts: Vec<Tensor<B, 1>>| layout.join(parts, device, DType::F32);
    let (m, v) = (join(seg(50, 0.1)), join(seg(60, 0.01)).abs());
    let step = AdamWStep {
        lr: 1e-2,
        beta_1: 0.9,
        beta_2: 0.99,
        epsilon: 1e-5,
        weight_decay: 0.1,
        time: 2,
    };
    let (p1, m1, v1) = ops::adamw_many(
        params.clone(),
        grads.clone(),
        m.clone(),
        v.clone(),
        &layout,
        &step,
        0.5,
    )
    .unwrap();
    let [p2, m2, v2, copy] = ops::adamw_many_copy(
        join(params),
        grads,
        m,
        v,
        &layout,
        &step,
        0.5,
        (&copy_layout, FloatDType::F16),
    )
    .unwrap();
    let stepped = ops::flat_segments(p1.clone(), &layout);
    let copies = ops::flat_segments(copy, &copy_layout);
    for (i, (p, c)) in stepped.into_iter().zip(copies).enumerate() {
        let expected = to_vec(p.cast(FloatDType::F16).cast(FloatDType::F32));
        assert_close(
            &format!("copy {i}"),
            &to_vec(c.cast(FloatDType::F32)),
            &expected,
            0.0,
        );
    }
    for (name, a, b) in [("param", p1, p2), ("m", m1, m2), ("v", v1, v2)] {
        let segments = |t| ops::flat_segments(t, &layout).into_iter().map(to_vec);
        for (i, (x, y)) in segments(a).zip(segments(b)).enumerate() {
            assert_close(&format!("{name} {i}"), &y, &x, 0.0);
        }
    }
}

#[test]
fn adamw_with_a_copy_steps_as_without_and_copies_exactly() {
    adamw_copy_round::<Cpu>(&Default::default());
    adamw_copy_round::<Gpu32>(&gpu());
    adamw_copy_round::<Fused32>(&gpu());
}
