//! The causal transformer, tensor-parallel: how [`Transformer`] shards, and the model one
//! shard holds ([`TpTransformer`]), which also splits into pipeline stages.

use std::ops::Range;

use burn::module::Module;
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::transformer::TransformerEncoder;
use burn::nn::{Embedding, Linear};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{FloatDType, Int, Tensor};
use burn::train::{SequenceOutput, TrainOutput, TrainStep};
use kiln_core::model::{
    LowPrecisionStep, ParallelModel, PipelineModel, ShardError, Supported, TensorParallelModel,
    Unsupported,
};
use kiln_core::tensor_parallel::{TpBackend, TpGroup};
use kiln_kernels::KernelBackend;

use super::Transformer;
use super::transformer::{embed, sequence_loss};
use crate::tasks::SequenceBatch;
use crate::tensor_parallel::{TpEncoderLayer, fresh};

/// One tensor-parallel shard of a [`Transformer`]: its layers sharded ([`TpEncoderLayer`]),
/// the embeddings and the head replicated.
#[derive(Module, Debug)]
pub struct TpTransformer<B: TpBackend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    layers: Vec<TpEncoderLayer<B>>,
    head: Linear<B>,
}

/// Causal sharded layers over `[batch, seq, d_model]`.
fn run_layers<B: TpBackend>(layers: &[TpEncoderLayer<B>], x: Tensor<B, 3>) -> Tensor<B, 3> {
    let [batch, seq, _] = x.dims();
    let mask = generate_autoregressive_mask::<B>(batch, seq, &x.device());
    layers
        .iter()
        .fold(x, |x, layer| layer.forward(x, mask.clone()))
}

impl<B: TpBackend> TpTransformer<B> {
    /// Next-token logits at every position, the same on every shard.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let x = embed(&self.tokens, &self.positions, tokens);
        self.head.forward(run_layers(&self.layers, x))
    }
}

impl<B: AutodiffBackend<InnerBackend: TpBackend> + TpBackend> TrainStep for TpTransformer<B> {
    type Input = SequenceBatch<B>;
    type Output = SequenceOutput<B>;

    fn step(&self, batch: SequenceBatch<B>) -> TrainOutput<SequenceOutput<B>> {
        let logits = self.forward(batch.inputs);
        let loss = sequence_loss(logits.clone(), batch.targets.clone());
        let output = SequenceOutput::new(loss, logits, None, batch.targets);
        TrainOutput::new(self, output.loss.backward(), output)
    }
}

impl<B: AutodiffBackend<InnerBackend: TpBackend> + TpBackend> LowPrecisionStep<B>
    for TpTransformer<B>
{
    fn forward_in(&self, batch: SequenceBatch<B>, _dtype: FloatDType) -> SequenceOutput<B> {
        // As the whole model's: the cast parameters carry the dtype, the loss is in f32.
        let logits = self.forward(batch.inputs).cast(FloatDType::F32);
        let loss = sequence_loss(logits.clone(), batch.targets.clone());
        SequenceOutput::new(loss, logits, None, batch.targets)
    }
}

impl<B: AutodiffBackend<InnerBackend: TpBackend + KernelBackend> + TpBackend> TensorParallelModel<B>
    for Transformer<B>
{
    type Sharded = TpTransformer<B>;

    fn shard(&self, group: TpGroup<B>) -> Result<TpTransformer<B>, ShardError> {
        if self.blocks.layers.is_empty() {
            // Nothing to split, and `gather` rebuilds the encoder from its first layer.
            return Err(ShardError::Unsupported {
                what: "a transformer with no layers".to_string(),
                why: "it has no layer to split; train it with ddp".to_string(),
            });
        }
        Ok(TpTransformer {
            tokens: fresh(&self.tokens),
            positions: fresh(&self.positions),
            layers: self
                .blocks
                .layers
                .iter()
                .map(|layer| TpEncoderLayer::shard(layer, group.clone()))
                .collect::<Result<_, _>>()?,
            head: fresh(&self.head),
        })
    }

    fn gather(shards: Vec<TpTransformer<B>>) -> Self {
        let first = &shards[0];
        let layers: Vec<_> = (0..first.layers.len())
            .map(|i| {
                let parts: Vec<_> = shards.iter().map(|s| s.layers[i].clone()).collect();
                TpEncoderLayer::gather(&parts)
            })
            .collect();
        // The encoder's own fields restate its layers' shapes (sharding refused dropout).
        let one = &layers[0];
        let blocks = TransformerEncoder {
            d_model: one.mha.d_model,
            d_ff: one.pwff.linear_inner.weight.dims()[1],
            n_heads: one.mha.n_heads,
            n_layers: layers.len(),
            dropout: 0.0,
            norm_first: one.norm_first,
            quiet_softmax: one.mha.quiet_softmax,
            layers,
        };
        Transformer {
            tokens: fresh(&first.tokens),
            positions: fresh(&first.positions),
            blocks,
            head: fresh(&first.head),
        }
    }
}

impl<B: AutodiffBackend<InnerBackend: TpBackend + KernelBackend> + TpBackend> ParallelModel<B>
    for Transformer<B>
{
    type Pipeline = Supported;
    type Tensor = Supported;
    type LowPrecision = Supported;
}

impl<B: AutodiffBackend<InnerBackend: TpBackend + KernelBackend> + TpBackend> ParallelModel<B>
    for TpTransformer<B>
{
    type Pipeline = Supported;
    type Tensor = Unsupported;
    type LowPrecision = Supported;
}

/// A contiguous run of a [`TpTransformer`]'s layers; the first stage also holds the
/// embeddings, the last the head.
#[derive(Module, Debug)]
pub struct TpTransformerStage<B: TpBackend> {
    tokens: Option<Embedding<B>>,
    positions: Option<Embedding<B>>,
    layers: Vec<TpEncoderLayer<B>>,
    head: Option<Linear<B>>,
}

impl<B: AutodiffBackend<InnerBackend: TpBackend> + TpBackend> PipelineModel<B>
    for TpTransformer<B>
{
    type Stage = TpTransformerStage<B>;
    type Activation = Tensor<B, 3>;
    type FirstInput = Tensor<B, 2, Int>;
    type Target = Tensor<B, 2, Int>;
    type Context = ();

    fn num_blocks(&self) -> usize {
        self.layers.len()
    }

    fn split(&self, ranges: &[Range<usize>]) -> Vec<TpTransformerStage<B>> {
        let last = ranges.len() - 1;
        ranges
            .iter()
            .enumerate()
            .map(|(s, range)| TpTransformerStage {
                tokens: (s == 0).then(|| self.tokens.clone()),
                positions: (s == 0).then(|| self.positions.clone()),
                layers: self.layers[range.clone()].to_vec(),
                head: (s == last).then(|| self.head.clone()),
            })
            .collect()
    }

    fn split_input(batch: SequenceBatch<B>) -> (Tensor<B, 2, Int>, (), Tensor<B, 2, Int>) {
        (batch.inputs, (), batch.targets)
    }

    fn embed(stage: &TpTransformerStage<B>, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let (Some(token_table), Some(position_table)) = (&stage.tokens, &stage.positions) else {
            panic!("the first stage holds the embeddings");
        };
        embed(token_table, position_table, tokens)
    }

    fn blocks(stage: &TpTransformerStage<B>, x: Tensor<B, 3>, _: &()) -> Tensor<B, 3> {
        run_layers(&stage.layers, x)
    }

    fn loss(
        stage: &TpTransformerStage<B>,
        x: Tensor<B, 3>,
        targets: Tensor<B, 2, Int>,
    ) -> Tensor<B, 1> {
        let head = stage.head.as_ref().expect("the last stage holds the head");
        sequence_loss(head.forward(x), targets)
    }
}
