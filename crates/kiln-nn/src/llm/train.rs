//! A [`CausalLm`] as a model every replicating strategy trains: masked next-token
//! cross-entropy on [`LmBatch`]es, through `Single`, `DataParallel` and `Ddp`. Only the
//! parameters that require gradients train: after [`CausalLm::with_lora`], the adapters.

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::train::{SequenceOutput, TrainOutput, TrainStep};
use kiln_core::model::{ParallelModel, Unsupported};
use burn::tensor::Tensor;
use kiln_kernels::{KernelBackend, ops};

use super::{CausalLm, LmBatch};
use crate::tensor_parallel::ShardedBackend;

impl<B: KernelBackend> CausalLm<B> {
    /// The loss of `batch` and its logits: each sequence's mean cross-entropy over its
    /// trained targets, averaged over the sequences.
    ///
    /// A mean per sequence, not over every token of the batch, so that the loss of a batch
    /// is the mean of its sequences' losses: any split of the batch across ranks or
    /// micro-batches, weighted by sequence count as the strategies weight it, gives the same
    /// gradient. Each example counts the same whatever its length.
    pub fn forward_masked(&self, batch: LmBatch<B>) -> SequenceOutput<B> {
        let logits = self.forward(batch.inputs);
        let [b, s, v] = logits.dims();
        let rows = ops::cross_entropy(
            logits.clone().reshape([b * s, v]),
            batch.targets.clone().reshape([b * s]),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mask = batch.mask;
        let counts = mask.clone().sum_dim(1).clamp_min(1.0);
        let per_sequence: Tensor<B, 2> = (rows.reshape([b, s]) * mask).sum_dim(1) / counts;
        let loss = per_sequence.mean();
        SequenceOutput::new(loss, logits, None, batch.targets)
    }
}

impl<B> TrainStep for CausalLm<B>
where
    B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend,
    Self: AutodiffModule<B>,
{
    type Input = LmBatch<B>;
    type Output = SequenceOutput<B>;

    fn step(&self, batch: LmBatch<B>) -> TrainOutput<SequenceOutput<B>> {
        let output = self.forward_masked(batch);
        TrainOutput::new(self, output.loss.backward(), output)
    }
}

/// The stage and shard contracts are not implemented yet: `pipeline`, `tensor` and bf16/f16
/// are refused in one line naming them.
impl<B> ParallelModel<B> for CausalLm<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Pipeline = Unsupported;
    type Tensor = Unsupported;
    type LowPrecision = Unsupported;
}
