//! A linear layer applied to the rows of a `[batch, seq, d]` tensor as one matrix.

use burn::nn::Linear;
use burn::tensor::Tensor;
use kiln_kernels::{KernelBackend, ops};

/// `linear` of `x [batch, seq, d_in]` as one `[batch·seq, d_in]` matrix: `[batch, seq, d_out]`.
///
/// The same function as `linear.forward(x)`, computed differently. On a 3-D input Burn's
/// `Linear` multiplies by the weight broadcast over the batch, and its weight gradient is
/// `batch` small products `xᵢᵀ·dyᵢ` (with `seq` terms each) written to a `[batch, d_in, d_out]`
/// intermediate and summed over the batch. On the flattened rows both directions are one
/// matrix product each: `x·W`, `dy·Wᵀ` and `xᵀ·dy` over all `batch·seq` rows at once. The
/// reshapes are free (views of contiguous tensors). Through Kiln's [`ops::linear`], the bias's
/// gradient (a sum down `batch·seq` rows) runs on many cubes of a GPU, not on one.
pub fn linear_rows<B: KernelBackend>(linear: &Linear<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let bias = linear.bias.as_ref().map(|b| b.val());
    ops::linear(x, linear.weight.val(), bias).expect(SHAPES)
}

/// `residual + linear(x)` as [`linear_rows`] does it, the residual added in the same pass
/// over the output ([`ops::linear_residual`]).
///
/// # Panics
/// When `residual` is not `linear`'s output shape (a caller's bug).
pub fn linear_rows_residual<B: KernelBackend>(
    linear: &Linear<B>,
    x: Tensor<B, 3>,
    residual: Tensor<B, 3>,
) -> Tensor<B, 3> {
    let bias = linear.bias.as_ref().map(|b| b.val());
    ops::linear_residual(x, linear.weight.val(), bias, residual).unwrap_or_else(|e| panic!("{e}"))
}

/// `relu(linear(x))` as [`linear_rows`] does it, the ReLU applied in the same pass over the
/// output ([`ops::linear_relu`]).
pub fn linear_rows_relu<B: KernelBackend>(linear: &Linear<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let bias = linear.bias.as_ref().map(|b| b.val());
    ops::linear_relu(x, linear.weight.val(), bias).expect(SHAPES)
}

const SHAPES: &str = "a Linear's weight takes its own input width and matches its bias";

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::nn::LinearConfig;
    use burn::tensor::{Distribution, Tolerance};

    use super::*;

    type B = Autodiff<Flex>;

    /// Output and gradients (input, weight, bias) equal Burn's `Linear` on the 3-D input.
    #[test]
    fn equals_linear_on_the_whole_tensor() {
        let device = Default::default();
        let linear = LinearConfig::new(13, 7).init::<B>(&device);
        let x = Tensor::<B, 3>::random([3, 5, 13], Distribution::Default, &device).require_grad();
        let probe = Tensor::<B, 3>::random([3, 5, 7], Distribution::Default, &device);
        let expected = linear.forward(x.clone());
        let actual = linear_rows(&linear, x.clone());
        let close = |a: Tensor<Flex, 3>, b: Tensor<Flex, 3>| {
            a.into_data()
                .assert_approx_eq::<f32>(&b.into_data(), Tolerance::absolute(1e-5));
        };
        close(actual.clone().inner(), expected.clone().inner());
        let g_expected = (expected * probe.clone()).sum().backward();
        let g_actual = (actual * probe).sum().backward();
        close(x.grad(&g_actual).unwrap(), x.grad(&g_expected).unwrap());
        let weight = |g| linear.weight.grad(g).unwrap().unsqueeze::<3>();
        close(weight(&g_actual), weight(&g_expected));
        let bias = |g| {
            linear
                .bias
                .as_ref()
                .unwrap()
                .grad(g)
                .unwrap()
                .unsqueeze::<3>()
        };
        close(bias(&g_actual), bias(&g_expected));
    }
}
