//! The data path of every strategy: which samples make a global batch, which rank reads
//! which of them, and how a rank turns sample indices into a model input on its device.
//!
//! Strategies are driven by the *indices* of a global batch ([`EpochSampler`]), never by a
//! tensor built on one device: each rank loads only its own shard ([`ShardPolicy`]) from the
//! shared [`DataSource`], on its own thread and device, as it would in its own process.

mod sampler;
mod shard;
mod source;
mod upload;

pub use sampler::{EpochSampler, Remainder};
pub use shard::{ShardPolicy, split_even};
pub use source::DataSource;
pub use upload::{dense_float_tensor, dense_tensor};

/// Error in the data path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    /// A sample index past the end of the data set.
    #[error("sample index {index} is out of range for a data set of {len} samples")]
    IndexOutOfRange {
        /// The index asked for.
        index: usize,
        /// The data set's length.
        len: usize,
    },
    /// A global batch size of zero.
    #[error("the global batch size must be at least 1")]
    EmptyBatch,
    /// Lengths to group batches by that are not one a sample.
    #[error("{lengths} lengths given to group a data set of {len} samples by")]
    Lengths {
        /// Lengths given.
        lengths: usize,
        /// Samples in the data set.
        len: usize,
    },
    /// A data set too small for one global batch.
    #[error(
        "the data set has {len} samples, fewer than one global batch of {global_batch}; \
         use a smaller batch or more data"
    )]
    TooFewSamples {
        /// Samples in the data set.
        len: usize,
        /// The global batch size.
        global_batch: usize,
    },
    /// A global batch that cannot give every rank a sample under the chosen policy.
    #[error(
        "a global batch of {global_batch} samples cannot be sharded over {world_size} ranks \
         with policy {policy:?}: every rank needs at least one sample; use a global batch of \
         at least {world_size}"
    )]
    BatchSmallerThanWorld {
        /// The global batch size.
        global_batch: usize,
        /// Ranks to shard over.
        world_size: usize,
        /// The sharding policy.
        policy: ShardPolicy,
    },
}
