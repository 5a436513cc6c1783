//! The loss of a training step's output.

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use burn::train::{
    ClassificationOutput, MultiLabelClassificationOutput, RegressionOutput, SequenceOutput,
};

/// A training step's output that carries the mean loss of its batch.
///
/// Kiln reads the loss to report it, backpropagates from it under mixed precision, and gives
/// burn-train's metrics the global batch's mean loss in place of each rank's. Implemented for
/// burn-train's output types; implement it for your own output type to train it with Kiln.
pub trait StepLoss<B: Backend>: Sized {
    /// The mean loss of the batch, `[1]`, in the graph of the step.
    fn loss_tensor(&self) -> Tensor<B, 1>;

    /// The mean loss of the batch, read back to the host.
    fn loss(&self) -> f64 {
        self.loss_tensor().into_scalar().elem()
    }

    /// The output with its loss replaced by `loss` (for metrics: the global batch's mean
    /// loss, while other metrics still read this rank's outputs).
    fn with_loss(self, loss: f64) -> Self;
}

macro_rules! step_loss_from_field {
    ($($output:ident),*) => {$(
        impl<B: Backend> StepLoss<B> for $output<B> {
            fn loss_tensor(&self) -> Tensor<B, 1> {
                self.loss.clone()
            }

            fn with_loss(mut self, loss: f64) -> Self {
                let device = self.loss.device();
                self.loss = Tensor::from_floats([loss as f32], &device);
                self
            }
        }
    )*};
}

step_loss_from_field!(
    ClassificationOutput,
    MultiLabelClassificationOutput,
    RegressionOutput,
    SequenceOutput
);
