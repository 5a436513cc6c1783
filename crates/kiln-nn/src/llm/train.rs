//! A [`CausalLm`] as a model every replicating strategy trains: next-token cross-entropy on
//! [`SequenceBatch`]es, through `Single`, `DataParallel` and `Ddp`. Only the parameters that
//! require gradients train: after [`CausalLm::with_lora`], the adapters.

use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::AutodiffBackend;
use burn::train::{SequenceOutput, TrainOutput, TrainStep};
use kiln_core::model::{ParallelModel, Unsupported};
use kiln_kernels::KernelBackend;

use super::CausalLm;
use crate::tasks::SequenceBatch;
use crate::tensor_parallel::ShardedBackend;

impl<B: KernelBackend> CausalLm<B> {
    /// The mean next-token cross-entropy of `batch` and its logits.
    pub fn forward_sequence(&self, batch: SequenceBatch<B>) -> SequenceOutput<B> {
        let logits = self.forward(batch.inputs);
        let [b, s, v] = logits.dims();
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(
                logits.clone().reshape([b * s, v]),
                batch.targets.clone().reshape([b * s]),
            );
        SequenceOutput::new(loss, logits, None, batch.targets)
    }
}

impl<B> TrainStep for CausalLm<B>
where
    B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend,
    Self: AutodiffModule<B>,
{
    type Input = SequenceBatch<B>;
    type Output = SequenceOutput<B>;

    fn step(&self, batch: SequenceBatch<B>) -> TrainOutput<SequenceOutput<B>> {
        let output = self.forward_sequence(batch);
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
