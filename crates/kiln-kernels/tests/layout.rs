//! Every kernel reads inputs of any layout and writes dense row-major outputs, on every runtime.
//!
//! CubeCL's CUDA runtime pitches the rows of tensors it allocates (`strides[0] > d` for a row
//! that is not a multiple of the alignment), while wgpu never does, so lavapipe alone cannot
//! show a kernel that ignores strides. These tests make the layouts a GPU produces on any
//! runtime and call the backend extension directly, below the `Tensor` API's own copies:
//! - a **pitched** input is a column slice of a wider tensor (`strides = [d + pad, 1]`), the
//!   exact layout CUDA allocates;
//! - a **transposed** input has `strides = [1, rows]`;
//! - a **stepped** 1-D input is every other element of a longer tensor.
//!
//! Each kernel must give bit-identical results for every layout of the same values (the same
//! kernel on the same values), and every output it returns must have dense strides, which is
//! what a pitched allocation would break on CUDA.

mod common;

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorData};
use common::*;
use cubecl::zspace::metadata::Metadata;
use kiln_kernels::quant::{HostQuantized, QuantizedPrimitive, QuantizedWeight};
use kiln_kernels::{AdamWStep, KernelBackend, QuantFormat, ScaleDtype};

type G = Gpu32;

/// The three layouts of the same `[rows, cols]` values.
#[derive(Clone, Copy, Debug)]
enum Layout {
    Dense,
    Pitched,
    Transposed,
}

const LAYOUTS: [Layout; 3] = [Layout::Dense, Layout::Pitched, Layout::Transposed];

/// `values` as a `[rows, cols]` primitive laid out as `layout`.
fn matrix(values: &[f32], rows: usize, cols: usize, layout: Layout) -> FloatTensor<G> {
    let device = gpu();
    let t = match layout {
        Layout::Dense => tensor::<G, 2>(values, [rows, cols], &device),
        Layout::Pitched => {
            // Each row padded with garbage that a dense read would pick up. Burn's `slice` makes
            // a view (not a copy) only when the cut-off tail is a multiple of the runtime's
            // memory alignment, so the padding is one alignment's worth of values.
            let probe = tensor::<G, 1>(&[0.0], [1], &device)
                .into_primitive()
                .tensor();
            let pad = (probe.client.properties().memory.alignment as usize / 4).max(1);
            let mut wide = Vec::with_capacity(rows * (cols + pad));
            for row in values.chunks(cols.max(1)) {
                wide.extend_from_slice(row);
                wide.extend(std::iter::repeat_n(1e4, pad));
            }
            tensor::<G, 2>(&wide, [rows, cols + pad], &device).slice([0..rows, 0..cols])
        }
        Layout::Transposed => {
            let mut columns = vec![0.0; rows * cols];
            for r in 0..rows {
                for c in 0..cols {
                    columns[c * rows + r] = values[r * cols + c];
                }
            }
            tensor::<G, 2>(&columns, [cols, rows], &device).transpose()
        }
    };
    let prim = t.into_primitive().tensor();
    if !matches!(layout, Layout::Dense) {
        assert!(
            !prim.is_contiguous(),
            "{layout:?} input is not a strided view"
        );
    }
    prim
}

/// `values` as a `[len]` primitive: dense, or every other element of a longer buffer (a view
/// with stride 2, made by hand: Burn's stepped `slice` copies on CubeCL backends).
fn vector(values: &[f32], stepped: bool) -> FloatTensor<G> {
    let device = gpu();
    if !stepped {
        return tensor::<G, 1>(values, [values.len()], &device)
            .into_primitive()
            .tensor();
    }
    let mut spread = vec![-7e3; 2 * values.len()];
    for (i, v) in values.iter().enumerate() {
        spread[2 * i] = *v;
    }
    let mut view = tensor::<G, 1>(&spread, [2 * values.len()], &device)
        .into_primitive()
        .tensor();
    view.meta = Box::new(Metadata::new([values.len()], [2usize]));
    assert!(!view.is_contiguous());
    view
}

fn int_vector(values: Vec<i64>) -> IntTensor<G> {
    let len = values.len();
    Tensor::<G, 1, Int>::from_data(TensorData::new(values, [len]), &gpu()).into_primitive()
}

/// Checks the output is dense and reads it back.
fn read(what: &str, t: FloatTensor<G>) -> Vec<f32> {
    let shape = t.meta.shape().to_vec();
    assert_dense(what, &shape, t.meta.strides());
    to_vec(
        Tensor::<G, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(t))
            .reshape([shape.iter().product::<usize>()]),
    )
}

/// Asserts that `strides` are the dense row-major strides of `shape`.
fn assert_dense(what: &str, shape: &[usize], strides: &[usize]) {
    let mut dense = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        dense[i] = dense[i + 1] * shape[i + 1];
    }
    assert_eq!(
        strides, dense,
        "{what}: tensor of shape {shape:?} is not dense"
    );
}

/// Runs `op` on every layout and checks all agree with the dense one, bit for bit.
fn same_for_every_layout(what: &str, op: impl Fn(Layout) -> Vec<Vec<f32>>) {
    let dense = op(Layout::Dense);
    for layout in [Layout::Pitched, Layout::Transposed] {
        let got = op(layout);
        for (i, (g, d)) in got.iter().zip(&dense).enumerate() {
            assert_eq!(
                g, d,
                "{what}, output {i}: {layout:?} inputs differ from dense ones"
            );
        }
    }
}

const ROWS: usize = 19;
const D: usize = 75;

#[test]
fn rms_norm_reads_strided_inputs_and_writes_dense_outputs() {
    let x = values(ROWS * D, 2.0, 1, false);
    let dy = values(ROWS * D, 1.0, 2, false);
    let gamma = values(D, 1.5, 3, false);
    same_for_every_layout("rms_norm", |layout| {
        let (y, rstd) =
            G::rms_norm_forward(matrix(&x, ROWS, D, layout), vector(&gamma, false), 1e-5);
        let (dx, dgamma) = G::rms_norm_backward(
            matrix(&dy, ROWS, D, layout),
            matrix(&x, ROWS, D, layout),
            vector(&gamma, true),
            rstd.clone(),
        );
        let dx_alone = G::rms_norm_input_grad(
            matrix(&dy, ROWS, D, layout),
            matrix(&x, ROWS, D, layout),
            vector(&gamma, true),
            rstd.clone(),
        );
        vec![
            read("y", y),
            read("rstd", rstd),
            read("dx", dx),
            read("dgamma", dgamma),
            read("dx alone", dx_alone),
        ]
    });
}

#[test]
fn cross_entropy_reads_strided_inputs_and_writes_dense_outputs() {
    const CLASSES: usize = 130;
    let logits = values(ROWS * CLASSES, 4.0, 4, false);
    let dloss = values(ROWS, 1.0, 5, false);
    let targets: Vec<i64> = (0..ROWS).map(|r| ((r * 37) % CLASSES) as i64).collect();
    same_for_every_layout("cross_entropy", |layout| {
        let (loss, lse) = G::cross_entropy_forward(
            matrix(&logits, ROWS, CLASSES, layout),
            int_vector(targets.clone()),
        );
        let dlogits = G::cross_entropy_backward(
            vector(&dloss, !matches!(layout, Layout::Dense)),
            matrix(&logits, ROWS, CLASSES, layout),
            int_vector(targets.clone()),
            lse.clone(),
        );
        vec![
            read("loss", loss),
            read("lse", lse),
            read("dlogits", dlogits),
        ]
    });
}

#[test]
fn layer_norm_reads_strided_inputs_and_writes_dense_outputs() {
    let x = values(ROWS * D, 2.0, 11, false);
    let dy = values(ROWS * D, 1.0, 12, false);
    let gamma = values(D, 1.5, 13, false);
    let beta = values(D, 0.5, 14, false);
    same_for_every_layout("layer_norm", |layout| {
        let (y, mean, rstd) = G::layer_norm_forward(
            matrix(&x, ROWS, D, layout),
            vector(&gamma, false),
            vector(&beta, true),
            1e-5,
        );
        let (dx, dgamma, dbeta) = G::layer_norm_backward(
            matrix(&dy, ROWS, D, layout),
            matrix(&x, ROWS, D, layout),
            vector(&gamma, true),
            mean.clone(),
            rstd.clone(),
        );
        vec![
            read("y", y),
            read("mean", mean),
            read("rstd", rstd),
            read("dx", dx),
            read("dgamma", dgamma),
            read("dbeta", dbeta),
        ]
    });
}

/// `values` as a `[batch, len, width]` primitive: the `[batch·len, width]` matrix of `layout`
/// seen with a batch dimension (a view, no copy).
fn batched(
    values: &[f32],
    batch: usize,
    len: usize,
    width: usize,
    layout: Layout,
) -> FloatTensor<G> {
    let mut t = matrix(values, batch * len, width, layout);
    let strides = t.meta.strides().to_vec();
    t.meta = Box::new(Metadata::new(
        [batch, len, width],
        [len * strides[0], strides[0], strides[1]],
    ));
    t
}

#[test]
fn causal_attention_reads_strided_inputs_and_writes_dense_outputs() {
    const BATCH: usize = 2;
    const HEADS: usize = 3;
    const WIDTH: usize = 3 * 4;
    const Q_LEN: usize = 5;
    const KV_LEN: usize = 7;
    let q = values(BATCH * Q_LEN * WIDTH, 1.0, 21, false);
    let k = values(BATCH * KV_LEN * WIDTH, 1.0, 22, false);
    let v = values(BATCH * KV_LEN * WIDTH, 1.0, 23, false);
    let dout = values(BATCH * Q_LEN * WIDTH, 1.0, 24, false);
    same_for_every_layout("causal_attention", |layout| {
        let qkv = || {
            [
                batched(&q, BATCH, Q_LEN, WIDTH, layout),
                batched(&k, BATCH, KV_LEN, WIDTH, layout),
                batched(&v, BATCH, KV_LEN, WIDTH, layout),
            ]
        };
        let [q3, k3, v3] = qkv();
        let (out, lse) = G::causal_attention_forward(q3, k3, v3, HEADS, None);
        let [dq, dk, dv] = G::causal_attention_backward(
            batched(&dout, BATCH, Q_LEN, WIDTH, layout),
            qkv(),
            out.clone(),
            lse.clone(),
            HEADS,
            None,
        );
        vec![
            read("out", out),
            read("lse", lse),
            read("dq", dq),
            read("dk", dk),
            read("dv", dv),
        ]
    });
}

#[test]
fn element_wise_kernels_read_stepped_inputs_and_write_dense_outputs() {
    const LEN: usize = 301;
    let (gate, up, dy) = (
        values(LEN, 4.0, 6, false),
        values(LEN, 2.0, 7, false),
        values(LEN, 1.0, 8, false),
    );
    let (p, g) = (values(LEN, 1.0, 9, false), values(LEN, 1.0, 10, false));
    let (m, v) = (values(LEN, 0.1, 11, false), values(LEN, 0.01, 12, false));
    let v: Vec<f32> = v.iter().map(|x| x.abs()).collect();
    let step = AdamWStep {
        lr: 1e-2,
        beta_1: 0.9,
        beta_2: 0.99,
        epsilon: 1e-5,
        weight_decay: 0.1,
        time: 2,
    };
    let run = |stepped: bool| {
        let y = G::swiglu_forward(vector(&gate, stepped), vector(&up, stepped));
        let (dg, du) = G::swiglu_backward(
            vector(&dy, stepped),
            vector(&gate, stepped),
            vector(&up, stepped),
        );
        let (p1, m1, v1) = G::adamw_step(
            vector(&p, stepped),
            vector(&g, stepped),
            vector(&m, stepped),
            vector(&v, stepped),
            &step,
        );
        let norm = G::grad_sq_norm(vec![vector(&g, stepped), vector(&p, stepped)], &gpu());
        let relu = G::relu_forward(vector(&gate, stepped));
        let drelu =
            <G as KernelBackend>::relu_backward(vector(&dy, stepped), vector(&gate, stepped));
        vec![
            read("swiglu", y),
            read("dgate", dg),
            read("dup", du),
            read("relu", relu),
            read("drelu", drelu),
            read("param", p1),
            read("m", m1),
            read("v", v1),
            read("norm", norm),
        ]
    };
    assert_eq!(
        run(true),
        run(false),
        "stepped inputs differ from dense ones"
    );
}

#[test]
fn qlora_reads_strided_inputs_and_writes_dense_outputs() {
    // The tiled kernel (17 to 63 rows) and the vector kernels (m = 2, with a long reduction
    // split for the input gradient), both directions, with every operand strided, the
    // weight's tensors included.
    for (m, k, n) in [(37, 203, 75), (2, 1100, 33), (2, 33, 1100)] {
        let r = 3;
        let w = values(k * n, 0.1, 13, false);
        let q = HostQuantized::quantize(&w, k, n, QuantFormat::Nf4, ScaleDtype::F32);
        let weight = QuantizedWeight::<G>::from_host(&q, ScaleDtype::F32, &gpu()).primitive();
        let (x, t, b, dy) = (
            values(m * k, 1.0, 14, false),
            values(m * r, 1.0, 15, false),
            values(r * n, 0.2, 16, false),
            values(m * n, 1.0, 17, false),
        );
        let scales = read("scales", weight.scales.clone());
        let blocks = scales.len() / n;
        same_for_every_layout(&format!("qlora {m}x{k}x{n}"), |layout| {
            let strided = QuantizedPrimitive::<G> {
                scales: matrix(&scales, n, blocks, layout),
                ..weight.clone()
            };
            let y = G::qlora_forward(
                matrix(&x, m, k, layout),
                strided.clone(),
                matrix(&t, m, r, layout),
                matrix(&b, r, n, layout),
                2.0,
            );
            let dx = G::qlora_input_grad(matrix(&dy, m, n, layout), strided);
            vec![read("y", y), read("dx", dx)]
        });
    }
}

/// A 4-bit weight's codes and scales are stored dense, whatever their shape: the kernels read
/// them on every call and copy any other layout each time. On CUDA every tensor made from host
/// data is pitched (`[33, 18]` f32 scales came back with strides `[32, 1]`), so this is the
/// check that `QuantizedWeight::from_host` lays them out itself; on wgpu it holds trivially.
#[test]
fn quantized_weights_are_stored_dense() {
    for (k, n) in [(1100, 33), (203, 75), (64, 18), (8, 3)] {
        let q = HostQuantized::quantize(
            &values(k * n, 0.1, 19, false),
            k,
            n,
            QuantFormat::Nf4,
            ScaleDtype::F32,
        );
        let weight = QuantizedWeight::<G>::from_host(&q, ScaleDtype::F32, &gpu()).primitive();
        read("scales", weight.scales);
        assert_dense(
            "packed",
            &weight.packed.meta.shape().to_vec(),
            weight.packed.meta.strides(),
        );
    }
}

/// `KernelBackend::dense_float` turns every layout into a dense tensor of the same values.
#[test]
fn dense_lays_out_every_layout_densely() {
    let x = values(ROWS * D, 1.0, 20, false);
    for layout in LAYOUTS {
        assert_eq!(
            read("dense", G::dense_float(matrix(&x, ROWS, D, layout))),
            x,
            "{layout:?}"
        );
    }
    let packed: Vec<i64> = (0..40).collect();
    let stepped = {
        let mut t = int_vector((0..80).collect());
        t.meta = Box::new(Metadata::new([40], [2usize]));
        t
    };
    let dense = G::dense_int(stepped);
    assert_dense(
        "dense_int",
        &dense.meta.shape().to_vec(),
        dense.meta.strides(),
    );
    let read_back = Tensor::<G, 1, Int>::from_primitive(dense)
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .unwrap();
    assert_eq!(read_back, packed.iter().map(|v| 2 * v).collect::<Vec<_>>());
}

/// The layouts above really differ from dense ones: a kernel that indexed them densely would
/// read the padding.
#[test]
fn the_strided_layouts_hold_the_same_values() {
    let x = values(ROWS * D, 1.0, 18, false);
    for layout in LAYOUTS {
        let t = Tensor::<G, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(matrix(
            &x, ROWS, D, layout,
        )));
        assert_eq!(to_vec(t), x, "{layout:?}");
    }
}
