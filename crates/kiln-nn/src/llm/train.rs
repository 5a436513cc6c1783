//! A [`CausalLm`] as a model Kiln trains: masked next-token cross-entropy on [`LmBatch`]es,
//! through `Single`, `DataParallel`, `Ddp` and `Pipeline` (its stages: [`super::CausalLmStage`]),
//! in f32, or in mixed precision under all but `Pipeline`. Only the parameters that require gradients train: after
//! [`CausalLm::with_lora`], the adapters.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{FloatDType, Int, Tensor};
use burn::train::{SequenceOutput, TrainOutput, TrainStep};
use kiln_core::model::{LowPrecisionStep, ParallelModel, Supported};
use kiln_kernels::ops;

use super::{CausalLm, LmBatch};
use crate::tensor_parallel::ShardedBackend;

impl<B: ShardedBackend> CausalLm<B> {
    /// The loss of `batch` and its logits: each sequence's mean cross-entropy over its
    /// trained targets, averaged over the sequences.
    ///
    /// A mean per sequence, not over every token of the batch, so that the loss of a batch
    /// is the mean of its sequences' losses: any split of the batch across ranks or
    /// micro-batches, weighted by sequence count as the strategies weight it, gives the same
    /// gradient. Each example counts the same whatever its length.
    pub fn forward_masked(&self, batch: LmBatch<B>) -> SequenceOutput<B> {
        let logits = self.forward_packed(batch.inputs, batch.packed.as_ref());
        let loss = masked_loss(logits.clone(), batch.targets.clone(), batch.mask);
        SequenceOutput::new(loss, logits, None, batch.targets)
    }
}

/// The mean over sequences of each sequence's mean cross-entropy over the targets `mask`
/// trains (a sequence training none counts 0), shape `[1]`.
pub(super) fn masked_loss<B: ShardedBackend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
    mask: Tensor<B, 2>,
) -> Tensor<B, 1> {
    per_sequence_losses(logits, targets, mask).mean()
}

/// Each sequence's mean cross-entropy over the targets `mask` trains (0 for a sequence
/// training none), shape `[batch]`.
pub(super) fn per_sequence_losses<B: ShardedBackend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
    mask: Tensor<B, 2>,
) -> Tensor<B, 1> {
    let [b, s, v] = logits.dims();
    let rows = ops::cross_entropy(logits.reshape([b * s, v]), targets.reshape([b * s]))
        .unwrap_or_else(|e| panic!("{e}"));
    // Row sums as column sums of the transposed view: over many cubes on a GPU, where Burn's
    // `sum_dim` gives each sequence one unit (one cube for a batch of long sequences).
    let counts = ops::column_sum(mask.clone().transpose()).clamp_min(1.0);
    ops::column_sum((rows.reshape([b, s]) * mask).transpose()) / counts
}

impl<B> TrainStep for CausalLm<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
    Self: AutodiffModule<B>,
{
    type Input = LmBatch<B>;
    type Output = SequenceOutput<B>;

    fn step(&self, batch: LmBatch<B>) -> TrainOutput<SequenceOutput<B>> {
        if self.gradient_checkpointing() {
            let (grads, item) = self.checkpointed_step(batch, 1.0);
            return TrainOutput { grads, item };
        }
        let output = self.forward_masked(batch);
        TrainOutput::new(self, output.loss.backward(), output)
    }
}

impl<B> LowPrecisionStep<B> for CausalLm<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
    Self: AutodiffModule<B>,
{
    fn forward_in(&self, batch: LmBatch<B>, _dtype: FloatDType) -> SequenceOutput<B> {
        // The parameters are in the low precision already and the inputs are token ids; the
        // rotary tables take the activations' dtype. The loss (a softmax over the vocabulary
        // and means over positions) is computed in f32: the fused cross-entropy reads the
        // low-precision logits as they are (no `[tokens, vocab]` cast either way).
        let logits = self.forward_packed(batch.inputs, batch.packed.as_ref());
        let loss = masked_loss(logits.clone(), batch.targets.clone(), batch.mask);
        SequenceOutput::new(loss, logits, None, batch.targets)
    }

    fn grads_in(
        &self,
        batch: LmBatch<B>,
        dtype: FloatDType,
        loss_scale: Option<f64>,
    ) -> (GradientsParams, SequenceOutput<B>) {
        if self.gradient_checkpointing() {
            return self.checkpointed_step(batch, loss_scale.unwrap_or(1.0));
        }
        kiln_core::model::backward_scaled(self, self.forward_in(batch, dtype), loss_scale)
    }
}

/// Pipeline stages split it by decoder layers, `tensor` shards its layers
/// ([`super::ShardedCausalLm`]), and it computes in bf16 or f16.
impl<B> ParallelModel<B> for CausalLm<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Pipeline = Supported;
    type Tensor = Supported;
    type LowPrecision = Supported;
}
