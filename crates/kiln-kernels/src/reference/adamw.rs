//! One AdamW step, Burn's `AdamW` formula (decoupled weight decay, bias-corrected moments).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::AdamWStep;

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
