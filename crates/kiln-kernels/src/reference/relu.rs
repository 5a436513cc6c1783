//! ReLU, as Burn computes it: `max(x, 0)`, and a backward from the output that passes the
//! gradient where the output is positive (Burn's `relu_backward`).

use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;

/// `max(x, 0)`, element-wise.
pub fn forward<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    relu(x)
}

/// `dx`: `dy` where `y > 0`, else 0.
pub fn backward<B: Backend, const D: usize>(dy: Tensor<B, D>, y: Tensor<B, D>) -> Tensor<B, D> {
    dy.mask_fill(y.lower_equal_elem(0.0), 0.0)
}
