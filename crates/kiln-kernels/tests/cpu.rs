//! The CPU kernels (LayerNorm, causal attention, softmax cross-entropy, rotary embeddings on
//! Flex) against the
//! plain-Burn reference, forward and backward, at sizes that fill no vector evenly (odd
//! widths, a sequence of one, rows that do not divide by 8), within 1e-5 of the expected
//! tensor's scale (`assert_close`).
//!
//! Gradients are taken through `Autodiff<Flex>` both ways: the fused op's hand-written backward
//! against Burn's autodiff of the reference composite, so the formulas and the autodiff wiring
//! are checked together. Cross-entropy is also the `cpu` case of `fused.rs` (1000 classes).

mod common;

use burn::backend::Flex;
use burn::tensor::{DType, FloatDType, Int, Tensor, TensorData};
use common::*;
use kiln_kernels::ops::{self, KernelError};
use kiln_kernels::reference;

const TOL: f32 = 1e-5;

fn input<const D: usize>(shape: [usize; D], scale: f32, seed: u64) -> Tensor<AdCpu, D> {
    let len = shape.iter().product();
    tensor::<AdCpu, D>(&values(len, scale, seed, false), shape, &Default::default()).require_grad()
}

/// `[y, d input₀, d input₁, …]` for the loss `Σ y·probe`.
fn outputs_and_grads<const D: usize, const N: usize>(
    y: Tensor<AdCpu, D>,
    inputs: [&Tensor<AdCpu, D>; N],
    extra: &[&Tensor<AdCpu, 1>],
) -> Vec<Vec<f32>> {
    let probe = tensor::<AdCpu, D>(
        &values(y.shape().num_elements(), 1.0, 99, false),
        y.dims(),
        &Default::default(),
    );
    let grads = (y.clone() * probe).sum().backward();
    let mut out = vec![to_vec(y)];
    out.extend(inputs.iter().map(|t| to_vec(t.grad(&grads).unwrap())));
    out.extend(extra.iter().map(|t| to_vec(t.grad(&grads).unwrap())));
    out
}

fn compare(what: &str, got: &[Vec<f32>], expected: &[Vec<f32>], names: &[&str]) {
    assert_eq!(got.len(), expected.len(), "{what}: the results compared");
    for ((g, e), name) in got.iter().zip(expected).zip(names) {
        assert_close(&format!("{what}: {name}"), g, e, TOL);
    }
}

// ---------------------------------------------------------------- LayerNorm

fn layer_norm(rows: usize, d: usize, fused: bool) -> Vec<Vec<f32>> {
    // An offset mean, so that a one-pass variance would lose digits.
    let x = input([2, rows, d], 3.0, 1)
        .add_scalar(5.0)
        .detach()
        .require_grad();
    let gamma = input([d], 1.5, 2);
    let beta = input([d], 0.5, 3);
    let y = if fused {
        ops::layer_norm(x.clone(), gamma.clone(), beta.clone(), 1e-5).unwrap()
    } else {
        let flat = x.clone().reshape([2 * rows, d]);
        let (y, _, _) = reference::layer_norm::forward(flat, gamma.clone(), beta.clone(), 1e-5);
        y.reshape([2, rows, d])
    };
    outputs_and_grads(y, [&x], &[&gamma, &beta])
}

#[test]
fn layer_norm_matches_the_reference() {
    for (rows, d) in [(37, 67), (5, 3), (1, 1), (19, 64), (3, 129)] {
        compare(
            &format!("layer_norm rows {rows} d {d}"),
            &layer_norm(rows, d, true),
            &layer_norm(rows, d, false),
            &["y", "dx", "dgamma", "dbeta"],
        );
    }
}

/// The reference itself against Burn's own `LayerNorm` module, so that the oracle is the
/// function the models used before.
#[test]
fn the_layer_norm_reference_is_burns_layer_norm() {
    let device = Default::default();
    let norm = burn::nn::LayerNormConfig::new(67).init::<Flex>(&device);
    let x = tensor::<Flex, 2>(&values(37 * 67, 3.0, 4, false), [37, 67], &device);
    let (y, _, _) = reference::layer_norm::forward(
        x.clone(),
        norm.gamma.val(),
        norm.beta.as_ref().unwrap().val(),
        1e-5,
    );
    assert_close(
        "layer_norm reference",
        &to_vec(y),
        &to_vec(norm.forward(x)),
        TOL,
    );
}

// ---------------------------------------------------------------- causal attention

/// `q_len` queries, the last of `kv_len` positions.
fn attention(
    batch: usize,
    [q_len, kv_len]: [usize; 2],
    heads: usize,
    d_head: usize,
    fused: bool,
) -> Vec<Vec<f32>> {
    let d_model = heads * d_head;
    let q = input([batch, q_len, d_model], 2.0, 5);
    let (k, v) = (
        input([batch, kv_len, d_model], 2.0, 6),
        input([batch, kv_len, d_model], 1.0, 7),
    );
    let y = if fused {
        ops::causal_attention(q.clone(), k.clone(), v.clone(), heads).unwrap()
    } else {
        reference::attention::forward(q.clone(), k.clone(), v.clone(), heads, None).0
    };
    outputs_and_grads(y, [&q, &k, &v], &[])
}

#[test]
fn causal_attention_matches_the_reference() {
    let cases = [
        (3, [13, 13], 3, 7),
        (2, [1, 1], 2, 5),
        (1, [61, 61], 4, 16),
        (2, [9, 9], 1, 17),
        // Fewer queries than keys: a decoder's step over a cached prefix, and a longer tail.
        (3, [1, 11], 2, 9),
        (2, [5, 23], 3, 5),
    ];
    for (batch, lens, heads, d_head) in cases {
        compare(
            &format!("attention batch {batch} q/kv {lens:?} heads {heads} d_head {d_head}"),
            &attention(batch, lens, heads, d_head, true),
            &attention(batch, lens, heads, d_head, false),
            &["out", "dq", "dk", "dv"],
        );
    }
}

/// A query's output is the same whether it is computed with every earlier query or alone
/// over the same keys (what a decoder with a cache relies on), to float rounding: a block of
/// rows and a row alone go through different `gemm` kernels.
#[test]
fn the_last_query_alone_equals_its_row_of_the_full_attention() {
    let device = Default::default();
    let (batch, seq, heads, d_head) = (3, 17, 4, 16);
    let shape = [batch, seq, heads * d_head];
    let t = |seed| {
        tensor::<Flex, 3>(
            &values(shape.iter().product(), 2.0, seed, false),
            shape,
            &device,
        )
    };
    let (q, k, v) = (t(30), t(31), t(32));
    let full = ops::causal_attention(q.clone(), k.clone(), v.clone(), heads).unwrap();
    let last = ops::causal_attention(q.narrow(1, seq - 1, 1), k, v, heads).unwrap();
    let (full, last) = (to_vec(full.narrow(1, seq - 1, 1)), to_vec(last));
    let worst = full
        .iter()
        .zip(&last)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst < 1e-6, "{worst}");
    // The query's own row, not another's: a shifted comparison is far off.
    let shifted = full
        .iter()
        .skip(1)
        .zip(&last)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(shifted > 1e-3);
}

/// The reference's log-sum-exp and the kernel's agree, and a query's output does not move
/// when a later key or value changes.
#[test]
fn causal_attention_saves_the_log_sum_exp_and_ignores_the_future() {
    use kiln_kernels::KernelBackend;
    let device = Default::default();
    let (batch, seq, heads, d_head) = (2, 11, 3, 5);
    let shape = [batch, seq, heads * d_head];
    let qkv: Vec<Tensor<Flex, 3>> = (0..3)
        .map(|s| {
            tensor::<Flex, 3>(
                &values(shape.iter().product(), 2.0, 10 + s, false),
                shape,
                &device,
            )
        })
        .collect();
    let prim = |t: &Tensor<Flex, 3>| t.clone().into_primitive().tensor();
    let (_, lse) =
        Flex::causal_attention_forward(prim(&qkv[0]), prim(&qkv[1]), prim(&qkv[2]), heads, None);
    let lse = Tensor::<Flex, 3>::from_primitive(burn::tensor::TensorPrimitive::Float(lse));
    let (_, expected) =
        reference::attention::forward(qkv[0].clone(), qkv[1].clone(), qkv[2].clone(), heads, None);
    assert_close("lse", &to_vec(lse), &to_vec(expected), TOL);

    let y = ops::causal_attention(qkv[0].clone(), qkv[1].clone(), qkv[2].clone(), heads).unwrap();
    let later = |t: &Tensor<Flex, 3>| {
        let mut data = to_vec(t.clone());
        for value in &mut data[(seq - 1) * heads * d_head..seq * heads * d_head] {
            *value += 10.0;
        }
        Tensor::<Flex, 3>::from_data(TensorData::new(data, shape), &device)
    };
    let moved =
        ops::causal_attention(qkv[0].clone(), later(&qkv[1]), later(&qkv[2]), heads).unwrap();
    let first = |t: Tensor<Flex, 3>| to_vec(t.narrow(0, 0, 1).narrow(1, 0, seq - 1));
    assert_eq!(first(y), first(moved));
}

/// Packed rows of `lens` examples each (one row per list, each summing to the same length):
/// each query's first key.
fn starts_of(rows: &[&[usize]]) -> (Vec<i64>, [usize; 2]) {
    let seq: usize = rows[0].iter().sum();
    let starts: Vec<i64> = rows
        .iter()
        .flat_map(|lens| {
            assert_eq!(lens.iter().sum::<usize>(), seq, "rows of one length");
            let mut first = 0;
            lens.iter().flat_map(move |&len| {
                let start = first;
                first += len;
                std::iter::repeat_n(start as i64, len)
            })
        })
        .collect();
    (starts, [rows.len(), seq])
}

fn packed_attention(rows: &[&[usize]], heads: usize, d_head: usize, fused: bool) -> Vec<Vec<f32>> {
    let (starts, [batch, seq]) = starts_of(rows);
    let d_model = heads * d_head;
    let q = input([batch, seq, d_model], 2.0, 50);
    let (k, v) = (
        input([batch, seq, d_model], 2.0, 51),
        input([batch, seq, d_model], 1.0, 52),
    );
    let starts = Tensor::<AdCpu, 2, Int>::from_data(
        TensorData::new(starts, [batch, seq]),
        &Default::default(),
    );
    let y = if fused {
        ops::packed_causal_attention(q.clone(), k.clone(), v.clone(), heads, starts).unwrap()
    } else {
        reference::attention::forward(q.clone(), k.clone(), v.clone(), heads, Some(starts)).0
    };
    outputs_and_grads(y, [&q, &k, &v], &[])
}

/// Examples that straddle the kernel's blocks of 64 query rows, an example of one token, and
/// a row that is one example (plain causal attention).
#[test]
fn packed_attention_matches_the_reference() {
    let cases: [&[&[usize]]; 3] = [
        &[&[1, 70, 30, 49], &[150], &[64, 64, 22]],
        &[&[3, 4], &[1, 1, 1, 1, 1, 1, 1]],
        &[&[13]],
    ];
    for rows in cases {
        compare(
            &format!("packed attention {rows:?}"),
            &packed_attention(rows, 2, 9, true),
            &packed_attention(rows, 2, 9, false),
            &["out", "dq", "dk", "dv"],
        );
    }
}

/// Each example of a packed row attends as it would alone: its rows of the packed output
/// equal plain causal attention over the example by itself (to the rounding of `gemm`'s
/// blocks), and differ from attention over the whole row.
#[test]
fn a_packed_example_attends_as_if_alone() {
    let device = Default::default();
    let lens = [5, 66, 1, 28];
    let (starts, [_, seq]) = starts_of(&[&lens]);
    let (heads, d_head) = (4, 8);
    let shape = [1, seq, heads * d_head];
    let t = |seed| {
        tensor::<Flex, 3>(
            &values(seq * heads * d_head, 2.0, seed, false),
            shape,
            &device,
        )
    };
    let (q, k, v) = (t(60), t(61), t(62));
    let starts = Tensor::<Flex, 2, Int>::from_data(TensorData::new(starts, [1, seq]), &device);
    let packed =
        ops::packed_causal_attention(q.clone(), k.clone(), v.clone(), heads, starts).unwrap();
    let whole = ops::causal_attention(q.clone(), k.clone(), v.clone(), heads).unwrap();
    let mut first = 0;
    for len in lens {
        let part = |t: &Tensor<Flex, 3>| t.clone().narrow(1, first, len);
        let alone = ops::causal_attention(part(&q), part(&k), part(&v), heads).unwrap();
        let worst = |a: &Tensor<Flex, 3>| {
            to_vec(part(a))
                .iter()
                .zip(to_vec(alone.clone()))
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max)
        };
        assert!(
            worst(&packed) < 1e-6,
            "example at {first}: {}",
            worst(&packed)
        );
        if first > 0 {
            assert!(
                worst(&whole) > 1e-3,
                "example at {first} sees the one before"
            );
        }
        first += len;
    }
}

// ---------------------------------------------------------------- cross-entropy

fn cross_entropy(rows: usize, classes: usize, fused: bool) -> Vec<Vec<f32>> {
    let device = Default::default();
    let logits = tensor::<AdCpu, 2>(
        &values(rows * classes, 6.0, 40, false),
        [rows, classes],
        &device,
    )
    .require_grad();
    let targets: Vec<i64> = (0..rows).map(|r| ((r * 7 + 3) % classes) as i64).collect();
    let targets =
        Tensor::<AdCpu, 1, burn::tensor::Int>::from_data(TensorData::new(targets, [rows]), &device);
    let loss = if fused {
        ops::cross_entropy(logits.clone(), targets).unwrap()
    } else {
        reference::cross_entropy::forward(logits.clone(), targets).0
    };
    let probe = tensor::<AdCpu, 1>(&values(rows, 1.0, 41, false), [rows], &device);
    let grads = (loss.clone() * probe).sum().backward();
    vec![to_vec(loss), to_vec(logits.grad(&grads).unwrap())]
}

#[test]
fn cross_entropy_matches_the_reference() {
    // The AD model's 5 actions, and widths that fill no vector or leave a tail.
    for (rows, classes) in [(37, 5), (3, 1), (9, 13), (4, 1003)] {
        compare(
            &format!("cross_entropy rows {rows} classes {classes}"),
            &cross_entropy(rows, classes, true),
            &cross_entropy(rows, classes, false),
            &["loss", "dlogits"],
        );
    }
}

#[test]
fn bad_attention_inputs_are_errors() {
    let device = Default::default();
    let t = |d: usize| Tensor::<Flex, 3>::zeros([2, 3, d], &device);
    assert_eq!(
        ops::causal_attention(t(6), t(6), t(6), 4).unwrap_err(),
        KernelError::Heads {
            d_model: 6,
            heads: 4
        }
    );
    assert!(matches!(
        ops::causal_attention(t(6), t(6), t(8), 2).unwrap_err(),
        KernelError::Shapes { right: "v", .. }
    ));
    // Keys of 8 are not whole heads of 3; 3 key heads do not split 4 query heads.
    assert_eq!(
        ops::causal_attention(t(6), t(8), t(8), 2).unwrap_err(),
        KernelError::KvHeads {
            kv_width: 8,
            heads: 2,
            d_head: 3
        }
    );
    assert_eq!(
        ops::causal_attention(t(12), t(9), t(9), 4).unwrap_err(),
        KernelError::KvHeads {
            kv_width: 9,
            heads: 4,
            d_head: 3
        }
    );
    let long = Tensor::<Flex, 3>::zeros([2, 5, 6], &device);
    assert_eq!(
        ops::causal_attention(long, t(6), t(6), 2).unwrap_err(),
        KernelError::MoreQueries {
            q_len: 5,
            kv_len: 3
        }
    );
}

/// Half-precision tensors (mixed precision's forward) take the plain-Burn path and agree with
/// f32 to half precision.
#[test]
fn half_precision_falls_back_to_the_reference() {
    let device = Default::default();
    let (rows, d) = (9, 24);
    let x = tensor::<Flex, 2>(&values(rows * d, 2.0, 20, true), [rows, d], &device);
    let gamma = Tensor::<Flex, 1>::ones([d], &device);
    let beta = Tensor::<Flex, 1>::zeros([d], &device);
    let full = ops::layer_norm(x.clone(), gamma.clone(), beta.clone(), 1e-5).unwrap();
    let half = ops::layer_norm(
        x.cast(FloatDType::BF16),
        gamma.cast(FloatDType::BF16),
        beta.cast(FloatDType::BF16),
        1e-5,
    )
    .unwrap();
    assert_eq!(half.dtype(), DType::BF16);
    assert_close("bf16 layer_norm", &to_vec(half), &to_vec(full), 2e-2);

    let shape = [2, 7, 8];
    let q = tensor::<Flex, 3>(&values(112, 1.0, 21, true), shape, &device);
    let full = ops::causal_attention(q.clone(), q.clone(), q.clone(), 2).unwrap();
    let q = q.cast(FloatDType::BF16);
    let half = ops::causal_attention(q.clone(), q.clone(), q, 2).unwrap();
    assert_close("bf16 attention", &to_vec(half), &to_vec(full), 2e-2);
}

// ---------------------------------------------------------------- rotary embeddings

/// The CPU kernel rotates as the composite does, to the last bit (no fused multiply-add), at
/// widths no vector fills (18: halves of 9) and one position.
#[test]
fn rope_equals_the_reference_bit_for_bit() {
    let device = Default::default();
    for shape in [[2, 7, 3, 18], [1, 1, 2, 4], [3, 5, 1, 64]] {
        let [_, seq, _, d] = shape;
        let x = tensor::<Flex, 4>(
            &values(shape.iter().product(), 3.0, 51, false),
            shape,
            &device,
        );
        let cos = tensor::<Flex, 2>(&values(seq * d, 1.0, 52, false), [seq, d], &device);
        let sin = tensor::<Flex, 2>(&values(seq * d, 1.0, 53, false), [seq, d], &device);
        let got = ops::rope(x.clone(), cos.clone(), sin.clone()).unwrap();
        let expected = reference::rope::forward(x.clone(), cos, sin);
        assert_eq!(to_vec(got), to_vec(expected), "{shape:?}");
        // A table row per token, as packed sequences rotate.
        let tokens = shape[0] * seq;
        let cos = tensor::<Flex, 2>(&values(tokens * d, 1.0, 54, false), [tokens, d], &device);
        let sin = tensor::<Flex, 2>(&values(tokens * d, 1.0, 55, false), [tokens, d], &device);
        let got = ops::rope(x.clone(), cos.clone(), sin.clone()).unwrap();
        let expected = reference::rope::forward(x, cos, sin);
        assert_eq!(to_vec(got), to_vec(expected), "{shape:?} per token");
    }
}

#[test]
fn bad_rope_inputs_are_errors() {
    let device = Default::default();
    let x = |d: usize| Tensor::<Flex, 4>::zeros([1, 3, 2, d], &device);
    let t = |rows: usize, d: usize| Tensor::<Flex, 2>::zeros([rows, d], &device);
    assert_eq!(
        ops::rope(x(5), t(3, 5), t(3, 5)).unwrap_err(),
        KernelError::OddWidth { width: 5 }
    );
    let e = ops::rope(x(4), t(2, 4), t(2, 4)).unwrap_err();
    assert!(
        e.to_string()
            .contains("cos has 2 rows; it needs one per position (3) or one per token (1 × 3)"),
        "{e}"
    );
    let e = ops::rope(x(4), t(3, 4), t(2, 4)).unwrap_err();
    assert!(e.to_string().contains("sin has 2 rows"), "{e}");
    let e = ops::rope(x(4), t(3, 4), t(3, 6)).unwrap_err();
    assert!(
        e.to_string()
            .contains("sin's width (the head's) is 6 but must be 4"),
        "{e}"
    );
}

// ---------------------------------------------------------------- SwiGLU

/// SwiGLU over more elements than one task takes (two and a bit chunks of 2¹⁴), gates from
/// −12 to 12 where the sigmoid saturates, forward and both gradients.
#[test]
fn swiglu_matches_the_reference_across_chunks() {
    let shape = [3, 12_007];
    let gate = input(shape, 12.0, 61);
    let up = input(shape, 2.0, 62);
    let got = outputs_and_grads(
        ops::swiglu(gate.clone(), up.clone()).unwrap(),
        [&gate, &up],
        &[],
    );
    let expected = outputs_and_grads(
        reference::swiglu::forward(gate.clone(), up.clone()),
        [&gate, &up],
        &[],
    );
    compare("swiglu", &got, &expected, &["y", "dgate", "dup"]);
}
