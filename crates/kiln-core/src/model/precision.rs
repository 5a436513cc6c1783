//! The mixed-precision contract.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::FloatDType;
use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

use super::StepLoss;

/// A model that can compute its training output in a lower precision, so that
/// [`MixedPrecision`](crate::optim::MixedPrecision) trains it in bf16 or f16 with f32 master
/// weights.
///
/// Contract: when called, the model's parameters are already in `dtype`; the model casts its
/// float inputs (and any float tensor it creates, such as masks) to `dtype`, and returns an
/// output whose loss is the f32 mean loss of the batch.
pub trait LowPrecisionStep<B: AutodiffBackend>: TrainStep {
    /// The training output of `input`, computed in `dtype`, with an f32 loss.
    fn forward_in(&self, input: Self::Input, dtype: FloatDType) -> Self::Output;

    /// The gradients of the loss of `input` times `loss_scale`, computed in `dtype`, and the
    /// output (its loss unscaled): [`Self::forward_in`] and a backward from the scaled loss.
    /// A model that takes its gradients its own way (recomputing its activations, say)
    /// overrides it.
    fn grads_in(
        &self,
        input: Self::Input,
        dtype: FloatDType,
        loss_scale: Option<f64>,
    ) -> (GradientsParams, Self::Output)
    where
        Self: AutodiffModule<B> + Sized,
        Self::Output: StepLoss<B>,
    {
        backward_scaled(self, self.forward_in(input, dtype), loss_scale)
    }
}

/// The gradients of `output`'s loss times `loss_scale` over `model`'s parameters, and the
/// output: [`LowPrecisionStep::grads_in`]'s default, for an override to fall back on.
pub fn backward_scaled<B, M>(
    model: &M,
    output: M::Output,
    loss_scale: Option<f64>,
) -> (GradientsParams, M::Output)
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + TrainStep,
    M::Output: StepLoss<B>,
{
    let loss = output.loss_tensor();
    let loss = match loss_scale {
        Some(scale) => loss.mul_scalar(scale),
        None => loss,
    };
    (GradientsParams::from_grads(loss.backward(), model), output)
}
