//! LayerNorm through Kiln's fused kernel ([`kiln_kernels::ops::layer_norm`]): one pass per row
//! forward and backward on the CPU, the plain-Burn composite elsewhere.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_kernels::KernelBackend;
use kiln_kernels::ops;

/// Configuration of [`LayerNorm`].
#[derive(Config, Debug)]
pub struct LayerNormConfig {
    /// The normalised (last) dimension.
    pub d_model: usize,
    /// Added to the variance, as Burn's and PyTorch's default.
    #[config(default = 1e-5)]
    pub epsilon: f64,
}

impl LayerNormConfig {
    /// Builds the layer on `device`: gain ones, shift zeros.
    pub fn init<B: Backend>(&self, device: &B::Device) -> LayerNorm<B> {
        LayerNorm {
            gamma: Param::from_tensor(Tensor::ones([self.d_model], device)),
            beta: Param::from_tensor(Tensor::zeros([self.d_model], device)),
            epsilon: self.epsilon,
        }
    }
}

/// `(x − mean) / √(var + ε) · γ + β` over the last dimension, with the biased variance: the
/// function of Burn's `LayerNorm` (and the same parameter names), computed by the fused kernel.
///
/// # Shapes
/// `[.., d_model]` → `[.., d_model]`.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    /// The gain.
    pub gamma: Param<Tensor<B, 1>>,
    /// The shift.
    pub beta: Param<Tensor<B, 1>>,
    #[module(skip)]
    epsilon: f64,
}

impl<B: KernelBackend> LayerNorm<B> {
    /// Normalises `x` over its last dimension.
    ///
    /// # Panics
    /// When `x`'s last dimension is not the layer's width (a caller's shape bug, as for Burn's
    /// layers).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        ops::layer_norm(x, self.gamma.val(), self.beta.val(), self.epsilon as f32)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, Tolerance};

    use super::*;

    type B = Autodiff<Flex>;

    /// Same input, same parameters: the output and every gradient equal Burn's `LayerNorm`.
    #[test]
    fn matches_burns_layer_norm() {
        let device = Default::default();
        let burn_norm = burn::nn::LayerNormConfig::new(13).init::<B>(&device);
        let ours = LayerNormConfig::new(13).init::<B>(&device);
        let x = Tensor::<B, 3>::random([2, 5, 13], Distribution::Normal(1.0, 2.0), &device)
            .require_grad();
        let expected = burn_norm.forward(x.clone());
        let actual = ours.forward(x.clone());
        actual
            .clone()
            .into_data()
            .assert_approx_eq::<f32>(&expected.clone().into_data(), Tolerance::absolute(1e-5));
        let probe = Tensor::<B, 3>::random([2, 5, 13], Distribution::Default, &device);
        let g_expected = (expected * probe.clone()).sum().backward();
        let g_actual = (actual * probe).sum().backward();
        let close = |actual: Option<Tensor<Flex, 1>>, expected: Option<Tensor<Flex, 1>>| {
            actual
                .unwrap()
                .into_data()
                .assert_approx_eq::<f32>(&expected.unwrap().into_data(), Tolerance::absolute(1e-5));
        };
        x.grad(&g_actual)
            .unwrap()
            .into_data()
            .assert_approx_eq::<f32>(
                &x.grad(&g_expected).unwrap().into_data(),
                Tolerance::absolute(1e-5),
            );
        close(
            ours.gamma.grad(&g_actual),
            burn_norm.gamma.grad(&g_expected),
        );
        let burn_beta = burn_norm.beta.as_ref().unwrap();
        close(ours.beta.grad(&g_actual), burn_beta.grad(&g_expected));
    }
}
