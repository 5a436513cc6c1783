//! What crosses a stage boundary: any tensor, flattened for the collective's send and receive
//! and rebuilt on the other side as a leaf of the receiving stage's graph.

use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

/// A value one pipeline stage hands the next. Implemented for every `Tensor<B, D>`.
///
/// Backward through a stage boundary uses the identity `∂/∂θ Σ (y ⊙ g) = (∂y/∂θ)ᵀ g`: the
/// receiving stage's gradient `g` with respect to its input `y` is injected into the sending
/// stage's graph as the output gradient of `y` by running backward from [`Activation::dot`].
pub trait Activation<B: AutodiffBackend>: Clone + Send + 'static {
    /// The tensor's rank (number of dimensions).
    const RANK: usize;

    /// The shape, which the receiving stage needs to rebuild the tensor.
    fn dims(&self) -> Vec<usize>;

    /// The values, detached from the graph and flattened, to send.
    fn to_flat(&self) -> Tensor<B::InnerBackend, 1>;

    /// A received tensor as a leaf that tracks its gradient.
    fn leaf(flat: Tensor<B::InnerBackend, 1>, dims: &[usize]) -> Self;

    /// The gradient of a [`Activation::leaf`], flattened, to send back; zeros when the graph
    /// did not reach it.
    fn grad_flat(&self, grads: &B::Gradients) -> Tensor<B::InnerBackend, 1>;

    /// `Σ self ⊙ grad`, the scalar whose backward injects `grad` (flat, the shape of `self`)
    /// as the gradient of `self`.
    fn dot(self, grad: Tensor<B::InnerBackend, 1>) -> Tensor<B, 1>;
}

impl<B: AutodiffBackend, const D: usize> Activation<B> for Tensor<B, D> {
    const RANK: usize = D;

    fn dims(&self) -> Vec<usize> {
        self.dims().to_vec()
    }

    fn to_flat(&self) -> Tensor<B::InnerBackend, 1> {
        let len = self.shape().num_elements();
        self.clone().inner().reshape([len])
    }

    fn leaf(flat: Tensor<B::InnerBackend, 1>, dims: &[usize]) -> Self {
        let dims: [usize; D] = dims.try_into().expect("an activation's rank is its type's");
        Tensor::from_inner(flat.reshape(dims)).require_grad()
    }

    fn grad_flat(&self, grads: &B::Gradients) -> Tensor<B::InnerBackend, 1> {
        let len = self.shape().num_elements();
        match self.grad(grads) {
            Some(grad) => grad.reshape([len]),
            None => Tensor::zeros([len], &self.device()),
        }
    }

    fn dot(self, grad: Tensor<B::InnerBackend, 1>) -> Tensor<B, 1> {
        let dims = self.dims();
        (self * Tensor::from_inner(grad.reshape(dims))).sum()
    }
}
