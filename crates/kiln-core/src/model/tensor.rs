//! The contract of tensor parallelism: how a model shards its layers over a tensor-parallel
//! group, and how the shards gather back into the model.
//!
//! A sharded model holds, on each rank of a `tp` group, one shard of every sharded layer
//! (built from the model's own layer: a slice of its weight) and a copy of every other
//! parameter (norms, embeddings, a head: the *replicated* parameters). The layers call the
//! group inside their forward ([`crate::tensor_parallel`]), so the sharded model trains with an
//! ordinary backward, and its gradients are the slices of the whole model's.
//!
//! Parameters keep their `ParamId`s in every shard: a replicated parameter is the same
//! parameter on every rank; a sharded one holds a different slice under the same id. Kiln
//! tells them apart by shape (a slice is smaller than the whole), which is how the guard counts
//! each replicated parameter once in the global gradient norm.

use burn::tensor::backend::AutodiffBackend;

use super::TrainModel;
use crate::tensor_parallel::{TpBackend, TpGroup};

/// Why a model cannot be sharded `tp` ways.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// A width that does not divide by the shards.
    #[error(
        "{what} ({size}) does not divide by tp = {tp}; use a tp that divides it (the \
         divisors of {size} up to {size})"
    )]
    Indivisible {
        /// What is split (`attention heads`, `d_ff`, …).
        what: String,
        /// Its size.
        size: usize,
        /// Shards asked for.
        tp: usize,
    },
    /// A split that would cut a 4-bit weight's quantisation blocks.
    #[error(
        "{what}: a shard of {rows} rows would cut the 64-value quantisation blocks of its \
         4-bit base; use a tp whose shards hold whole blocks (rows a multiple of 64)"
    )]
    QuantBlocks {
        /// The layer.
        what: String,
        /// Rows of each shard.
        rows: usize,
    },
    /// A layer that cannot be sharded in its state.
    #[error("{what} cannot be sharded: {why}")]
    Unsupported {
        /// The layer.
        what: String,
        /// Why, and what to do instead.
        why: String,
    },
    /// A shard's parameter that is neither the whole model's parameter of the same `ParamId`
    /// nor a `1/tp` slice of it along one dimension: the strategy could not tell whether its
    /// gradient is replicated over the shards or split, so clipping and the guards would be
    /// wrong.
    #[error(
        "shard parameter {path} (shape {shard:?}) {why}; a shard keeps each parameter's \
         ParamId, whole (same shape) or split along one dimension into tp = {tp} equal parts"
    )]
    Parameter {
        /// The parameter's module path in the shard.
        path: String,
        /// Its shape in the shard.
        shard: Vec<usize>,
        /// What is wrong with it.
        why: String,
        /// Shards asked for.
        tp: usize,
    },
    /// More shards than the model has of something it splits whole (heads).
    #[error("tp = {tp} is larger than the {size} {what}; use at most {size}")]
    TooMany {
        /// What is split.
        what: String,
        /// How many there are.
        size: usize,
        /// Shards asked for.
        tp: usize,
    },
}

/// A model that shards its layers over a tensor-parallel group. See the [module docs](self).
pub trait TensorParallelModel<B: AutodiffBackend + TpBackend>: TrainModel<B> {
    /// The model as one shard holds it: its own type, trained like any model on the same
    /// batches, with the same kind of output. A model that declares `Tensor = Supported`
    /// must also declare its shards' capabilities ([`ParallelModel`](super::ParallelModel)):
    /// the declaration's check asks for it, not this contract, which the declaration builds
    /// on.
    type Sharded: TrainModel<B>
        + burn::train::TrainStep<
            Input = <Self as burn::train::TrainStep>::Input,
            Output = <Self as burn::train::TrainStep>::Output,
        >;

    /// Shard `group.rank()` of `group.size()`: every sharded layer's slice, every replicated
    /// parameter as it is, each with its `ParamId`, as fresh autodiff leaves (the shards share
    /// no graph).
    ///
    /// # Errors
    /// [`ShardError`] naming a width that does not divide by the group (or a quantised base
    /// whose blocks a shard would cut, or a layer that cannot be sharded).
    fn shard(&self, group: TpGroup<B>) -> Result<Self::Sharded, ShardError>;

    /// Checks, before anything starts, that the model splits `tp` ways: shards it over a group
    /// that only knows its size ([`TpGroup::unconnected`]) and keeps the verdict.
    ///
    /// # Errors
    /// As [`Self::shard`].
    fn check_shards(&self, tp: usize) -> Result<(), ShardError> {
        self.shard(TpGroup::unconnected(tp)).map(drop)
    }

    /// The whole model from its shards, in shard order (each shard's replicated parameters are
    /// the same; the first's are taken): what training with `tensor` returns, saves and
    /// evaluates like any other.
    fn gather(shards: Vec<Self::Sharded>) -> Self;
}
