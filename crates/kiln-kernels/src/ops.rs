//! The kernels as `Tensor` functions of any rank, with their inputs checked.
//!
//! Leading dimensions are flattened into rows before the backend sees them, so every
//! implementation works on plain matrices.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Shape, Tensor};
use thiserror::Error;

use crate::backend::{KernelBackend, unwrap, wrap};
use crate::quant::QuantizedWeight;
use crate::{AdamWStep, Epilogue, FlatLayout};

/// Inputs a kernel cannot take, with what was expected.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KernelError {
    /// Two sizes that must agree do not.
    #[error("{op}: {what} is {got} but must be {expected}")]
    Mismatch {
        /// The operation.
        op: &'static str,
        /// Which size.
        what: &'static str,
        /// The size it must have.
        expected: usize,
        /// The size it has.
        got: usize,
    },
    /// Two shapes that must be equal are not.
    #[error(
        "{op}: {left} has shape {left_shape:?} but {right} has {right_shape:?}; they must be equal"
    )]
    Shapes {
        /// The operation.
        op: &'static str,
        /// The first tensor.
        left: &'static str,
        /// Its shape.
        left_shape: Vec<usize>,
        /// The second tensor.
        right: &'static str,
        /// Its shape.
        right_shape: Vec<usize>,
    },
    /// More queries than keys: the queries must be the last positions of the keys'.
    #[error(
        "causal_attention: {q_len} queries over {kv_len} keys; queries must be the last of the \
         keys' positions (q_len ≤ kv_len)"
    )]
    MoreQueries {
        /// Query positions.
        q_len: usize,
        /// Key positions.
        kv_len: usize,
    },
    /// The heads do not split the model width.
    #[error("causal_attention: {heads} heads do not divide d_model = {d_model}; pick a divisor")]
    Heads {
        /// The last dimension of q, k and v.
        d_model: usize,
        /// The heads asked for.
        heads: usize,
    },
    /// A rotary table has neither a row per position nor a row per token.
    #[error(
        "rope: {table} has {rows} rows; it needs one per position ({seq}) or one per token \
         ({batch} × {seq}), and cos and sin alike"
    )]
    RopeRows {
        /// Which table.
        table: &'static str,
        /// Its rows.
        rows: usize,
        /// The positions of a sequence.
        seq: usize,
        /// The sequences.
        batch: usize,
    },
    /// Rotary embeddings rotate pairs of a head's halves: its width must be even.
    #[error("rope: a head of width {width} has no halves to rotate; the width must be even")]
    OddWidth {
        /// The last dimension of the input.
        width: usize,
    },
    /// The keys' and values' width is not a whole number of heads that the query heads share
    /// evenly (grouped-query attention).
    #[error(
        "causal_attention: keys and values {kv_width} wide do not hold a number of heads of \
         {d_head} that divides the {heads} query heads; use kv_heads · {d_head} with kv_heads \
         dividing {heads}"
    )]
    KvHeads {
        /// The last dimension of k and v.
        kv_width: usize,
        /// The query heads.
        heads: usize,
        /// The width of a head.
        d_head: usize,
    },
}

fn check(
    op: &'static str,
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), KernelError> {
    if expected == got {
        Ok(())
    } else {
        Err(KernelError::Mismatch {
            op,
            what,
            expected,
            got,
        })
    }
}

fn rows<B: Backend, const D: usize>(x: Tensor<B, D>) -> (Tensor<B, 2>, Shape) {
    let shape = x.shape();
    let last = shape.dims::<D>()[D - 1];
    (x.reshape([shape.num_elements() / last.max(1), last]), shape)
}

fn with_last<const D: usize>(shape: &Shape, last: usize) -> [usize; D] {
    let mut dims = shape.dims::<D>();
    dims[D - 1] = last;
    dims
}

/// `x·w (+ b)` over rows: `x [.., k]`, `w [k, n]`, `b [n]` → `[.., n]`, the function of Burn's
/// `Linear` (whose weight is `[k, n]`). Its backward sums the bias's gradient down the rows on
/// many cubes (Burn's `sum_dim` gives each column one unit on the CubeCL backends).
///
/// # Errors
/// [`KernelError`] when the shapes do not agree.
pub fn linear<B: KernelBackend, const D: usize>(
    x: Tensor<B, D>,
    w: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
) -> Result<Tensor<B, D>, KernelError> {
    linear_with(x, w, b, Epilogue::None)
}

/// `r + x·w (+ b)`: [`linear`] with a residual `r [.., n]` added in the same pass over the
/// output, as a transformer block adds its output projections to the residual stream (on a
/// GPU one launch after the matmul where the bias and the residual took one each). The
/// residual's gradient is the output's.
///
/// # Errors
/// [`KernelError`] when the shapes do not agree.
pub fn linear_residual<B: KernelBackend, const D: usize>(
    x: Tensor<B, D>,
    w: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
    r: Tensor<B, D>,
) -> Result<Tensor<B, D>, KernelError> {
    linear_with(x, w, b, Epilogue::Residual(r))
}

/// `y + t·(scale·b)`: a low-rank adapter's term `t [.., r]·b [r, n]` added to its base's
/// output `y [.., n]` in the adapter product's own pass ([`linear_residual`]), the scale on the
/// `[r, n]` factor rather than on the `[.., n]` product, and no multiply at all for a scale of
/// 1 (PEFT's default `alpha = rank`). PEFT's `y + (t·b)·scale` took two more passes over the
/// output forward and one backward; the two agree to the bit for a power-of-two scale.
///
/// # Errors
/// [`KernelError`] when the shapes do not agree.
pub fn add_low_rank<B: KernelBackend, const D: usize>(
    y: Tensor<B, D>,
    t: Tensor<B, D>,
    b: Tensor<B, 2>,
    scale: f32,
) -> Result<Tensor<B, D>, KernelError> {
    let b = if scale == 1.0 { b } else { b.mul_scalar(scale) };
    linear_residual(t, b, None, y)
}

/// `relu(x·w (+ b))`: [`linear`] with ReLU applied in the same pass over the output (a
/// feed-forward's first layer). Its backward is [`relu`]'s, then [`linear`]'s.
///
/// # Errors
/// [`KernelError`] when the shapes do not agree.
pub fn linear_relu<B: KernelBackend, const D: usize>(
    x: Tensor<B, D>,
    w: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
) -> Result<Tensor<B, D>, KernelError> {
    linear_with(x, w, b, Epilogue::Relu)
}

fn linear_with<B: KernelBackend, const D: usize>(
    x: Tensor<B, D>,
    w: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
    epilogue: Epilogue<Tensor<B, D>>,
) -> Result<Tensor<B, D>, KernelError> {
    const OP: &str = "linear";
    let (x, shape) = rows(x);
    let [k, n] = w.dims();
    check(
        OP,
        "the input's last dimension (the weight's rows)",
        k,
        x.dims()[1],
    )?;
    if let Some(b) = &b {
        check(
            OP,
            "the bias's length (the weight's columns)",
            n,
            b.dims()[0],
        )?;
    }
    let out = with_last::<D>(&shape, n);
    if let Some(r) = epilogue.residual()
        && r.dims() != out
    {
        return Err(KernelError::Shapes {
            op: OP,
            left: "the residual",
            left_shape: r.dims().to_vec(),
            right: "the output",
            right_shape: out.to_vec(),
        });
    }
    let epilogue = epilogue.map(|r| unwrap(rows(r).0));
    let y = wrap::<B, 2>(B::linear_forward(
        unwrap(x),
        unwrap(w),
        b.map(unwrap),
        epilogue,
    ));
    Ok(y.reshape(out))
}

/// `x·deq(W) + scale·t·B` where `t = x'·A` for the adapter input `x'` (`x`, or a dropout of
/// it): the QLoRA matmul with its low-rank term fused into the kernel's epilogue.
///
/// `x: [.., k]`, `t: [.., r]` with the same leading dimensions, `b: [r, n]` → `[.., n]`.
/// Gradients flow to `x`, `t` (hence to `A`) and `b`; the weight gets none.
pub fn qlora_matmul<B: KernelBackend, const D: usize>(
    x: Tensor<B, D>,
    weight: &QuantizedWeight<B>,
    t: Tensor<B, D>,
    b: Tensor<B, 2>,
    scale: f32,
) -> Result<Tensor<B, D>, KernelError> {
    const OP: &str = "qlora_matmul";
    let (x, shape) = rows(x);
    let (t, t_shape) = rows(t);
    check(OP, "the input's last dimension (k)", weight.k, x.dims()[1])?;
    check(OP, "the rows of t", x.dims()[0], t.dims()[0])?;
    let [r, n] = b.dims();
    check(
        OP,
        "t's last dimension (the rank)",
        r,
        t_shape.dims::<D>()[D - 1],
    )?;
    check(OP, "B's columns", weight.n, n)?;
    let y = B::qlora_forward(unwrap(x), weight.primitive(), unwrap(t), unwrap(b), scale);
    Ok(wrap::<B, 2>(y).reshape(with_last::<D>(&shape, n)))
}

/// `x·deq(W)`, the 4-bit matmul alone (a row-parallel shard's partial product, whose adapter
/// term is added after the shards' sum): [`qlora_matmul`] with an adapter of rank 1 and scale
/// 0, which the kernel adds as exact zeros.
pub fn quantized_matmul<B: KernelBackend, const D: usize>(
    x: Tensor<B, D>,
    weight: &QuantizedWeight<B>,
) -> Result<Tensor<B, D>, KernelError> {
    let mut t_dims = x.dims();
    t_dims[D - 1] = 1;
    let device = x.device();
    let t = Tensor::zeros(t_dims, &device);
    let b = Tensor::zeros([1, weight.n], &device);
    qlora_matmul(x, weight, t, b, 0.0)
}

/// RMSNorm over the last dimension: `x / √(mean(x²) + eps) · gamma`.
pub fn rms_norm<B: KernelBackend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    eps: f32,
) -> Result<Tensor<B, D>, KernelError> {
    let (x, shape) = rows(x);
    check("rms_norm", "gamma's length", x.dims()[1], gamma.dims()[0])?;
    let (y, _) = B::rms_norm_forward(unwrap(x), unwrap(gamma), eps);
    Ok(wrap::<B, 2>(y).reshape(shape))
}

/// LayerNorm over the last dimension, as Burn's `LayerNorm`:
/// `(x − mean) / √(var + eps) · gamma + beta` with the biased variance.
pub fn layer_norm<B: KernelBackend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Tensor<B, 1>,
    eps: f32,
) -> Result<Tensor<B, D>, KernelError> {
    const OP: &str = "layer_norm";
    let (x, shape) = rows(x);
    check(OP, "gamma's length", x.dims()[1], gamma.dims()[0])?;
    check(OP, "beta's length", x.dims()[1], beta.dims()[0])?;
    let (y, _, _) = B::layer_norm_forward(unwrap(x), unwrap(gamma), unwrap(beta), eps);
    Ok(wrap::<B, 2>(y).reshape(shape))
}

/// Causal multi-head attention of projected queries `q [batch, q_len, d_model]` over keys
/// and values `k`, `v [batch, kv_len, kv_heads·d_head]`, the heads side by side in the last
/// dimension (a linear layer's output as it is): `softmax(q·kᵀ/√d_head + causal mask)·v` per
/// head, merged back to `[batch, q_len, d_model]`, with `d_head = d_model / heads`.
///
/// Keys and values may have fewer heads than the queries (grouped-query attention, as LLaMA
/// and Qwen use): query head `h` reads key and value head `h / (heads / kv_heads)`, as
/// transformers' `repeat_kv` lays them out. The CubeCL kernels read the shared head in place
/// and sum its gradient over its group in the same launch; the repeated keys are never
/// written.
///
/// The queries are the last `q_len` of the `kv_len` positions: query `i` attends to keys
/// `0..=i + kv_len − q_len`. Self-attention has `q_len = kv_len`; a decoder that appends
/// one token to cached keys and values has `q_len = 1`.
///
/// # Errors
/// [`KernelError`] when the shapes do not agree or the heads do not split the widths.
pub fn causal_attention<B: KernelBackend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    heads: usize,
) -> Result<Tensor<B, 3>, KernelError> {
    check_attention(&q, &k, &v, heads)?;
    let (out, _) = B::causal_attention_forward(unwrap(q), unwrap(k), unwrap(v), heads, None);
    Ok(wrap(out))
}

/// [`causal_attention`] with a first key per query: `starts [batch, q_len]`, so that query `i`
/// sees keys `starts[i] ..= i + kv_len − q_len`. Packed sequences (several examples side by
/// side in one row, none attending to another) start each query at its example's first
/// position: a block-diagonal causal mask, as FlashAttention's variable-length kernels and
/// transformers' packed position ids give. A sliding window of `w` starts it at `p + 1 − w`:
/// a banded one. Starts must not decrease along a sequence; one past the query's own position
/// counts as that position.
///
/// # Errors
/// As [`causal_attention`], and [`KernelError::Mismatch`] when `starts` is not
/// `[batch, q_len]`.
pub fn packed_causal_attention<B: KernelBackend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    heads: usize,
    starts: Tensor<B, 2, Int>,
) -> Result<Tensor<B, 3>, KernelError> {
    check_attention(&q, &k, &v, heads)?;
    let ([batch, q_len, _], [rows, cols]) = (q.dims(), starts.dims());
    check(
        "packed_causal_attention",
        "starts' rows (one per sequence)",
        batch,
        rows,
    )?;
    check(
        "packed_causal_attention",
        "starts' columns (one per query)",
        q_len,
        cols,
    )?;
    let starts = starts.into_primitive();
    let (out, _) =
        B::causal_attention_forward(unwrap(q), unwrap(k), unwrap(v), heads, Some(starts));
    Ok(wrap(out))
}

/// The shapes [`causal_attention`] takes.
fn check_attention<B: Backend>(
    q: &Tensor<B, 3>,
    k: &Tensor<B, 3>,
    v: &Tensor<B, 3>,
    heads: usize,
) -> Result<(), KernelError> {
    const OP: &str = "causal_attention";
    if v.shape() != k.shape() {
        return Err(KernelError::Shapes {
            op: OP,
            left: "k",
            left_shape: k.shape().to_vec(),
            right: "v",
            right_shape: v.shape().to_vec(),
        });
    }
    let ([batch, q_len, d_model], [kv_batch, kv_len, kv_width]) = (q.dims(), k.dims());
    check(OP, "k's batch", batch, kv_batch)?;
    if q_len > kv_len {
        return Err(KernelError::MoreQueries { q_len, kv_len });
    }
    if heads == 0 || !d_model.is_multiple_of(heads) {
        return Err(KernelError::Heads { d_model, heads });
    }
    let d_head = d_model / heads;
    let whole = kv_width > 0 && kv_width.is_multiple_of(d_head);
    if !whole || !heads.is_multiple_of(kv_width / d_head) {
        return Err(KernelError::KvHeads {
            kv_width,
            heads,
            d_head,
        });
    }
    Ok(())
}

/// Rotary position embeddings of `x [batch, seq, heads, d]` (Hugging Face's half-split
/// layout) by the tables of its positions, `cos` and `sin` `[seq, d]` (every sequence at
/// positions `0..seq`) or `[batch·seq, d]` (a row per token: packed sequences, whose positions
/// restart with each example), with the sign of `rotate_half` in `sin`: `[−sin θ, +sin θ]`
/// over the two halves. The result is `x·cos + rotate_half(x)·sin θ`, bit for bit as
/// transformers computes it.
///
/// One op, so that its backward is the same rotation by `−sin` (no scatter of a `select`'s or
/// a `cat`'s gradient), and the CPU runs it as one pass over contiguous rows where Burn's
/// broadcast of the tables over the heads takes a strided path. On the CubeCL backends it is
/// Burn's element-wise ops, which fusion fuses.
///
/// # Errors
/// [`KernelError`] when the tables are neither `[seq, d]` nor `[batch·seq, d]`, or `d` is odd.
pub fn rope<B: KernelBackend>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
) -> Result<Tensor<B, 4>, KernelError> {
    const OP: &str = "rope";
    let [batch, seq, _, width] = x.dims();
    if width % 2 == 1 {
        return Err(KernelError::OddWidth { width });
    }
    let tables = [
        ("cos", "cos's width (the head's)", &cos),
        ("sin", "sin's width (the head's)", &sin),
    ];
    let rows = cos.dims()[0];
    for (table_is, width_is, table) in tables {
        let [got, cols] = table.dims();
        if got != rows || (rows != seq && rows != batch * seq) {
            return Err(KernelError::RopeRows {
                table: table_is,
                rows: got,
                seq,
                batch,
            });
        }
        check(OP, width_is, width, cols)?;
    }
    Ok(wrap(B::rope(unwrap(x), unwrap(cos), unwrap(sin))))
}

/// SwiGLU gating, `silu(gate) · up`, element-wise over equal shapes.
pub fn swiglu<B: KernelBackend, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> Result<Tensor<B, D>, KernelError> {
    let shape = gate.shape();
    if shape != up.shape() {
        return Err(KernelError::Shapes {
            op: "swiglu",
            left: "gate",
            left_shape: shape.to_vec(),
            right: "up",
            right_shape: up.shape().to_vec(),
        });
    }
    let len = shape.num_elements();
    let y = B::swiglu_forward(unwrap(gate.reshape([len])), unwrap(up.reshape([len])));
    Ok(wrap::<B, 1>(y).reshape(shape))
}

/// `Σ_r x[r, c]`: the column sums of `x [rows, cols]`, `[cols]`, in `x`'s dtype. On a GPU a
/// large sum runs on many cubes in a fixed order, where Burn's `sum_dim` gives each output one
/// unit without autotune; `x` is read as it lies, so the row sums of `t` are
/// `column_sum(t.transpose())` at no copy. Differentiable.
pub fn column_sum<B: KernelBackend>(x: Tensor<B, 2>) -> Tensor<B, 1> {
    wrap(B::column_sum(unwrap(x)))
}

/// `v [cols]` repeated as `rows` rows: `[rows, cols]`, a view where the backend has one.
/// Adding it to a `[rows, cols]` tensor is Burn's broadcast add, but its backward sums the
/// gradient with [`column_sum`] (over the whole GPU) instead of Burn's `sum_dim`.
pub fn broadcast_rows<B: KernelBackend>(v: Tensor<B, 1>, rows: usize) -> Tensor<B, 2> {
    wrap(B::broadcast_rows(unwrap(v), rows))
}

/// The mean of every value of `x`, `[1]`: on a GPU summed over many cubes in a fixed order
/// (Burn's `mean` runs one unit on one cube without autotune), and its gradient one broadcast
/// scalar that the next kernel reads in place.
pub fn mean<B: KernelBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, 1> {
    let n = x.shape().num_elements();
    wrap(B::mean(unwrap(x.reshape([n]))))
}

/// ReLU, `max(x, 0)`, element-wise: one launch each way on a GPU, where Burn's is a compare
/// and a masked fill forward and again backward.
pub fn relu<B: KernelBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let shape = x.shape();
    let len = shape.num_elements();
    wrap::<B, 1>(B::relu_forward(unwrap(x.reshape([len])))).reshape(shape)
}

/// Softmax cross-entropy per row of `logits: [rows, classes]` against class indices
/// `targets: [rows]` (each in `0..classes`): `[rows]` losses in f32 whatever the logits' dtype,
/// for the caller to reduce. bf16 or f16 logits go in as they are: the kernel computes in f32,
/// and their gradient comes back in their dtype, so a half-precision model casts neither its
/// `[rows, classes]` logits nor their gradient. The backward recomputes the softmax from a
/// saved log-sum-exp per row instead of keeping the `[rows, classes]` probabilities.
pub fn cross_entropy<B: KernelBackend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Result<Tensor<B, 1>, KernelError> {
    check(
        "cross_entropy",
        "the number of targets",
        logits.dims()[0],
        targets.dims()[0],
    )?;
    let (loss, _) = B::cross_entropy_forward(unwrap(logits), targets.into_primitive());
    Ok(wrap(loss))
}

/// A parameter and its two AdamW moments: `(param, m, v)`.
pub type ParamAndMoments<B, const D: usize> = (Tensor<B, D>, Tensor<B, D>, Tensor<B, D>);

/// One fused AdamW step (Burn's `AdamW` formula): `(param, m, v)` after the step.
pub fn adamw_step<B: KernelBackend, const D: usize>(
    param: Tensor<B, D>,
    grad: Tensor<B, D>,
    m: Tensor<B, D>,
    v: Tensor<B, D>,
    step: &AdamWStep,
) -> Result<ParamAndMoments<B, D>, KernelError> {
    let shape = param.shape();
    for (name, other) in [("grad", grad.shape()), ("m", m.shape()), ("v", v.shape())] {
        if other != shape {
            return Err(KernelError::Shapes {
                op: "adamw_step",
                left: "param",
                left_shape: shape.to_vec(),
                right: name,
                right_shape: other.to_vec(),
            });
        }
    }
    let len = shape.num_elements();
    let flat = |t: Tensor<B, D>| unwrap(t.reshape([len]));
    let (p, m, v) = B::adamw_step(flat(param), flat(grad), flat(m), flat(v), step);
    let back = |t| wrap::<B, 1>(t).reshape(shape.clone());
    Ok((back(p), back(m), back(v)))
}

/// The updated parameters and moments of [`adamw_many`], flat.
pub type FlatParamAndMoments<B> = (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>);

/// One AdamW step of every `params[i]` with `grads[i]` at once (flat tensors; gradients of
/// any float dtype, multiplied by `grad_scale`), whose moments lie in the flat `m` and `v` at
/// `layout`'s segments: the updated parameters, first and second moments, flat in `layout`.
/// One kernel launch on the CubeCL backends (or a few: see `cube::adamw_many`).
///
/// # Errors
/// [`KernelError`] when the tensors do not fit `layout`.
pub fn adamw_many<B: KernelBackend>(
    params: Vec<Tensor<B, 1>>,
    grads: Vec<Tensor<B, 1>>,
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
    layout: &FlatLayout,
    step: &AdamWStep,
    grad_scale: f32,
) -> Result<FlatParamAndMoments<B>, KernelError> {
    check_many(&params, &grads, &m, &v, layout)?;
    let (p, m, v) = B::adamw_many(
        params.into_iter().map(unwrap).collect(),
        grads.into_iter().map(unwrap).collect(),
        unwrap(m),
        unwrap(v),
        layout,
        step,
        grad_scale,
    );
    Ok((wrap(p), wrap(m), wrap(v)))
}

/// The sizes `adamw_many` needs to agree with `layout`.
fn check_many<B: Backend>(
    params: &[Tensor<B, 1>],
    grads: &[Tensor<B, 1>],
    m: &Tensor<B, 1>,
    v: &Tensor<B, 1>,
    layout: &FlatLayout,
) -> Result<(), KernelError> {
    const OP: &str = "adamw_many";
    check(OP, "the number of parameters", layout.len(), params.len())?;
    check(OP, "the number of gradients", layout.len(), grads.len())?;
    for ((param, grad), &len) in params.iter().zip(grads).zip(layout.lens()) {
        check(OP, "a parameter's length", len, param.dims()[0])?;
        check(OP, "a gradient's length", len, grad.dims()[0])?;
    }
    check(OP, "m's length", layout.total(), m.dims()[0])?;
    check(OP, "v's length", layout.total(), v.dims()[0])
}

/// The segments of `flat` that `layout` lays out, `[len_i]` each: views of the buffer, never
/// copies, on every backend of Kiln's (see [`KernelBackend::flat_segments`]).
pub fn flat_segments<B: KernelBackend>(
    flat: Tensor<B, 1>,
    layout: &FlatLayout,
) -> Vec<Tensor<B, 1>> {
    B::flat_segments(unwrap(flat), layout)
        .into_iter()
        .map(wrap)
        .collect()
}

/// `[params, m, v, copy]`: [`adamw_many`] of parameters that lie flat in `layout` (the
/// previous step's output), and the stepped parameters also in `copy`'s dtype, laid out by
/// `copy`'s layout, written in the same pass on the GPU backends.
///
/// # Errors
/// As [`adamw_many`], and when the flat parameters or the copy's layout do not fit `layout`.
#[allow(clippy::too_many_arguments)]
pub fn adamw_many_copy<B: KernelBackend>(
    params: Tensor<B, 1>,
    grads: Vec<Tensor<B, 1>>,
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
    layout: &FlatLayout,
    step: &AdamWStep,
    grad_scale: f32,
    copy: (&FlatLayout, burn::tensor::FloatDType),
) -> Result<[Tensor<B, 1>; 4], KernelError> {
    const OP: &str = "adamw_many_copy";
    check(
        OP,
        "the flat parameters' length",
        layout.total(),
        params.dims()[0],
    )?;
    check(OP, "the copy's segments", layout.len(), copy.0.len())?;
    check(OP, "the number of gradients", layout.len(), grads.len())?;
    for (grad, &len) in grads.iter().zip(layout.lens()) {
        check(OP, "a gradient's length", len, grad.dims()[0])?;
    }
    check(OP, "m's length", layout.total(), m.dims()[0])?;
    check(OP, "v's length", layout.total(), v.dims()[0])?;
    Ok(B::adamw_many_copy(
        unwrap(params),
        grads.into_iter().map(unwrap).collect(),
        unwrap(m),
        unwrap(v),
        layout,
        step,
        grad_scale,
        copy,
    )
    .map(wrap))
}

/// Whether `a` and `b` are one tensor, where the backend can tell (see
/// [`KernelBackend::same_tensor`]).
pub fn same_tensor<B: KernelBackend, const D: usize>(a: &Tensor<B, D>, b: &Tensor<B, D>) -> bool {
    B::same_tensor(
        &a.clone().into_primitive().tensor(),
        &b.clone().into_primitive().tensor(),
    )
}

/// `tensors` (any shapes, float) cast to `dtype` in one pass: each result is a view of one
/// flat buffer.
/// Mixed precision casts every parameter this way, and every gradient back.
pub fn cast_many<B: KernelBackend, const D: usize>(
    tensors: Vec<Tensor<B, D>>,
    dtype: burn::tensor::FloatDType,
    device: &B::Device,
) -> Vec<Tensor<B, D>> {
    let shapes: Vec<Shape> = tensors.iter().map(Tensor::shape).collect();
    let layout = FlatLayout::new(
        shapes.iter().map(Shape::num_elements).collect(),
        B::flat_alignment(device, dtype.into()),
    );
    let flat = wrap::<B, 1>(B::cast_many(
        tensors
            .into_iter()
            .zip(&shapes)
            .map(|(t, s)| unwrap(t.reshape([s.num_elements()])))
            .collect(),
        &layout,
        dtype,
        device,
    ));
    flat_segments(flat, &layout)
        .into_iter()
        .zip(shapes)
        .map(|(segment, shape)| segment.reshape(shape))
        .collect()
}

/// The global squared L2 norm of a set of tensors and how many of their values are NaN or
/// infinite, in one pass over them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormReport {
    /// `Σ x²` over every finite value (f32 accumulation).
    pub sq_norm: f32,
    /// Values that are NaN or ±∞.
    pub non_finite: u64,
}

impl NormReport {
    /// The L2 norm of the finite values.
    pub fn norm(&self) -> f32 {
        self.sq_norm.sqrt()
    }
}

/// [`NormReport`] over `tensors` (flattened; any number, any sizes), read back to the host.
pub fn grad_norm<B: KernelBackend>(tensors: Vec<Tensor<B, 1>>, device: &B::Device) -> NormReport {
    let out = wrap::<B, 1>(B::grad_sq_norm(
        tensors.into_iter().map(unwrap).collect(),
        device,
    ));
    let values = out
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 data after convert");
    NormReport {
        sq_norm: values[0],
        non_finite: values[1] as u64,
    }
}
