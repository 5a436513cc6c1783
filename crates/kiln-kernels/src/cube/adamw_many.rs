//! AdamW over many tensors in one launch: the parameters and gradients are bound one tensor
//! each (a `Sequence`), the moments and the updated parameters are flat buffers laid out by a
//! [`FlatLayout`]. A unit steps one element; the units run over the tensors one after another.
//!
//! A runtime binds a bounded number of buffers to one launch, so the tensors are stepped in
//! chunks of as many as fit (`bindings`): one launch on CUDA for any model Kiln trains, a few
//! on wgpu.
//!
//! Given a second layout and a dtype, the same pass also writes each updated parameter in that
//! dtype into a flat buffer of its own: mixed precision's bf16 or f16 copy for the next step,
//! rounded from the f32 value just written, as a cast of it would be.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::bindings::{launches, tensors_per_launch};
use super::layout::{dense_input, dense_output};
use crate::{AdamWStep, FlatLayout};

/// Buffers every launch binds besides the chunk's parameters and gradients: `m`, `v` and the
/// three outputs (and the copy, when one is made).
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

/// Steps element `j` of one parameter, whose moments lie at `at` of the flat buffers: writes
/// the moments and the parameter, and returns the parameter as written.
#[cube]
#[allow(clippy::too_many_arguments)]
fn step_element<F: Float, G: Float>(
    param: &Tensor<F>,
    grad: &Tensor<G>,
    j: usize,
    m: &Tensor<F>,
    v: &Tensor<F>,
    at: usize,
    param_out: &mut Tensor<F>,
    m_out: &mut Tensor<F>,
    v_out: &mut Tensor<F>,
    hyper: &Hyper,
) -> F {
    let g = f32::cast_from(grad[j]) * hyper.grad_scale;
    let m1 = hyper.beta_1 * f32::cast_from(m[at]) + (1.0f32 - hyper.beta_1) * g;
    let v1 = hyper.beta_2 * f32::cast_from(v[at]) + (1.0f32 - hyper.beta_2) * g * g;
    let update = m1 * hyper.correction_1 / (f32::sqrt(v1 * hyper.correction_2) + hyper.epsilon);
    let stepped = F::cast_from(f32::cast_from(param[j]) * hyper.decay - hyper.lr * update);
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
            let grad = grads.index(i);
            step_element::<F, G>(
                param,
                grad,
                j,
                m,
                v,
                segment + j,
                param_out,
                m_out,
                v_out,
                &hyper,
            );
        }
        before += len;
        segment += len.div_ceil(align) * align;
    }
}

/// [`adamw_many_kernel`], also writing each stepped parameter in `L` into `copy_out`, laid out
/// with `copy_align`. A kernel of its own: a copy argument bound but unused would cost the plain
/// step one binding of wgpu's 31, and a fourth launch for the AD model.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn adamw_many_copy_kernel<F: Float, G: Float, L: Float>(
    params: &Sequence<Tensor<F>>,
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
        let param = params.index(i);
        let len = param.len();
        if unit >= before && unit < before + len {
            let j = unit - before;
            let grad = grads.index(i);
            let stepped = step_element::<F, G>(
                param,
                grad,
                j,
                m,
                v,
                segment + j,
                param_out,
                m_out,
                v_out,
                &hyper,
            );
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

/// See [`crate::KernelBackend::adamw_many`] and [`crate::KernelBackend::adamw_many_copy`]: the
/// stepped parameters, the moments, and the copy in `copy`'s layout and dtype when asked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn adamw_many<R: CubeRuntime>(
    params: Vec<CubeTensor<R>>,
    grads: Vec<CubeTensor<R>>,
    m: CubeTensor<R>,
    v: CubeTensor<R>,
    layout: &FlatLayout,
    step: &AdamWStep,
    grad_scale: f32,
    copy: Option<(&FlatLayout, DType)>,
) -> (
    CubeTensor<R>,
    CubeTensor<R>,
    CubeTensor<R>,
    Option<CubeTensor<R>>,
) {
    let (m, v) = (dense_input(m), dense_input(v));
    let client = m.client.clone();
    let dtype = m.dtype;
    let total = Shape::new([layout.total()]);
    let outs = [0; 3].map(|_| dense_output(&m, total.clone(), dtype));
    let copy_out = copy.map(|(l, d)| (l, dense_output(&m, Shape::new([l.total()]), d)));
    let hyper = || {
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
    };
    // A parameter and its gradient per tensor; the gradients of one launch share a dtype.
    let fixed = FIXED_BINDINGS + usize::from(copy_out.is_some());
    let per_launch = tensors_per_launch(&client, fixed, 2);
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
            debug_assert!(chunk.iter().all(|(p, _)| p.dtype == dtype));
            // Each kernel's sequences are typed by it: built in its own arm.
            macro_rules! sequences {
                () => {{
                    let mut params = SequenceArg::new();
                    let mut grads = SequenceArg::new();
                    for (p, g) in chunk {
                        params.push(p.into_tensor_arg());
                        grads.push(g.into_tensor_arg());
                    }
                    (params, grads)
                }};
            }
            let dim = CubeDim::new(&client, units);
            let count_cubes = calculate_cube_count_elemwise(&client, units, dim);
            let (first_segment, units_u32) = (layout.offsets()[first] as u32, units as u32);
            let (m_arg, v_arg) = (m.clone().into_tensor_arg(), v.clone().into_tensor_arg());
            let [p_out, m_out, v_out] = outs.clone().map(|o| o.into_tensor_arg());
            match &copy_out {
                None => {
                    let (params, grads) = sequences!();
                    adamw_many_kernel::launch::<R>(
                        &client,
                        count_cubes,
                        dim,
                        params,
                        grads,
                        m_arg,
                        v_arg,
                        p_out,
                        m_out,
                        v_out,
                        hyper(),
                        first_segment,
                        units_u32,
                        count,
                        layout.align(),
                        [dtype.into(), grad_dtype.into()],
                    )
                }
                Some((copy_layout, out)) => {
                    let (params, grads) = sequences!();
                    adamw_many_copy_kernel::launch::<R>(
                        &client,
                        count_cubes,
                        dim,
                        params,
                        grads,
                        m_arg,
                        v_arg,
                        p_out,
                        m_out,
                        v_out,
                        out.clone().into_tensor_arg(),
                        hyper(),
                        first_segment,
                        copy_layout.offsets()[first] as u32,
                        units_u32,
                        count,
                        layout.align(),
                        copy_layout.align(),
                        [dtype.into(), grad_dtype.into(), out.dtype.into()],
                    )
                }
            }
        }
        first += count;
    }
    let [p, m, v] = outs;
    (p, m, v, copy_out.map(|(_, out)| out))
}
