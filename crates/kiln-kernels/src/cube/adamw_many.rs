//! AdamW over many tensors in one launch: the parameters and gradients are bound one tensor
//! each (a `Sequence`), the moments and the updated parameters are flat buffers laid out by a
//! [`FlatLayout`]. A unit steps one element; the units run over the tensors one after another.
//!
//! A runtime binds a bounded number of buffers to one launch, so the tensors are stepped in
//! chunks of as many as fit (`bindings`): one launch on CUDA for any model Kiln trains, a few
//! on wgpu.
//!
//! Given the parameters as one flat buffer (the previous step's output), a second layout and a
//! dtype, the same pass also writes each updated parameter in that dtype into a flat buffer of
//! its own: mixed precision's bf16 or f16 copy for the next step, rounded from the f32 value
//! just written, as a cast of it would be.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::bindings::{launches, tensors_per_launch};
use super::layout::{dense_input, dense_output};
use crate::{AdamWStep, FlatLayout};

/// Buffers every launch binds besides the chunk's parameters and gradients: `m`, `v` and the
/// three outputs.
const FIXED_BINDINGS: usize = 5;

/// The hyper-parameters of a step, as the kernel reads them.
#[derive(CubeType, CubeLaunch, Clone, Copy)]
struct Hyper {
    lr: f32,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    /// `1 − lr·wd`.
    decay: f32,
    /// `1/(1 − β₁ᵗ)`.
    correction_1: f32,
    /// `1/(1 − β₂ᵗ)`.
    correction_2: f32,
    grad_scale: f32,
}

/// Steps one value `p` of a parameter with its gradient `g`, whose moments lie at `at` of the
/// flat buffers: writes the moments and the parameter, and returns the parameter as written.
#[cube]
#[allow(clippy::too_many_arguments)]
fn step_element<F: Float>(
    p: f32,
    g: f32,
    m: &Tensor<F>,
    v: &Tensor<F>,
    at: usize,
    param_out: &mut Tensor<F>,
    m_out: &mut Tensor<F>,
    v_out: &mut Tensor<F>,
    hyper: &Hyper,
) -> F {
    let g = g * hyper.grad_scale;
    let m1 = hyper.beta_1 * f32::cast_from(m[at]) + (1.0f32 - hyper.beta_1) * g;
    let v1 = hyper.beta_2 * f32::cast_from(v[at]) + (1.0f32 - hyper.beta_2) * g * g;
    let update = m1 * hyper.correction_1 / (f32::sqrt(v1 * hyper.correction_2) + hyper.epsilon);
    let stepped = F::cast_from(p * hyper.decay - hyper.lr * update);
    param_out[at] = stepped;
    m_out[at] = F::cast_from(m1);
    v_out[at] = F::cast_from(v1);
    stepped
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn adamw_many_kernel<F: Float, G: Float>(
    params: &Sequence<Tensor<F>>,
    grads: &Sequence<Tensor<G>>,
    m: &Tensor<F>,
    v: &Tensor<F>,
    param_out: &mut Tensor<F>,
    m_out: &mut Tensor<F>,
    v_out: &mut Tensor<F>,
    hyper: Hyper,
    first_segment: u32,
    units: u32,
    #[comptime] count: usize,
    #[comptime] align: usize,
    #[define(F, G)] _dtypes: [StorageType; 2],
) {
    let unit = ABSOLUTE_POS;
    if unit >= units as usize {
        terminate!();
    }
    // Tensor `i` holds units [before, before + len) and the flat segment starting at `segment`.
    let mut before = 0usize;
    let mut segment = first_segment as usize;
    #[unroll]
    for i in 0..count {
        let param = params.index(i);
        let len = param.len();
        if unit >= before && unit < before + len {
            let j = unit - before;
            let (p, g) = (f32::cast_from(param[j]), f32::cast_from(grads.index(i)[j]));
            step_element::<F>(p, g, m, v, segment + j, param_out, m_out, v_out, &hyper);
        }
        before += len;
        segment += len.div_ceil(align) * align;
    }
}

/// [`adamw_many_kernel`] over parameters that lie in one flat buffer laid out as the moments
/// (the previous step's output, which the model's parameters are views of), also writing each
/// stepped parameter in `L` into `copy_out`, laid out with `copy_align`: mixed precision's
/// compute-dtype copy. The flat parameters take one binding where the tensors took one each, so
/// that the copy's buffer costs no launch on wgpu, which binds 31.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn adamw_many_copy_kernel<F: Float, G: Float, L: Float>(
    params: &Tensor<F>,
    grads: &Sequence<Tensor<G>>,
    m: &Tensor<F>,
    v: &Tensor<F>,
    param_out: &mut Tensor<F>,
    m_out: &mut Tensor<F>,
    v_out: &mut Tensor<F>,
    copy_out: &mut Tensor<L>,
    hyper: Hyper,
    first_segment: u32,
    first_copy_segment: u32,
    units: u32,
    #[comptime] count: usize,
    #[comptime] align: usize,
    #[comptime] copy_align: usize,
    #[define(F, G, L)] _dtypes: [StorageType; 3],
) {
    let unit = ABSOLUTE_POS;
    if unit >= units as usize {
        terminate!();
    }
    let mut before = 0usize;
    let mut segment = first_segment as usize;
    let mut copy_segment = first_copy_segment as usize;
    #[unroll]
    for i in 0..count {
        let grad = grads.index(i);
        let len = grad.len();
        if unit >= before && unit < before + len {
            let j = unit - before;
            let at = segment + j;
            let (p, g) = (f32::cast_from(params[at]), f32::cast_from(grad[j]));
            let stepped = step_element::<F>(p, g, m, v, at, param_out, m_out, v_out, &hyper);
            copy_out[copy_segment + j] = L::cast_from(stepped);
        }
        before += len;
        segment += len.div_ceil(align) * align;
        copy_segment += len.div_ceil(copy_align) * copy_align;
    }
}

/// Elements of `dtype` that make the runtime's offset alignment: a slice starting and ending at
/// their multiples is a view of its buffer.
pub(crate) fn alignment<R: CubeRuntime>(
    client: &ComputeClient<R>,
    dtype: burn::tensor::DType,
) -> usize {
    (client.properties().memory.alignment as usize / dtype.size()).max(1)
}

/// The step's hyper-parameters as the kernels read them.
fn hyper<R: Runtime>(step: &AdamWStep, grad_scale: f32) -> HyperLaunch<R> {
    HyperLaunch::new(
        step.lr,
        step.beta_1,
        step.beta_2,
        step.epsilon,
        1.0 - step.lr * step.weight_decay,
        step.bias_correction_1(),
        step.bias_correction_2(),
        grad_scale,
    )
}

/// See [`crate::KernelBackend::adamw_many`]: the stepped parameters and the moments.
#[allow(clippy::too_many_arguments)]
pub(crate) fn adamw_many<R: CubeRuntime>(
    params: Vec<CubeTensor<R>>,
    grads: Vec<CubeTensor<R>>,
    m: CubeTensor<R>,
    v: CubeTensor<R>,
    layout: &FlatLayout,
    step: &AdamWStep,
    grad_scale: f32,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let (m, v) = (dense_input(m), dense_input(v));
    let client = m.client.clone();
    let dtype = m.dtype;
    let total = Shape::new([layout.total()]);
    let outs = [0; 3].map(|_| dense_output(&m, total.clone(), dtype));
    // A parameter and its gradient per tensor; the gradients of one launch share a dtype.
    let per_launch = tensors_per_launch(&client, FIXED_BINDINGS, 2);
    let tensors: Vec<(CubeTensor<R>, CubeTensor<R>)> = params
        .into_iter()
        .map(dense_input)
        .zip(grads.into_iter().map(dense_input))
        .collect();
    let mut first = 0;
    for chunk in launches(tensors, per_launch, |(_, g)| g.dtype) {
        let units: usize = layout.lens()[first..first + chunk.len()].iter().sum();
        let count = chunk.len();
        if units > 0 {
            let grad_dtype = chunk[0].1.dtype;
            let mut params = SequenceArg::new();
            let mut grads = SequenceArg::new();
            for (p, g) in chunk {
                debug_assert_eq!(p.dtype, dtype);
                params.push(p.into_tensor_arg());
                grads.push(g.into_tensor_arg());
            }
            let dim = CubeDim::new(&client, units);
            adamw_many_kernel::launch::<R>(
                &client,
                calculate_cube_count_elemwise(&client, units, dim),
                dim,
                params,
                grads,
                m.clone().into_tensor_arg(),
                v.clone().into_tensor_arg(),
                outs[0].clone().into_tensor_arg(),
                outs[1].clone().into_tensor_arg(),
                outs[2].clone().into_tensor_arg(),
                hyper(step, grad_scale),
                layout.offsets()[first] as u32,
                units as u32,
                count,
                layout.align(),
                [dtype.into(), grad_dtype.into()],
            );
        }
        first += count;
    }
    let [p, m, v] = outs;
    (p, m, v)
}

/// See [`crate::KernelBackend::adamw_many_copy`]: the parameters flat in `layout`, stepped,
/// the moments, and the copy in `copy`'s layout and dtype.
#[allow(clippy::too_many_arguments)]
pub(crate) fn adamw_many_copy<R: CubeRuntime>(
    params: CubeTensor<R>,
    grads: Vec<CubeTensor<R>>,
    m: CubeTensor<R>,
    v: CubeTensor<R>,
    layout: &FlatLayout,
    step: &AdamWStep,
    grad_scale: f32,
    (copy_layout, copy_dtype): (&FlatLayout, DType),
) -> [CubeTensor<R>; 4] {
    let (params, m, v) = (dense_input(params), dense_input(m), dense_input(v));
    let client = m.client.clone();
    let dtype = m.dtype;
    let total = Shape::new([layout.total()]);
    let outs = [0; 3].map(|_| dense_output(&m, total.clone(), dtype));
    let copy = dense_output(&m, Shape::new([copy_layout.total()]), copy_dtype);
    // The flat parameters, the moments, three outputs and the copy; a gradient per tensor.
    let per_launch = tensors_per_launch(&client, FIXED_BINDINGS + 2, 1);
    let grads: Vec<CubeTensor<R>> = grads.into_iter().map(dense_input).collect();
    let mut first = 0;
    for chunk in launches(grads, per_launch, |g| g.dtype) {
        let units: usize = layout.lens()[first..first + chunk.len()].iter().sum();
        let count = chunk.len();
        if units > 0 {
            let grad_dtype = chunk[0].dtype;
            let mut grads = SequenceArg::new();
            for g in chunk {
                grads.push(g.into_tensor_arg());
            }
            let dim = CubeDim::new(&client, units);
            adamw_many_copy_kernel::launch::<R>(
                &client,
                calculate_cube_count_elemwise(&client, units, dim),
                dim,
                params.clone().into_tensor_arg(),
                grads,
                m.clone().into_tensor_arg(),
                v.clone().into_tensor_arg(),
                outs[0].clone().into_tensor_arg(),
                outs[1].clone().into_tensor_arg(),
                outs[2].clone().into_tensor_arg(),
                copy.clone().into_tensor_arg(),
                hyper(step, grad_scale),
                layout.offsets()[first] as u32,
                copy_layout.offsets()[first] as u32,
                units as u32,
                count,
                layout.align(),
                copy_layout.align(),
                [dtype.into(), grad_dtype.into(), copy_dtype.into()],
            );
        }
        first += count;
    }
    let [p, m, v] = outs;
    [p, m, v, copy]
}
