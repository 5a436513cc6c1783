//! Burn's `RmsNorm` module applied through Kiln's fused RMSNorm.

use burn::nn::RmsNorm;
use burn::tensor::Tensor;
use kiln_kernels::{KernelBackend, ops};

/// `norm.forward(x)` through [`ops::rms_norm`]: one kernel forward and one (plus the gain's
/// column sum) backward on the CubeCL backends, where Burn's composite launches a reduction
/// and several element-wise kernels each way, and its backward differentiates every one of
/// them. Burn's module is kept for its parameter and its name (`weight` in a Hugging Face
/// checkpoint); only the computation changes. The statistics are taken in f32 for every
/// dtype, as Burn's module and transformers' `LlamaRMSNorm` do.
pub fn rms_norm<B: KernelBackend, const D: usize>(
    norm: &RmsNorm<B>,
    x: Tensor<B, D>,
) -> Tensor<B, D> {
    ops::rms_norm(x, norm.gamma.val(), norm.epsilon as f32)
        .expect("an RmsNorm's gain is as wide as the hidden states it normalises")
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::module::Param;
    use burn::nn::RmsNormConfig;
    use burn::tensor::{Distribution, Tolerance};

    use super::*;

    type B = Autodiff<Flex>;

    /// Output and gradients (input and gain) equal Burn's `RmsNorm` on a 3-D input.
    #[test]
    fn equals_burns_rms_norm() {
        let device = Default::default();
        let mut norm = RmsNormConfig::new(13).with_epsilon(1e-5).init::<B>(&device);
        let gamma = Tensor::<B, 1>::random([13], Distribution::Uniform(0.5, 1.5), &device);
        norm.gamma = Param::from_tensor(gamma);
        let x = Tensor::<B, 3>::random([3, 5, 13], Distribution::Default, &device).require_grad();
        let probe = Tensor::<B, 3>::random([3, 5, 13], Distribution::Default, &device);
        let expected = norm.forward(x.clone());
        let actual = rms_norm(&norm, x.clone());
        let close = |a: Tensor<Flex, 3>, b: Tensor<Flex, 3>| {
            a.into_data()
                .assert_approx_eq::<f32>(&b.into_data(), Tolerance::absolute(1e-5));
        };
        close(actual.clone().inner(), expected.clone().inner());
        let g_expected = (expected * probe.clone()).sum().backward();
        let g_actual = (actual * probe).sum().backward();
        close(x.grad(&g_actual).unwrap(), x.grad(&g_expected).unwrap());
        let gain = |g| norm.gamma.grad(g).unwrap().unsqueeze::<3>();
        close(gain(&g_actual), gain(&g_expected));
    }
}
