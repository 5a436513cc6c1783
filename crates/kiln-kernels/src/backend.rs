//! The backend extension: what a backend must provide for Kiln's kernels, with the plain-Burn
//! reference as the default so that every backend has them.
//!
//! Methods work on primitives of fixed rank (matrices and vectors); [`crate::ops`] wraps them
//! in `Tensor` functions of any rank. The CubeCL backends override every method with a kernel
//! ([`crate::cube`]), `Autodiff<B>` overrides them with a backward ([`crate::autodiff`]), and
//! other backends keep these defaults.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Shape, Tensor, TensorMetadata, TensorPrimitive};

use crate::product::{Product, Transpose};
use crate::quant::QuantizedPrimitive;
use crate::reference;
use crate::{AdamWStep, Epilogue, FlatLayout};

/// A primitive as a `Tensor` of rank `D`.
pub(crate) fn wrap<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// A `Tensor`'s float primitive.
pub(crate) fn unwrap<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// `lhs` and `rhs` as the views `lhs·rhs` multiplies: the operand `transpose` names swapped.
pub(crate) fn transposed<B: Backend>(
    lhs: FloatTensor<B>,
    rhs: FloatTensor<B>,
    transpose: Transpose,
) -> (FloatTensor<B>, FloatTensor<B>) {
    match transpose {
        Transpose::Neither => (lhs, rhs),
        Transpose::Lhs => (B::float_transpose(lhs), rhs),
        Transpose::Rhs => (lhs, B::float_transpose(rhs)),
    }
}

/// A Burn backend with Kiln's fused kernels. Shapes in the docs are the primitives' shapes.
pub trait KernelBackend: Backend {
    /// `t` as a dense row-major tensor: itself when it already is one, a copy otherwise.
    ///
    /// For tensors that kernels read on every call, such as the codes and scales of a frozen
    /// 4-bit weight: stored dense, they are never copied again. CubeCL's CUDA runtime pitches
    /// the rows of every tensor it creates, those made from host data included (a `[33, 18]`
    /// f32 tensor gets strides `[32, 1]`); Burn's CPU backends never pad rows, hence the default.
    fn dense_float(t: FloatTensor<Self>) -> FloatTensor<Self> {
        t
    }

    /// [`Self::dense_float`] for an integer tensor.
    fn dense_int(t: IntTensor<Self>) -> IntTensor<Self> {
        t
    }

    /// `lhs·rhs` → `[m, n]`, the operand `transpose` names multiplied transposed (`lhs` stored
    /// `[k, m]` for [`Transpose::Lhs`], `rhs` stored `[n, k]` for [`Transpose::Rhs`]). The
    /// products of the linear layers' and QLoRA's backward go through it; Burn's matmul unless
    /// a backend has a faster one.
    fn matmul(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        transpose: Transpose,
    ) -> FloatTensor<Self> {
        let (lhs, rhs) = transposed::<Self>(lhs, rhs, transpose);
        Self::float_matmul(lhs, rhs)
    }

    /// Whether this backend runs `product` on `device` with a kernel it chose itself rather
    /// than Burn's matmul: the CubeCL backends' [`crate::cube::tune`] answers, and the fusion
    /// backend then queues the product as a Kiln kernel instead of fusing Burn's. May time
    /// the candidates when it first sees the product.
    fn tuned_matmul(_device: &Self::Device, _product: &Product) -> bool {
        false
    }

    /// `xᵀ·dy`: `x [rows, m]`, `dy [rows, n]` → `[m, n]`, a weight's gradient, whose reduction
    /// runs over the batch's rows. The GPU backends cut a long one into parts that fill the GPU
    /// (`split_k`); elsewhere [`Self::matmul`] with `x` transposed.
    fn weight_grad(x: FloatTensor<Self>, dy: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::matmul(x, dy, Transpose::Lhs)
    }

    /// `epilogue(x·w (+ b))`: `x [rows, k]`, `w [k, n]`, `b [n]`, a residual `[rows, n]` →
    /// `[rows, n]`. Its backward is two matmuls, [`Self::column_sum`] for the bias, the
    /// gradient itself for the residual, and [`Self::relu_backward`] first after a ReLU.
    fn linear_forward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: Option<FloatTensor<Self>>,
        epilogue: Epilogue<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        plain::linear_forward::<Self>(x, w, b, epilogue)
    }

    /// `Σ over the rows of x [rows, cols]`: `[cols]`, a bias's gradient; `x` may be any view
    /// (a transposed one sums the rows of its original). Differentiable: its backward is
    /// [`Self::broadcast_rows`].
    fn column_sum(x: FloatTensor<Self>) -> FloatTensor<Self> {
        unwrap(reference::linear::column_sum(wrap::<Self, 2>(x)))
    }

    /// The mean of every value of `x` (any shape): `[1]`, in `x`'s dtype. Differentiable: its
    /// gradient is one broadcast scalar.
    fn mean(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_mean(x)
    }

    /// `v [cols]` repeated as `rows` rows, `[rows, cols]`: a view where the backend has one
    /// (no copy; element-wise ops read it in place and fusion fuses it). Differentiable: its
    /// backward is [`Self::column_sum`], where Burn's broadcast backward is a one-unit-per-column
    /// `sum_dim`.
    fn broadcast_rows(v: FloatTensor<Self>, rows: usize) -> FloatTensor<Self> {
        let cols = v.shape()[0];
        Self::float_expand(
            Self::float_reshape(v, Shape::new([1, cols])),
            Shape::new([rows, cols]),
        )
    }

    /// `y = x·deq(W) + s·t·B`: `x [m, k]`, `t = x·A [m, r]`, `b [r, n]` → `[m, n]`.
    fn qlora_forward(
        x: FloatTensor<Self>,
        weight: QuantizedPrimitive<Self>,
        t: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        plain::qlora_forward::<Self>(x, weight, t, b, scale)
    }

    /// `dy·deq(W)ᵀ`: `dy [m, n]` → `[m, k]`.
    fn qlora_input_grad(
        dy: FloatTensor<Self>,
        weight: QuantizedPrimitive<Self>,
    ) -> FloatTensor<Self> {
        plain::qlora_input_grad::<Self>(dy, weight)
    }

    /// RMSNorm of `x [rows, d]` with gain `gamma [d]`: `(y [rows, d], rstd [rows])`.
    fn rms_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        plain::rms_norm_forward::<Self>(x, gamma, eps)
    }

    /// RMSNorm's backward: `(dx [rows, d], dgamma [d])`.
    fn rms_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dg) =
            reference::rms_norm::backward(wrap::<Self, 2>(dy), wrap(x), wrap(gamma), wrap(rstd));
        (unwrap(dx), unwrap(dg))
    }

    /// RMSNorm's input gradient alone (`dx [rows, d]`), for a frozen gain: a fine-tuned model's
    /// norms. The CubeCL backends then skip the gain's sum down the rows.
    fn rms_norm_input_grad(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        plain::rms_norm_input_grad::<Self>(dy, x, gamma, rstd)
    }

    /// LayerNorm of `x [rows, d]` with gain `gamma [d]` and shift `beta [d]`:
    /// `(y [rows, d], mean [rows], rstd [rows])`.
    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        plain::layer_norm_forward::<Self>(x, gamma, beta, eps)
    }

    /// LayerNorm's backward: `(dx [rows, d], dgamma [d], dbeta [d])`.
    fn layer_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        plain::layer_norm_backward::<Self>(dy, x, gamma, mean, rstd)
    }

    /// Causal attention of `q [batch, q_len, heads·d_head]` over `k`, `v [batch, kv_len,
    /// heads·d_head]` (`q_len ≤ kv_len`; the queries are the last positions) with `heads`
    /// heads, queries scaled by `d_head^-½`:
    /// `(out [batch, q_len, heads·d_head], lse [batch, heads, q_len])`.
    ///
    /// `starts [batch, q_len]`, when given, is the first key each query sees (the first
    /// position of its example in a packed sequence), so that query `i` sees keys
    /// `starts[i] ..= i + kv_len − q_len`; a start past that last key counts as it. `None`
    /// starts every query at key 0.
    fn causal_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        heads: usize,
        starts: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        plain::causal_attention_forward::<Self>(q, k, v, heads, starts)
    }

    /// Causal attention's backward from the forward's `out` and `lse` (and its `starts`):
    /// `[dq, dk, dv]`.
    fn causal_attention_backward(
        dout: FloatTensor<Self>,
        qkv: [FloatTensor<Self>; 3],
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        heads: usize,
        starts: Option<IntTensor<Self>>,
    ) -> [FloatTensor<Self>; 3] {
        plain::causal_attention_backward::<Self>(dout, qkv, out, lse, heads, starts)
    }

    /// `silu(gate)·up` over two `[len]` tensors.
    fn swiglu_forward(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        plain::swiglu_forward::<Self>(gate, up)
    }

    /// SwiGLU's backward: `(d gate, d up)`.
    fn swiglu_backward(
        dy: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        plain::swiglu_backward::<Self>(dy, gate, up)
    }

    /// Rotary position embeddings of `x [batch, seq, heads, d]` by the tables `cos`, `sin`
    /// `[seq, d]` (`sin` signed `[−sin, +sin]` over the halves): `x·cos + swap(x)·sin`, where
    /// `swap` exchanges the halves of the last dimension ([`reference::rope`]). Its backward is
    /// the same call with `−sin`.
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        plain::rope::<Self>(x, cos, sin)
    }

    /// ReLU over a `[len]` tensor.
    fn relu_forward(x: FloatTensor<Self>) -> FloatTensor<Self> {
        unwrap(reference::relu::forward::<Self, 1>(wrap(x)))
    }

    /// ReLU's backward from its output `y`: `dy` where `y > 0`, else 0.
    fn relu_backward(dy: FloatTensor<Self>, y: FloatTensor<Self>) -> FloatTensor<Self> {
        unwrap(reference::relu::backward::<Self, 1>(wrap(dy), wrap(y)))
    }

    /// Softmax cross-entropy of `logits [rows, classes]` against `targets [rows]`:
    /// `(loss [rows], lse [rows])`, both f32 whatever the logits' dtype (computed in f32, so a
    /// half-precision model's logits need no cast). Targets must lie in `0..classes`.
    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        plain::cross_entropy_forward::<Self>(logits, targets)
    }

    /// Cross-entropy's backward from the saved `lse` (`dloss` and `lse` f32): `dlogits [rows,
    /// classes]` in the logits' dtype.
    fn cross_entropy_backward(
        dloss: FloatTensor<Self>,
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        plain::cross_entropy_backward::<Self>(dloss, logits, targets, lse)
    }

    /// One AdamW step on flat `[len]` tensors: `(param, m, v)`.
    fn adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        step: &AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (p, m, v) =
            reference::adamw::step::<Self, 1>(wrap(param), wrap(grad), wrap(m), wrap(v), step);
        (unwrap(p), unwrap(m), unwrap(v))
    }

    /// One AdamW step of many tensors at once: `params[i]` with `grads[i]` (flat `[len_i]`;
    /// the gradients may be of another float dtype and are multiplied by `grad_scale` first),
    /// whose moments lie in the flat `m` and `v` at `layout`'s segments. Returns the updated
    /// parameters and moments, flat in the same layout (what lies in the padding is unspecified).
    /// Every parameter has the dtype of `m` and `v`.
    #[allow(clippy::too_many_arguments)]
    fn adamw_many(
        params: Vec<FloatTensor<Self>>,
        grads: Vec<FloatTensor<Self>>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        layout: &FlatLayout,
        step: &AdamWStep,
        grad_scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        plain::adamw_many::<Self>(params, grads, m, v, layout, step, grad_scale)
    }

    /// [`Self::adamw_many`] of parameters that lie flat in `layout` (the previous step's
    /// output, which the model's parameters are views of), and the stepped parameters also in
    /// `copy`'s dtype, side by side in a flat buffer laid out by `copy`'s layout:
    /// `[params, m, v, copy]`. Mixed precision's compute-dtype copy for the next step, made in
    /// the step's own pass on the GPU backends (here, a cast after it).
    #[allow(clippy::too_many_arguments)]
    fn adamw_many_copy(
        params: FloatTensor<Self>,
        grads: Vec<FloatTensor<Self>>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        layout: &FlatLayout,
        step: &AdamWStep,
        grad_scale: f32,
        copy: (&FlatLayout, burn::tensor::FloatDType),
    ) -> [FloatTensor<Self>; 4] {
        let device = Self::float_device(&m);
        let params = Self::flat_segments(params, layout);
        let (p, m, v) = Self::adamw_many(params, grads, m, v, layout, step, grad_scale);
        let stepped = Self::flat_segments(p.clone(), layout);
        let low = Self::cast_many(stepped, copy.0, copy.1, &device);
        [p, m, v, low]
    }

    /// `tensors` (flat `[len_i]`) cast to `dtype`, side by side in one flat buffer on `device`
    /// laid out by `layout` (what lies in the padding is unspecified): one pass over all of them.
    fn cast_many(
        tensors: Vec<FloatTensor<Self>>,
        layout: &FlatLayout,
        dtype: burn::tensor::FloatDType,
        device: &Self::Device,
    ) -> FloatTensor<Self> {
        unwrap(reference::cast::cast_many::<Self>(
            tensors.into_iter().map(wrap).collect(),
            layout,
            dtype,
            device,
        ))
    }

    /// Whether `a` and `b` are one tensor (made once, then cloned), where the backend can tell;
    /// `false` where it cannot. A cache keyed by a tensor checks with it that it still holds
    /// what it stored: fusion compares its tensor ids, Flex its buffers, autodiff its inner tensors.
    fn same_tensor(_a: &FloatTensor<Self>, _b: &FloatTensor<Self>) -> bool {
        false
    }

    /// The alignment, in elements of `dtype`, at which a slice of a flat buffer on `device` is
    /// a view rather than a copy: the segments of a [`FlatLayout`] for this backend start at
    /// its multiples.
    fn flat_alignment(_device: &Self::Device, _dtype: burn::tensor::DType) -> usize {
        1
    }

    /// The segments of `flat` that `layout` lays out, as `[len_i]` tensors: views of the
    /// buffer, not copies. Burn's slices copy a segment whose end is not aligned as its start
    /// is (a bias of 5 values, most of an f16 model's norms), one launch each on a GPU; the
    /// CubeCL backends view each segment with its padding instead.
    fn flat_segments(flat: FloatTensor<Self>, layout: &FlatLayout) -> Vec<FloatTensor<Self>> {
        let flat = wrap::<Self, 1>(flat);
        (0..layout.len())
            .map(|i| unwrap(flat.clone().slice(layout.segment(i))))
            .collect()
    }

    /// `[Σ x² over the finite x, number of non-finite x]` (f32, `[2]`) over flat tensors.
    fn grad_sq_norm(tensors: Vec<FloatTensor<Self>>, device: &Self::Device) -> FloatTensor<Self> {
        unwrap(reference::grad_norm::sq_norm(
            tensors.into_iter().map(wrap::<Self, 1>).collect(),
            device,
        ))
    }
}

/// The plain-Burn versions on primitives: the trait's defaults, and what a backend with its
/// own kernels falls back to for inputs they do not take (e.g. a dtype).
pub(crate) mod plain {
    use super::*;

    /// [`KernelBackend::adamw_many`] through the reference's composition of Burn ops.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn adamw_many<B: Backend>(
        params: Vec<FloatTensor<B>>,
        grads: Vec<FloatTensor<B>>,
        m: FloatTensor<B>,
        v: FloatTensor<B>,
        layout: &FlatLayout,
        step: &AdamWStep,
        grad_scale: f32,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        let (p, m, v) = reference::adamw::step_many::<B>(
            params.into_iter().map(wrap).collect(),
            grads.into_iter().map(wrap).collect(),
            wrap(m),
            wrap(v),
            layout,
            step,
            grad_scale,
        );
        (unwrap(p), unwrap(m), unwrap(v))
    }

    pub(crate) fn linear_forward<B: Backend>(
        x: FloatTensor<B>,
        w: FloatTensor<B>,
        b: Option<FloatTensor<B>>,
        epilogue: Epilogue<FloatTensor<B>>,
    ) -> FloatTensor<B> {
        let y = reference::linear::forward(wrap::<B, 2>(x), wrap(w), None);
        unwrap(reference::linear::epilogue(
            y,
            b.map(wrap),
            epilogue.map(wrap),
        ))
    }

    pub(crate) fn qlora_forward<B: Backend>(
        x: FloatTensor<B>,
        weight: QuantizedPrimitive<B>,
        t: FloatTensor<B>,
        b: FloatTensor<B>,
        scale: f32,
    ) -> FloatTensor<B> {
        unwrap(reference::qlora::forward(
            wrap(x),
            &weight,
            wrap(t),
            wrap(b),
            scale,
        ))
    }

    pub(crate) fn qlora_input_grad<B: Backend>(
        dy: FloatTensor<B>,
        weight: QuantizedPrimitive<B>,
    ) -> FloatTensor<B> {
        unwrap(reference::qlora::input_grad(wrap(dy), &weight))
    }

    pub(crate) fn rms_norm_forward<B: Backend>(
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        eps: f32,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let (y, rstd) = reference::rms_norm::forward(wrap::<B, 2>(x), wrap(gamma), eps);
        (unwrap(y), unwrap(rstd))
    }

    pub(crate) fn rms_norm_input_grad<B: Backend>(
        dy: FloatTensor<B>,
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        rstd: FloatTensor<B>,
    ) -> FloatTensor<B> {
        unwrap(reference::rms_norm::input_grad(
            wrap::<B, 2>(dy),
            wrap(x),
            wrap(gamma),
            wrap(rstd),
        ))
    }

    pub(crate) fn swiglu_forward<B: Backend>(
        gate: FloatTensor<B>,
        up: FloatTensor<B>,
    ) -> FloatTensor<B> {
        unwrap(reference::swiglu::forward::<B, 1>(wrap(gate), wrap(up)))
    }

    pub(crate) fn swiglu_backward<B: Backend>(
        dy: FloatTensor<B>,
        gate: FloatTensor<B>,
        up: FloatTensor<B>,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let (dg, du) = reference::swiglu::backward::<B, 1>(wrap(dy), wrap(gate), wrap(up));
        (unwrap(dg), unwrap(du))
    }

    pub(crate) fn rope<B: Backend>(
        x: FloatTensor<B>,
        cos: FloatTensor<B>,
        sin: FloatTensor<B>,
    ) -> FloatTensor<B> {
        unwrap(reference::rope::forward::<B>(wrap(x), wrap(cos), wrap(sin)))
    }

    pub(crate) fn layer_norm_forward<B: Backend>(
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        beta: FloatTensor<B>,
        eps: f32,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        let (y, mean, rstd) =
            reference::layer_norm::forward(wrap::<B, 2>(x), wrap(gamma), wrap(beta), eps);
        (unwrap(y), unwrap(mean), unwrap(rstd))
    }

    pub(crate) fn layer_norm_backward<B: Backend>(
        dy: FloatTensor<B>,
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        mean: FloatTensor<B>,
        rstd: FloatTensor<B>,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        let (dx, dg, db) = reference::layer_norm::backward(
            wrap::<B, 2>(dy),
            wrap(x),
            wrap(gamma),
            wrap(mean),
            wrap(rstd),
        );
        (unwrap(dx), unwrap(dg), unwrap(db))
    }

    pub(crate) fn causal_attention_forward<B: Backend>(
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        heads: usize,
        starts: Option<IntTensor<B>>,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let starts = starts.map(Tensor::<B, 2, Int>::from_primitive);
        let (out, lse) =
            reference::attention::forward(wrap::<B, 3>(q), wrap(k), wrap(v), heads, starts);
        (unwrap(out), unwrap(lse))
    }

    pub(crate) fn causal_attention_backward<B: Backend>(
        dout: FloatTensor<B>,
        qkv: [FloatTensor<B>; 3],
        out: FloatTensor<B>,
        lse: FloatTensor<B>,
        heads: usize,
        starts: Option<IntTensor<B>>,
    ) -> [FloatTensor<B>; 3] {
        reference::attention::backward(
            wrap::<B, 3>(dout),
            qkv.map(wrap),
            wrap(out),
            wrap(lse),
            heads,
            starts.map(Tensor::<B, 2, Int>::from_primitive),
        )
        .map(unwrap)
    }

    pub(crate) fn cross_entropy_forward<B: Backend>(
        logits: FloatTensor<B>,
        targets: IntTensor<B>,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let (loss, lse) = reference::cross_entropy::forward(
            wrap::<B, 2>(logits),
            Tensor::from_primitive(targets),
        );
        (unwrap(loss), unwrap(lse))
    }

    pub(crate) fn cross_entropy_backward<B: Backend>(
        dloss: FloatTensor<B>,
        logits: FloatTensor<B>,
        targets: IntTensor<B>,
        lse: FloatTensor<B>,
    ) -> FloatTensor<B> {
        unwrap(reference::cross_entropy::backward(
            wrap::<B, 1>(dloss),
            wrap(logits),
            Tensor::from_primitive(targets),
            wrap(lse),
        ))
    }
}

impl<E, I, Q> KernelBackend for burn::backend::NdArray<E, I, Q>
where
    E: burn::backend::ndarray::FloatNdArrayElement,
    I: burn::backend::ndarray::IntNdArrayElement,
    Q: burn::backend::ndarray::QuantElement,
    burn::backend::ndarray::NdArrayTensor:
        From<burn::backend::ndarray::SharedArray<E>> + From<burn::backend::ndarray::SharedArray<I>>,
{
}
