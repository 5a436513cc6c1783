//! Setting the loss that burn-train's metrics read from a training step's output item.

use burn::tensor::{Tensor, backend::Backend};
use burn::train::{
    ClassificationOutput, MultiLabelClassificationOutput, RegressionOutput, SequenceOutput,
};

/// A training step's output whose loss can be replaced: the adapter gives every item of a
/// step the mean loss over all ranks, so the loss burn-train logs is the global batch's, while
/// other metrics (accuracy, …) still read each rank's own outputs.
///
/// Implemented for burn-train's output types; implement it for your own output type.
pub trait LossItem {
    /// The item with its loss replaced by `loss`.
    fn with_loss(self, loss: f64) -> Self;
}

macro_rules! loss_item_from_field {
    ($($output:ident),*) => {$(
        impl<B: Backend> LossItem for $output<B> {
            fn with_loss(mut self, loss: f64) -> Self {
                let device = self.loss.device();
                self.loss = Tensor::from_floats([loss as f32], &device);
                self
            }
        }
    )*};
}

loss_item_from_field!(
    ClassificationOutput,
    MultiLabelClassificationOutput,
    RegressionOutput,
    SequenceOutput
);
