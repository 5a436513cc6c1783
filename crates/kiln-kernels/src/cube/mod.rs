//! The CubeCL kernels and their implementation of [`KernelBackend`] for Burn's CubeCL
//! backends (`CubeBackend<R, ..>`: wgpu, CUDA, …). Each kernel accumulates in f32 whatever the
//! tensors' float type (f32, f16, bf16). Only the QLoRA matrix-vector product uses plane (warp)
//! operations, where the runtime has them, and shared memory where it does not (lavapipe).

mod adamw_many;
mod attention;
mod bindings;
mod cast_many;
mod column_sum;
mod cross_entropy;
mod elementwise;
mod grad_norm;
mod layer_norm;
mod layout;
mod linear;
pub mod matmul;
mod qlora;
mod qlora_vec;
mod reduce;
mod rms_norm;
pub mod tune;

use burn::tensor::Shape;
use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor};
use burn_cubecl::element::BoolElement;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};

pub use qlora::DENSE_ROWS as QLORA_DENSE_ROWS;
pub use qlora_vec::ROWS as QLORA_VECTOR_ROWS;

use crate::backend::{KernelBackend, unwrap, wrap};
use crate::quant::QuantizedPrimitive;
use crate::{AdamWStep, Epilogue, FlatLayout, Product, Transpose};

fn weight<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    w: QuantizedPrimitive<CubeBackend<R, F, I, BT>>,
) -> qlora::CubeWeight<R> {
    qlora::CubeWeight {
        packed: w.packed,
        scales: w.scales,
        codebook: w.codebook,
        k: w.k,
        n: w.n,
    }
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> KernelBackend
    for CubeBackend<R, F, I, BT>
{
    fn dense_float(t: FloatTensor<Self>) -> FloatTensor<Self> {
        layout::dense_input(t)
    }

    fn dense_int(t: IntTensor<Self>) -> IntTensor<Self> {
        layout::dense_input(t)
    }

    fn linear_forward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: Option<FloatTensor<Self>>,
        epilogue: Epilogue<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        let y = Self::matmul(x, w, Transpose::Neither);
        linear::epilogue(y, b, epilogue)
    }

    fn matmul(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        transpose: Transpose,
    ) -> FloatTensor<Self> {
        let product = Product::of_operands::<Self>(&lhs, &rhs, transpose);
        tune::matmul::<Self>(lhs, rhs, &product)
    }

    fn tuned_matmul(device: &Self::Device, product: &Product) -> bool {
        tune::choice::<Self>(device, product).is_some()
    }

    fn column_sum(x: FloatTensor<Self>) -> FloatTensor<Self> {
        column_sum::column_sum(x, None, 1.0)
    }

    fn weight_grad(x: FloatTensor<Self>, dy: FloatTensor<Self>) -> FloatTensor<Self> {
        crate::split_k::weight_grad::<Self>(x, dy)
    }

    fn mean(x: FloatTensor<Self>) -> FloatTensor<Self> {
        // A column sum over one column: many cubes when the tensor is large.
        let n = x.meta.shape().num_elements();
        let column = Self::float_reshape(x, Shape::new([n, 1]));
        column_sum::column_sum(column, None, 1.0 / n as f32)
    }

    fn qlora_forward(
        x: FloatTensor<Self>,
        w: QuantizedPrimitive<Self>,
        t: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        let rows = x.meta.shape()[0];
        if rows <= qlora_vec::ROWS {
            return qlora_vec::qlora_vec(x, weight(w), Some((t, b, scale)), false);
        }
        if rows < qlora::DENSE_ROWS {
            return qlora::qlora_matmul(x, weight(w), Some((t, b, scale)), false);
        }
        // Training batches: the decoded weight through Burn's (tensor-core) matmul, and the
        // adapter's term in its own product's epilogue (four launches where a scaled product
        // and an add took five).
        let deq = qlora::dequantize(weight(w), x.dtype);
        let base = wrap::<Self, 2>(Self::matmul(x, deq, Transpose::Neither));
        let low_rank = crate::ops::add_low_rank(base, wrap(t), wrap(b), scale);
        unwrap(low_rank.expect("the adapter's factors chain: rank → out"))
    }

    fn qlora_input_grad(dy: FloatTensor<Self>, w: QuantizedPrimitive<Self>) -> FloatTensor<Self> {
        let rows = dy.meta.shape()[0];
        if rows <= qlora_vec::ROWS {
            return qlora_vec::qlora_vec(dy, weight(w), None, true);
        }
        if rows < qlora::DENSE_ROWS {
            return qlora::qlora_matmul(dy, weight(w), None, true);
        }
        let deq = qlora::dequantize(weight(w), dy.dtype);
        Self::matmul(dy, deq, Transpose::Rhs)
    }

    fn rms_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        rms_norm::forward(x, gamma, eps)
    }

    fn rms_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        rms_norm::backward(dy, x, gamma, rstd)
    }

    fn rms_norm_input_grad(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        rms_norm::input_grad(dy, x, gamma, rstd)
    }

    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        layer_norm::forward(x, gamma, beta, eps)
    }

    fn layer_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        layer_norm::backward(dy, x, gamma, mean, rstd)
    }

    fn causal_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        heads: usize,
        starts: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        attention::forward(q, k, v, heads, starts)
    }

    fn causal_attention_backward(
        dout: FloatTensor<Self>,
        qkv: [FloatTensor<Self>; 3],
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        heads: usize,
        starts: Option<IntTensor<Self>>,
    ) -> [FloatTensor<Self>; 3] {
        attention::backward(dout, qkv, out, lse, heads, starts)
    }

    fn swiglu_forward(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        elementwise::swiglu(gate, up)
    }

    fn swiglu_backward(
        dy: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        elementwise::swiglu_backward(dy, gate, up)
    }

    fn relu_forward(x: FloatTensor<Self>) -> FloatTensor<Self> {
        elementwise::relu(x)
    }

    fn relu_backward(dy: FloatTensor<Self>, y: FloatTensor<Self>) -> FloatTensor<Self> {
        elementwise::relu_backward(dy, y)
    }

    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        cross_entropy::forward(logits, targets)
    }

    fn cross_entropy_backward(
        dloss: FloatTensor<Self>,
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        elementwise::cross_entropy_backward(dloss, logits, targets, lse)
    }

    fn adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        step: &AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        elementwise::adamw(param, grad, m, v, step)
    }

    fn adamw_many(
        params: Vec<FloatTensor<Self>>,
        grads: Vec<FloatTensor<Self>>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        layout: &FlatLayout,
        step: &AdamWStep,
        grad_scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        adamw_many::adamw_many(params, grads, m, v, layout, step, grad_scale)
    }

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
        let copy = (copy.0, copy.1.into());
        adamw_many::adamw_many_copy(params, grads, m, v, layout, step, grad_scale, copy)
    }

    fn cast_many(
        tensors: Vec<FloatTensor<Self>>,
        layout: &FlatLayout,
        dtype: burn::tensor::FloatDType,
        device: &Self::Device,
    ) -> FloatTensor<Self> {
        cast_many::cast_many(tensors, layout, dtype.into(), device)
    }

    fn flat_segments(flat: FloatTensor<Self>, layout: &FlatLayout) -> Vec<FloatTensor<Self>> {
        layout::flat_segments(flat, layout)
    }

    fn flat_alignment(device: &Self::Device, dtype: burn::tensor::DType) -> usize {
        adamw_many::alignment(&R::client(device), dtype)
    }

    fn grad_sq_norm(tensors: Vec<FloatTensor<Self>>, device: &Self::Device) -> FloatTensor<Self> {
        grad_norm::sq_norm(tensors, device)
    }
}
