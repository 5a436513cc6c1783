//! Kiln's kernels on the CPU: LayerNorm, RMSNorm (forward and a frozen gain's backward), causal
//! attention, softmax cross-entropy, rotary embeddings and SwiGLU as vectorised loops over
//! slices, QLoRA's 4-bit weight decoded in one pass, the linear layers' products through gemm
//! into buffers written once (their epilogue in one pass after), and their implementation of
//! [`KernelBackend`] for Burn's Flex backend, and AdamW over every parameter in one pass. Each
//! takes f32 tensors; other dtypes (bf16, f16 under mixed precision) take the plain-Burn path.
//! The other kernels (RMSNorm's gain gradient, the norm) keep theirs.
//!
//! Rayon splits the work (attention by sequence, the element-wise kernels by chunk, the
//! cross-entropy by rows) inside whatever pool the caller runs in: a Ddp rank's pool has one
//! thread, so it runs inline there.

mod adamw;
mod attention;
mod buffer;
mod cross_entropy;
mod layer_norm;
mod linear;
mod matmul;
mod qlora;
mod rms_norm;
mod rope;
mod simd;
mod swiglu;

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{DType, Shape, TensorData};

use crate::backend::{KernelBackend, plain, transposed, unwrap, wrap};
use crate::quant::QuantizedPrimitive;
use crate::{AdamWStep, Epilogue, FlatLayout, Transpose};

/// Elements per Rayon task of the element-wise kernels (SwiGLU, AdamW, the cross-entropy's
/// rows): large enough that a task outweighs its scheduling, small enough that a step's
/// elements split over a rank's threads.
const TASK_ELEMENTS: usize = 1 << 14;

/// The tensor in one contiguous f32 buffer (a copy only when it is a strided view), or
/// `None` for another dtype.
fn contiguous_f32(t: &FlexTensor) -> Option<FlexTensor> {
    (t.dtype() == DType::F32).then(|| t.to_contiguous())
}

fn values(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>()
        .expect("a contiguous f32 tensor (from contiguous_f32)")
}

fn tensor(values: Vec<f32>, shape: impl Into<Shape>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape.into()))
}

fn dims<const D: usize>(t: &FlexTensor) -> [usize; D] {
    t.layout().shape().dims::<D>()
}

/// The attention's shape from `q [batch, q_len, heads·d_head]` and `k [batch, kv_len,
/// kv_heads·d_head]`, or `None` when the key heads do not divide the query heads evenly (the
/// plain path reports that).
fn attention_dims(q: &FlexTensor, k: &FlexTensor, heads: usize) -> Option<attention::Dims> {
    let [batch, q_len, d_model] = dims::<3>(q);
    let [_, kv_len, kv_model] = dims::<3>(k);
    let d_head = d_model.checked_div(heads).filter(|&d| d > 0)?;
    let kv_heads = kv_model / d_head;
    let even = kv_model.is_multiple_of(d_head) && kv_heads > 0 && heads.is_multiple_of(kv_heads);
    even.then_some(attention::Dims {
        batch,
        q_len,
        kv_len,
        heads,
        kv_heads,
        d_head,
    })
}

/// Class indices as `usize`, each checked to lie in `0..classes`, or `None` for an integer
/// dtype the kernel does not read.
/// Each query's first key from `starts [batch, q_len]`, clamped to the query's own position as
/// the backend contract says: `Some(None)` without starts, `None` for an integer type the
/// kernel does not read.
fn first_keys(starts: Option<&FlexTensor>, dims: attention::Dims) -> Option<Option<Vec<usize>>> {
    let Some(starts) = starts else {
        return Some(None);
    };
    let raw = int_values(starts)?;
    let offset = dims.kv_len - dims.q_len;
    let first = raw
        .chunks_exact(dims.q_len)
        .flat_map(|row| {
            row.iter()
                .enumerate()
                .map(move |(i, &s)| usize::try_from(s).unwrap_or(0).min(i + offset))
        })
        .collect();
    Some(Some(first))
}

/// The values of an integer tensor, `None` for an integer type the kernels do not read.
fn int_values(t: &FlexTensor) -> Option<Vec<i64>> {
    let t = t.to_contiguous();
    match t.dtype() {
        DType::I64 => Some(t.as_slice::<i64>()?.to_vec()),
        DType::I32 => Some(t.as_slice::<i32>()?.iter().map(|&v| v.into()).collect()),
        _ => None,
    }
}

fn class_indices(targets: &FlexTensor, classes: usize) -> Option<Vec<usize>> {
    let indices = int_values(targets)?;
    Some(
        indices
            .into_iter()
            .map(|t| {
                usize::try_from(t)
                    .ok()
                    .filter(|&t| t < classes)
                    .unwrap_or_else(|| {
                        panic!("cross_entropy: target {t} is not a class in 0..{classes}")
                    })
            })
            .collect(),
    )
}

/// `lhs·rhs` through gemm into a buffer of its own, or `None` when an operand is not a 2-D f32
/// matrix with non-negative strides (Burn's matmul takes those).
fn product(lhs: &FlexTensor, rhs: &FlexTensor) -> Option<(Vec<f32>, [usize; 2])> {
    let (l, r) = (matmul::View::of(lhs)?, matmul::View::of(rhs)?);
    let shape = [l.row_count(), r.col_count()];
    Some((matmul::product(l, r), shape))
}

impl KernelBackend for Flex {
    /// One pass over every element (the reference takes about fourteen, each with its own
    /// temporary) when the parameters, gradients and moments are f32.
    fn adamw_many(
        params: Vec<FloatTensor<Self>>,
        grads: Vec<FloatTensor<Self>>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        layout: &FlatLayout,
        step: &AdamWStep,
        grad_scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let f32s = |ts: &[FlexTensor]| ts.iter().map(contiguous_f32).collect::<Option<Vec<_>>>();
        let (Some(ps), Some(gs), Some(mc), Some(vc)) = (
            f32s(&params),
            f32s(&grads),
            contiguous_f32(&m),
            contiguous_f32(&v),
        ) else {
            return plain::adamw_many::<Self>(params, grads, m, v, layout, step, grad_scale);
        };
        let ps: Vec<&[f32]> = ps.iter().map(values).collect();
        let gs: Vec<&[f32]> = gs.iter().map(values).collect();
        let total = layout.total();
        let [p, m, v] =
            adamw::step_many(&ps, &gs, values(&mc), values(&vc), layout, step, grad_scale);
        (tensor(p, [total]), tensor(m, [total]), tensor(v, [total]))
    }

    /// One buffer (the same `Arc`), laid out and typed alike. Sound while the caller holds a
    /// clone: Flex writes in place only into a buffer nothing else holds, and a held buffer's
    /// address is never reused.
    fn same_tensor(a: &FloatTensor<Self>, b: &FloatTensor<Self>) -> bool {
        std::sync::Arc::ptr_eq(&a.data_arc(), &b.data_arc())
            && a.layout() == b.layout()
            && a.dtype() == b.dtype()
    }

    fn matmul(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        transpose: Transpose,
    ) -> FloatTensor<Self> {
        let (lhs, rhs) = transposed::<Self>(lhs, rhs, transpose);
        match product(&lhs, &rhs) {
            Some((y, shape)) => tensor(y, shape),
            None => Self::float_matmul(lhs, rhs),
        }
    }

    fn linear_forward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: Option<FloatTensor<Self>>,
        epilogue: Epilogue<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        let bias = b.as_ref().map(contiguous_f32);
        let residual = epilogue.residual().map(contiguous_f32);
        let f32_operands = !matches!(bias, Some(None)) && !matches!(residual, Some(None));
        let Some((mut y, shape)) = f32_operands.then(|| product(&x, &w)).flatten() else {
            return plain::linear_forward::<Self>(x, w, b, epilogue);
        };
        let (bias, residual) = (bias.flatten(), residual.flatten());
        let epilogue = epilogue.map(|_| values(residual.as_ref().expect("an f32 residual")));
        linear::epilogue(&mut y, shape[1], bias.as_ref().map(values), epilogue);
        tensor(y, shape)
    }

    fn qlora_forward(
        x: FloatTensor<Self>,
        weight: QuantizedPrimitive<Self>,
        t: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        let f32 = x.dtype() == DType::F32;
        let Some(deq) = f32.then(|| qlora::dequantize_nk(&weight)).flatten() else {
            return plain::qlora_forward::<Self>(x, weight, t, b, scale);
        };
        let base = wrap::<Self, 2>(Self::matmul(x, deq, Transpose::Rhs));
        let low_rank = crate::ops::add_low_rank(base, wrap(t), wrap(b), scale);
        unwrap(low_rank.expect("the adapter's factors chain: rank → out"))
    }

    fn qlora_input_grad(
        dy: FloatTensor<Self>,
        weight: QuantizedPrimitive<Self>,
    ) -> FloatTensor<Self> {
        let f32 = dy.dtype() == DType::F32;
        match f32.then(|| qlora::dequantize_nk(&weight)).flatten() {
            // `[m, n]·[n, k]`: the stored order is the transpose the gradient needs.
            Some(deq) => Self::matmul(dy, deq, Transpose::Neither),
            None => plain::qlora_input_grad::<Self>(dy, weight),
        }
    }

    fn rms_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [Some(xc), Some(g)] = [&x, &gamma].map(contiguous_f32) else {
            return plain::rms_norm_forward::<Self>(x, gamma, eps);
        };
        let [rows, d] = dims::<2>(&xc);
        let (y, rstd) = rms_norm::forward(values(&xc), values(&g), eps);
        (tensor(y, [rows, d]), tensor(rstd, [rows]))
    }

    fn rms_norm_input_grad(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let [Some(d), Some(xc), Some(g), Some(r)] = [&dy, &x, &gamma, &rstd].map(contiguous_f32)
        else {
            return plain::rms_norm_input_grad::<Self>(dy, x, gamma, rstd);
        };
        let shape = dims::<2>(&xc);
        let dx = rms_norm::input_grad(values(&d), values(&xc), values(&g), values(&r));
        tensor(dx, shape)
    }

    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (Some(xc), Some(g), Some(b)) = (
            contiguous_f32(&x),
            contiguous_f32(&gamma),
            contiguous_f32(&beta),
        ) else {
            return plain::layer_norm_forward::<Self>(x, gamma, beta, eps);
        };
        let [rows, d] = dims::<2>(&xc);
        let (y, mean, rstd) = layer_norm::forward(values(&xc), values(&g), values(&b), eps);
        (
            tensor(y, [rows, d]),
            tensor(mean, [rows]),
            tensor(rstd, [rows]),
        )
    }

    fn layer_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let inputs = [&dy, &x, &gamma, &mean, &rstd].map(contiguous_f32);
        let [Some(dyc), Some(xc), Some(g), Some(m), Some(r)] = inputs else {
            return plain::layer_norm_backward::<Self>(dy, x, gamma, mean, rstd);
        };
        let [rows, d] = dims::<2>(&xc);
        let (dx, dg, db) = layer_norm::backward(
            values(&dyc),
            values(&xc),
            values(&g),
            values(&m),
            values(&r),
        );
        (tensor(dx, [rows, d]), tensor(dg, [d]), tensor(db, [d]))
    }

    fn causal_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        heads: usize,
        starts: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [Some(qc), Some(kc), Some(vc)] = [&q, &k, &v].map(contiguous_f32) else {
            return plain::causal_attention_forward::<Self>(q, k, v, heads, starts);
        };
        let shape = attention_dims(&qc, &kc, heads);
        let Some((shape, first)) = shape.and_then(|d| Some((d, first_keys(starts.as_ref(), d)?)))
        else {
            return plain::causal_attention_forward::<Self>(q, k, v, heads, starts);
        };
        let (out, lse) = attention::forward(
            values(&qc),
            values(&kc),
            values(&vc),
            first.as_deref(),
            shape,
        );
        let (batch, q_len) = (shape.batch, shape.q_len);
        (
            tensor(out, [batch, q_len, heads * shape.d_head]),
            tensor(lse, [batch, heads, q_len]),
        )
    }

    fn causal_attention_backward(
        dout: FloatTensor<Self>,
        qkv: [FloatTensor<Self>; 3],
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        heads: usize,
        starts: Option<IntTensor<Self>>,
    ) -> [FloatTensor<Self>; 3] {
        let [q, k, v] = &qkv;
        let inputs = [&dout, q, k, v, &out, &lse].map(contiguous_f32);
        let [
            Some(dout_c),
            Some(qc),
            Some(kc),
            Some(vc),
            Some(out_c),
            Some(lse_c),
        ] = inputs
        else {
            return plain::causal_attention_backward::<Self>(dout, qkv, out, lse, heads, starts);
        };
        let shape = attention_dims(&qc, &kc, heads);
        let Some((shape, first)) = shape.and_then(|d| Some((d, first_keys(starts.as_ref(), d)?)))
        else {
            return plain::causal_attention_backward::<Self>(dout, qkv, out, lse, heads, starts);
        };
        let saved = attention::Saved {
            q: values(&qc),
            k: values(&kc),
            v: values(&vc),
            out: values(&out_c),
            lse: values(&lse_c),
            dout: values(&dout_c),
            starts: first.as_deref(),
        };
        let (dq, dk, dv) = attention::backward(&saved, shape);
        let (d_model, kv_model) = (heads * shape.d_head, shape.kv_heads * shape.d_head);
        [
            tensor(dq, [shape.batch, shape.q_len, d_model]),
            tensor(dk, [shape.batch, shape.kv_len, kv_model]),
            tensor(dv, [shape.batch, shape.kv_len, kv_model]),
        ]
    }

    fn swiglu_forward(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let [Some(g), Some(u)] = [&gate, &up].map(contiguous_f32) else {
            return plain::swiglu_forward::<Self>(gate, up);
        };
        let len = g.layout().shape().num_elements();
        tensor(swiglu::forward(values(&g), values(&u)), [len])
    }

    fn swiglu_backward(
        dy: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [Some(d), Some(g), Some(u)] = [&dy, &gate, &up].map(contiguous_f32) else {
            return plain::swiglu_backward::<Self>(dy, gate, up);
        };
        let len = g.layout().shape().num_elements();
        let (dg, du) = swiglu::backward(values(&d), values(&g), values(&u));
        (tensor(dg, [len]), tensor(du, [len]))
    }

    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let [Some(xc), Some(cc), Some(sc)] = [&x, &cos, &sin].map(contiguous_f32) else {
            return plain::rope::<Self>(x, cos, sin);
        };
        let shape = dims::<4>(&xc);
        let [_, seq, heads, d] = shape;
        let y = rope::forward(values(&xc), values(&cc), values(&sc), [seq, heads, d]);
        tensor(y, shape)
    }

    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let Some(lc) = contiguous_f32(&logits) else {
            return plain::cross_entropy_forward::<Self>(logits, targets);
        };
        let [rows, classes] = dims::<2>(&lc);
        let Some(t) = class_indices(&targets, classes) else {
            return plain::cross_entropy_forward::<Self>(logits, targets);
        };
        let (loss, lse) = cross_entropy::forward(values(&lc), &t, classes);
        (tensor(loss, [rows]), tensor(lse, [rows]))
    }

    fn cross_entropy_backward(
        dloss: FloatTensor<Self>,
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let [Some(dc), Some(lc), Some(sc)] = [&dloss, &logits, &lse].map(contiguous_f32) else {
            return plain::cross_entropy_backward::<Self>(dloss, logits, targets, lse);
        };
        let [rows, classes] = dims::<2>(&lc);
        let Some(t) = class_indices(&targets, classes) else {
            return plain::cross_entropy_backward::<Self>(dloss, logits, targets, lse);
        };
        let dlogits = cross_entropy::backward(values(&dc), values(&lc), &t, values(&sc), classes);
        tensor(dlogits, [rows, classes])
    }
}
