//! SwiGLU gating: `silu(gate) · up`.

use burn::tensor::Tensor;
use burn::tensor::activation::sigmoid;
use burn::tensor::backend::Backend;

/// `silu(gate) · up`, element-wise.
pub fn forward<B: Backend, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    gate.clone() * sigmoid(gate) * up
}

/// `(d gate, d up)`: `silu'(a) = σ(a)·(1 + a·(1 − σ(a)))`.
pub fn backward<B: Backend, const D: usize>(
    dy: Tensor<B, D>,
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> (Tensor<B, D>, Tensor<B, D>) {
    let sig = sigmoid(gate.clone());
    let silu = gate.clone() * sig.clone();
    let dsilu = sig.clone() * (gate * (sig.neg().add_scalar(1.0))).add_scalar(1.0);
    (dy.clone() * up * dsilu, dy * silu)
}
