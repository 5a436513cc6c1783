//! How a model in mixed precision parallelises: whole under Single, DataParallel and Ddp, and
//! shard by shard under `Tensor`, each shard in the same precision with the same loss scale.
//! Its pipeline stages are not wrapped: the plan refuses bf16 and f16 with stages before
//! anything starts.

use burn::module::{AutodiffModule, ModuleDisplay};
use burn::tensor::backend::AutodiffBackend;
use kiln_kernels::KernelBackend;

use super::MixedPrecision;
use crate::model::{
    LowPrecisionStep, ParallelModel, ShardError, TensorCapability, TensorParallelModel, TrainModel,
    Unsupported,
};
use crate::tensor_parallel::{TpBackend, TpGroup};

// `Tensor` is the wrapped model's capability: supported exactly when the model shards and its
// shards compute in low precision too (the `where` clause), so that a model that shards
// but whose shards cannot is refused by the compiler where it declares `LowPrecision`.
#[allow(private_bounds)]
impl<B, M> ParallelModel<B> for MixedPrecision<B, M>
where
    B: AutodiffBackend<InnerBackend: KernelBackend> + TpBackend,
    M: TrainModel<B> + LowPrecisionStep<B> + ModuleDisplay + ParallelModel<B>,
    <M as AutodiffModule<B>>::InnerModule: ModuleDisplay,
    M::Tensor: TensorCapability<B, Self>,
{
    type Pipeline = Unsupported;
    type Tensor = M::Tensor;
    type LowPrecision = Unsupported;
}

impl<B, M> TensorParallelModel<B> for MixedPrecision<B, M>
where
    B: AutodiffBackend<InnerBackend: KernelBackend> + TpBackend,
    M: TensorParallelModel<B> + LowPrecisionStep<B> + ModuleDisplay,
    <M as AutodiffModule<B>>::InnerModule: ModuleDisplay,
    M::Sharded: ParallelModel<B> + LowPrecisionStep<B> + ModuleDisplay,
    <M::Sharded as AutodiffModule<B>>::InnerModule: ModuleDisplay,
    <M::Sharded as ParallelModel<B>>::Tensor: TensorCapability<B, MixedPrecision<B, M::Sharded>>,
{
    type Sharded = MixedPrecision<B, M::Sharded>;

    fn shard(&self, group: TpGroup<B>) -> Result<Self::Sharded, ShardError> {
        Ok(self.around(self.model.shard(group)?))
    }

    fn gather(shards: Vec<Self::Sharded>) -> Self {
        // Cloning a module clones handles to its tensors, not their data.
        let whole = M::gather(shards.iter().map(|s| s.model.clone()).collect());
        shards[0].around(whole)
    }
}
