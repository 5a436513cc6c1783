//! The mixed-precision contract.

use burn::tensor::FloatDType;
use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

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
}
