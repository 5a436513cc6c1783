//! A multi-layer perceptron classifier.

use burn::config::Config;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{FloatDType, Tensor};
use burn::train::{ClassificationOutput, TrainOutput, TrainStep};

use kiln_core::model::LowPrecisionStep;

use crate::tasks::ClassificationBatch;

/// Configuration of [`Mlp`].
#[derive(Config, Debug)]
pub struct MlpConfig {
    /// Input features.
    #[config(default = 32)]
    pub input: usize,
    /// Width of each hidden layer.
    #[config(default = 64)]
    pub hidden: usize,
    /// Hidden layers.
    #[config(default = 2)]
    pub layers: usize,
    /// Output classes.
    #[config(default = 10)]
    pub classes: usize,
}

impl MlpConfig {
    /// Builds the model on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Mlp<B> {
        let hidden = (0..self.layers)
            .map(|i| {
                let input = if i == 0 { self.input } else { self.hidden };
                LinearConfig::new(input, self.hidden).init(device)
            })
            .collect();
        let head_input = if self.layers == 0 {
            self.input
        } else {
            self.hidden
        };
        Mlp {
            hidden,
            head: LinearConfig::new(head_input, self.classes).init(device),
            activation: Relu::new(),
        }
    }
}

/// `x → (Linear → ReLU)* → Linear`, trained with cross-entropy.
///
/// # Shapes
/// Input `[batch, input]`, output `[batch, classes]`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub(super) hidden: Vec<Linear<B>>,
    pub(super) head: Linear<B>,
    activation: Relu,
}

impl<B: Backend> Mlp<B> {
    /// Class logits.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = self
            .hidden
            .iter()
            .fold(x, |x, layer| self.activation.forward(layer.forward(x)));
        self.head.forward(x)
    }

    /// Logits and mean cross-entropy of a batch.
    pub fn forward_classification(&self, batch: ClassificationBatch<B>) -> ClassificationOutput<B> {
        let output = self.forward(batch.features);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), batch.labels.clone());
        ClassificationOutput::new(loss, output, batch.labels)
    }
}

impl<B: AutodiffBackend> LowPrecisionStep<B> for Mlp<B> {
    fn forward_in(
        &self,
        batch: ClassificationBatch<B>,
        dtype: FloatDType,
    ) -> ClassificationOutput<B> {
        // The loss (a softmax and a mean over the batch) is computed in f32.
        let logits = self
            .forward(batch.features.cast(dtype))
            .cast(FloatDType::F32);
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.clone(), batch.labels.clone());
        ClassificationOutput::new(loss, logits, batch.labels)
    }
}

impl<B: AutodiffBackend> TrainStep for Mlp<B> {
    type Input = ClassificationBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ClassificationBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let output = self.forward_classification(batch);
        TrainOutput::new(self, output.loss.backward(), output)
    }
}

impl<B> kiln_core::model::ParallelModel<B> for Mlp<B>
where
    B: AutodiffBackend<InnerBackend: kiln_kernels::KernelBackend>
        + kiln_core::tensor_parallel::TpBackend,
{
    type Pipeline = kiln_core::model::Supported;
    type Tensor = kiln_core::model::Unsupported;
    type LowPrecision = kiln_core::model::Supported;
}
