//! The element-wise kernels: SwiGLU and ReLU both ways, cross-entropy's backward and the AdamW
//! step.
//! One unit per element; the math in f32 whatever the storage type.

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::layout::{dense_input, dense_output, row_input, vector_input};
use crate::AdamWStep;

#[cube]
fn sigmoid(a: f32) -> f32 {
    1.0f32 / (1.0f32 + f32::exp(-a))
}

#[cube(launch)]
fn swiglu_kernel<F: Float>(
    gate: &Tensor<F>,
    up: &Tensor<F>,
    y: &mut Tensor<F>,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i >= y.len() {
        terminate!();
    }
    let a = f32::cast_from(gate[i]);
    y[i] = F::cast_from(a * sigmoid(a) * f32::cast_from(up[i]));
}

#[cube(launch)]
fn swiglu_backward_kernel<F: Float>(
    dy: &Tensor<F>,
    gate: &Tensor<F>,
    up: &Tensor<F>,
    dgate: &mut Tensor<F>,
    dup: &mut Tensor<F>,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i >= dy.len() {
        terminate!();
    }
    let a = f32::cast_from(gate[i]);
    let g = f32::cast_from(dy[i]);
    let s = sigmoid(a);
    dgate[i] = F::cast_from(g * f32::cast_from(up[i]) * s * (1.0f32 + a * (1.0f32 - s)));
    dup[i] = F::cast_from(g * a * s);
}

#[cube(launch)]
fn relu_kernel<F: Float>(x: &Tensor<F>, y: &mut Tensor<F>, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= y.len() {
        terminate!();
    }
    let v = f32::cast_from(x[i]);
    // `max(v, 0)` would turn a NaN into 0; Burn's ReLU (a masked fill where `v ≤ 0`) keeps it.
    y[i] = if v > 0.0 || f32::is_nan(v) {
        x[i]
    } else {
        F::cast_from(0.0f32)
    };
}

#[cube(launch)]
fn relu_backward_kernel<F: Float>(
    dy: &Tensor<F>,
    y: &Tensor<F>,
    dx: &mut Tensor<F>,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i >= dx.len() {
        terminate!();
    }
    dx[i] = if f32::cast_from(y[i]) <= 0.0 {
        F::cast_from(0.0f32)
    } else {
        dy[i]
    };
}

#[cube(launch)]
fn cross_entropy_backward_kernel<F: Float, I: Int>(
    dloss: &Tensor<f32>,
    logits: &Tensor<F>,
    targets: &Tensor<I>,
    lse: &Tensor<f32>,
    dlogits: &mut Tensor<F>,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let i = ABSOLUTE_POS;
    if i >= dlogits.len() {
        terminate!();
    }
    let classes = logits.shape(1);
    let row = i / classes;
    let class = i % classes;
    // The logits' rows may be pitched (see `row_input`); the gradient is written dense.
    let logit = f32::cast_from(logits[row * logits.stride(0) + class]);
    let p = f32::exp(logit - lse[row]);
    let mut hot = 0.0f32;
    if usize::cast_from(targets[row]) == class {
        hot = 1.0;
    }
    // `dloss` may be a broadcast scalar (a mean's gradient): stride 0, see `vector_input`.
    dlogits[i] = F::cast_from((p - hot) * dloss[row * dloss.stride(0)]);
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn adamw_kernel<F: Float>(
    param: &Tensor<F>,
    grad: &Tensor<F>,
    m: &Tensor<F>,
    v: &Tensor<F>,
    param_out: &mut Tensor<F>,
    m_out: &mut Tensor<F>,
    v_out: &mut Tensor<F>,
    // lr, β₁, β₂, ε, 1 − lr·wd, 1/(1 − β₁ᵗ), 1/(1 − β₂ᵗ)
    lr: f32,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    decay: f32,
    correction_1: f32,
    correction_2: f32,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i >= param.len() {
        terminate!();
    }
    let g = f32::cast_from(grad[i]);
    let m1 = beta_1 * f32::cast_from(m[i]) + (1.0f32 - beta_1) * g;
    let v1 = beta_2 * f32::cast_from(v[i]) + (1.0f32 - beta_2) * g * g;
    let update = m1 * correction_1 / (f32::sqrt(v1 * correction_2) + epsilon);
    param_out[i] = F::cast_from(f32::cast_from(param[i]) * decay - lr * update);
    m_out[i] = F::cast_from(m1);
    v_out[i] = F::cast_from(v1);
}

/// The launch grid of a kernel with one unit per element (per query or key, for attention):
/// `len` units on `t`'s device.
pub(crate) fn grid<R: CubeRuntime>(t: &CubeTensor<R>, len: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new(&t.client, len);
    (calculate_cube_count_elemwise(&t.client, len, dim), dim)
}

pub(crate) fn swiglu<R: CubeRuntime>(gate: CubeTensor<R>, up: CubeTensor<R>) -> CubeTensor<R> {
    let (gate, up) = (dense_input(gate), dense_input(up));
    let y = dense_output(&gate, gate.meta.shape().clone(), gate.dtype);
    let len = y.meta.shape().num_elements();
    if len > 0 {
        let (count, dim) = grid(&y, len);
        let dtype = gate.dtype;
        swiglu_kernel::launch::<R>(
            &y.client.clone(),
            count,
            dim,
            gate.into_tensor_arg(),
            up.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            dtype.into(),
        );
    }
    y
}

pub(crate) fn swiglu_backward<R: CubeRuntime>(
    dy: CubeTensor<R>,
    gate: CubeTensor<R>,
    up: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (dy, gate, up) = (dense_input(dy), dense_input(gate), dense_input(up));
    let dgate = dense_output(&gate, gate.meta.shape().clone(), gate.dtype);
    let dup = dense_output(&gate, gate.meta.shape().clone(), gate.dtype);
    let len = gate.meta.shape().num_elements();
    if len > 0 {
        let (count, dim) = grid(&gate, len);
        let dtype = gate.dtype;
        swiglu_backward_kernel::launch::<R>(
            &gate.client.clone(),
            count,
            dim,
            dy.into_tensor_arg(),
            gate.into_tensor_arg(),
            up.into_tensor_arg(),
            dgate.clone().into_tensor_arg(),
            dup.clone().into_tensor_arg(),
            dtype.into(),
        );
    }
    (dgate, dup)
}

pub(crate) fn relu<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    let x = dense_input(x);
    let y = dense_output(&x, x.meta.shape().clone(), x.dtype);
    let len = y.meta.shape().num_elements();
    if len > 0 {
        let (count, dim) = grid(&y, len);
        let dtype = x.dtype;
        relu_kernel::launch::<R>(
            &y.client.clone(),
            count,
            dim,
            x.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            dtype.into(),
        );
    }
    y
}

pub(crate) fn relu_backward<R: CubeRuntime>(dy: CubeTensor<R>, y: CubeTensor<R>) -> CubeTensor<R> {
    let (dy, y) = (dense_input(dy), dense_input(y));
    let dx = dense_output(&y, y.meta.shape().clone(), y.dtype);
    let len = dx.meta.shape().num_elements();
    if len > 0 {
        let (count, dim) = grid(&dx, len);
        let dtype = y.dtype;
        relu_backward_kernel::launch::<R>(
            &dx.client.clone(),
            count,
            dim,
            dy.into_tensor_arg(),
            y.into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            dtype.into(),
        );
    }
    dx
}

pub(crate) fn cross_entropy_backward<R: CubeRuntime>(
    dloss: CubeTensor<R>,
    logits: CubeTensor<R>,
    targets: CubeTensor<R>,
    lse: CubeTensor<R>,
) -> CubeTensor<R> {
    let (dloss, logits) = (vector_input(dloss), row_input(logits));
    let (targets, lse) = (dense_input(targets), dense_input(lse));
    let out = dense_output(&logits, logits.meta.shape().clone(), logits.dtype);
    let len = out.meta.shape().num_elements();
    if len > 0 {
        let (count, dim) = grid(&out, len);
        let dtypes = [logits.dtype.into(), targets.dtype.into()];
        cross_entropy_backward_kernel::launch::<R>(
            &out.client.clone(),
            count,
            dim,
            dloss.into_tensor_arg(),
            logits.into_tensor_arg(),
            targets.into_tensor_arg(),
            lse.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            dtypes,
        );
    }
    out
}

pub(crate) fn adamw<R: CubeRuntime>(
    param: CubeTensor<R>,
    grad: CubeTensor<R>,
    m: CubeTensor<R>,
    v: CubeTensor<R>,
    h: &AdamWStep,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let (param, grad) = (dense_input(param), dense_input(grad));
    let (m, v) = (dense_input(m), dense_input(v));
    let shape = param.meta.shape().clone();
    let outs =
        [param.dtype, m.dtype, v.dtype].map(|dtype| dense_output(&param, shape.clone(), dtype));
    let len = shape.num_elements();
    if len > 0 {
        let (count, dim) = grid(&param, len);
        let dtype = param.dtype;
        adamw_kernel::launch::<R>(
            &param.client.clone(),
            count,
            dim,
            param.into_tensor_arg(),
            grad.into_tensor_arg(),
            m.into_tensor_arg(),
            v.into_tensor_arg(),
            outs[0].clone().into_tensor_arg(),
            outs[1].clone().into_tensor_arg(),
            outs[2].clone().into_tensor_arg(),
            h.lr,
            h.beta_1,
            h.beta_2,
            h.epsilon,
            1.0 - h.lr * h.weight_decay,
            h.bias_correction_1(),
            h.bias_correction_2(),
            dtype.into(),
        );
    }
    let [p, m, v] = outs;
    (p, m, v)
}
