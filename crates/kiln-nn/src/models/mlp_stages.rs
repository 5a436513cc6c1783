//! The MLP as pipeline stages: its hidden layers are the blocks, the head scores the last
//! stage's output.

use std::ops::Range;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, Relu};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use kiln_core::model::PipelineModel;

use super::Mlp;
use crate::tasks::ClassificationBatch;

/// A contiguous run of an [`Mlp`]'s hidden layers; the last stage also holds the head.
#[derive(Module, Debug)]
pub struct MlpStage<B: Backend> {
    hidden: Vec<Linear<B>>,
    head: Option<Linear<B>>,
    activation: Relu,
}

impl<B: AutodiffBackend> PipelineModel<B> for Mlp<B> {
    type Stage = MlpStage<B>;
    type Activation = Tensor<B, 2>;
    type FirstInput = Tensor<B, 2>;
    type Target = Tensor<B, 1, Int>;
    type Context = ();

    fn num_blocks(&self) -> usize {
        self.hidden.len()
    }

    fn split(&self, ranges: &[Range<usize>]) -> Vec<MlpStage<B>> {
        let last = ranges.len() - 1;
        ranges
            .iter()
            .enumerate()
            .map(|(s, range)| MlpStage {
                hidden: self.hidden[range.clone()].to_vec(),
                head: (s == last).then(|| self.head.clone()),
                activation: Relu::new(),
            })
            .collect()
    }

    fn split_input(batch: ClassificationBatch<B>) -> (Tensor<B, 2>, (), Tensor<B, 1, Int>) {
        (batch.features, (), batch.labels)
    }

    fn embed(_stage: &MlpStage<B>, features: Tensor<B, 2>) -> Tensor<B, 2> {
        features
    }

    fn blocks(stage: &MlpStage<B>, x: Tensor<B, 2>, _: &()) -> Tensor<B, 2> {
        stage
            .hidden
            .iter()
            .fold(x, |x, layer| stage.activation.forward(layer.forward(x)))
    }

    fn loss(stage: &MlpStage<B>, x: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        let head = stage.head.as_ref().expect("the last stage holds the head");
        let logits = head.forward(x);
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, labels)
    }
}
