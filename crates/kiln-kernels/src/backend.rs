//! The backend extension: what a backend must provide for Kiln's kernels, with the plain-Burn
//! reference as the default so that every backend has them.
//!
//! Methods work on primitives of fixed rank (matrices and vectors); [`crate::ops`] wraps them
//! in `Tensor` functions of any rank. The CubeCL backends override every method with a kernel
//! ([`crate::cube`]), `Autodiff<B>` overrides them with a backward ([`crate::autodiff`]), and
//! other backends keep these defaults.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Tensor, TensorPrimitive};

use crate::AdamWStep;
use crate::quant::QuantizedPrimitive;
use crate::reference;

/// A primitive as a `Tensor` of rank `D`.
pub(crate) fn wrap<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// A `Tensor`'s float primitive.
pub(crate) fn unwrap<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// A Burn backend with Kiln's fused kernels. Shapes in the docs are the primitives' shapes.
pub trait KernelBackend: Backend {
    /// `y = x·deq(W) + s·t·B`: `x [m, k]`, `t = x·A [m, r]`, `b [r, n]` → `[m, n]`.
    fn qlora_forward(
        x: FloatTensor<Self>,
        weight: QuantizedPrimitive<Self>,
        t: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        unwrap(reference::qlora::forward(
            wrap(x),
            &weight,
            wrap(t),
            wrap(b),
            scale,
        ))
    }

    /// `dy·deq(W)ᵀ`: `dy [m, n]` → `[m, k]`.
    fn qlora_input_grad(
        dy: FloatTensor<Self>,
        weight: QuantizedPrimitive<Self>,
    ) -> FloatTensor<Self> {
        unwrap(reference::qlora::input_grad(wrap(dy), &weight))
    }

    /// RMSNorm of `x [rows, d]` with gain `gamma [d]`: `(y [rows, d], rstd [rows])`.
    fn rms_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (y, rstd) = reference::rms_norm::forward(wrap::<Self, 2>(x), wrap(gamma), eps);
        (unwrap(y), unwrap(rstd))
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

    /// `silu(gate)·up` over two `[len]` tensors.
    fn swiglu_forward(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        unwrap(reference::swiglu::forward::<Self, 1>(wrap(gate), wrap(up)))
    }

    /// SwiGLU's backward: `(d gate, d up)`.
    fn swiglu_backward(
        dy: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dg, du) = reference::swiglu::backward::<Self, 1>(wrap(dy), wrap(gate), wrap(up));
        (unwrap(dg), unwrap(du))
    }

    /// Softmax cross-entropy of `logits [rows, classes]` against `targets [rows]`:
    /// `(loss [rows], lse [rows])`. Targets must lie in `0..classes`.
    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (loss, lse) = reference::cross_entropy::forward(
            wrap::<Self, 2>(logits),
            Tensor::from_primitive(targets),
        );
        (unwrap(loss), unwrap(lse))
    }

    /// Cross-entropy's backward from the saved `lse`: `dlogits [rows, classes]`.
    fn cross_entropy_backward(
        dloss: FloatTensor<Self>,
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        unwrap(reference::cross_entropy::backward(
            wrap::<Self, 1>(dloss),
            wrap(logits),
            Tensor::from_primitive(targets),
            wrap(lse),
        ))
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

    /// `[Σ x² over the finite x, number of non-finite x]` (f32, `[2]`) over flat tensors.
    fn grad_sq_norm(tensors: Vec<FloatTensor<Self>>, device: &Self::Device) -> FloatTensor<Self> {
        unwrap(reference::grad_norm::sq_norm(
            tensors.into_iter().map(wrap::<Self, 1>).collect(),
            device,
        ))
    }
}

impl KernelBackend for burn::backend::Flex {}

impl<E, I, Q> KernelBackend for burn::backend::NdArray<E, I, Q>
where
    E: burn::backend::ndarray::FloatNdArrayElement,
    I: burn::backend::ndarray::IntNdArrayElement,
    Q: burn::backend::ndarray::QuantElement,
    burn::backend::ndarray::NdArrayTensor:
        From<burn::backend::ndarray::SharedArray<E>> + From<burn::backend::ndarray::SharedArray<I>>,
{
}
