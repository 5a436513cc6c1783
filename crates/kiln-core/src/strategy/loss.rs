//! Reading the loss out of a training step's output.

use burn::tensor::{ElementConversion, backend::Backend};
use burn::train::{
    ClassificationOutput, MultiLabelClassificationOutput, RegressionOutput, SequenceOutput,
};

/// A training step's output that carries the mean loss of its batch.
///
/// Implemented for burn-train's output types; implement it for your own output type to train
/// it with Kiln.
pub trait StepLoss {
    /// The mean loss of the step's batch, read back to the host.
    fn loss(&self) -> f64;
}

macro_rules! step_loss_from_field {
    ($($output:ident),*) => {$(
        impl<B: Backend> StepLoss for $output<B> {
            fn loss(&self) -> f64 {
                self.loss.clone().into_scalar().elem()
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
