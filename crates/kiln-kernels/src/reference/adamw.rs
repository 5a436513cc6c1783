//! One AdamW step, Burn's `AdamW` formula (decoupled weight decay, bias-corrected moments).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::{AdamWStep, FlatLayout};

/// `(param, m, v)` after one step.
pub fn step<B: Backend, const D: usize>(
    param: Tensor<B, D>,
    grad: Tensor<B, D>,
    m: Tensor<B, D>,
    v: Tensor<B, D>,
    h: &AdamWStep,
) -> (Tensor<B, D>, Tensor<B, D>, Tensor<B, D>) {
    let m = m.mul_scalar(h.beta_1) + grad.clone().mul_scalar(1.0 - h.beta_1);
    let v = v.mul_scalar(h.beta_2) + grad.square().mul_scalar(1.0 - h.beta_2);
    let update = m.clone().mul_scalar(h.bias_correction_1())
        / (v.clone()
            .mul_scalar(h.bias_correction_2())
            .sqrt()
            .add_scalar(h.epsilon));
    let param = param.mul_scalar(1.0 - h.lr * h.weight_decay) - update.mul_scalar(h.lr);
    (param, m, v)
}

/// One step of every `params[i]` with `grads[i]` (flattened; gradients in any float dtype,
/// multiplied by `grad_scale`), whose moments lie in the flat `m` and `v` at `layout`'s
/// segments: `(params, m, v)` after the step, flat in the same layout, padding zero.
pub fn step_many<B: Backend>(
    params: Vec<Tensor<B, 1>>,
    grads: Vec<Tensor<B, 1>>,
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
    layout: &FlatLayout,
    h: &AdamWStep,
    grad_scale: f32,
) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>) {
    let device = m.device();
    let mut parts: [Vec<Tensor<B, 1>>; 3] = Default::default();
    for (i, (param, grad)) in params.into_iter().zip(grads).enumerate() {
        let segment = layout.segment(i);
        let grad = grad.cast(param.dtype());
        let grad = if grad_scale == 1.0 {
            grad
        } else {
            grad.mul_scalar(grad_scale)
        };
        let (p, m, v) = step(
            param,
            grad,
            m.clone().slice(segment.clone()),
            v.clone().slice(segment),
            h,
        );
        for (part, t) in parts.iter_mut().zip([p, m, v]) {
            part.push(t);
        }
    }
    let dtype = m.dtype();
    let [p, m, v] = parts.map(|part| layout.join(part, &device, dtype));
    (p, m, v)
}
