//! Kiln's core: who takes part ([`World`]), how ranks talk ([`Collective`]), and how a Burn
//! model is trained over them ([`Strategy`]).
//!
//! # Glossary
//! - **rank**: one participant, a device driven by one thread; `0..world_size`.
//! - **world_size**: number of ranks over all processes.
//! - **axis**: a direction of the device grid (data, pipeline, tensor); **dim** is a tensor's.
//! - **replica**: a full copy of the model on one rank (data parallelism).
//! - **shard**: a rank's part of something split: a global batch, or a weight.
//! - **stage**: a contiguous part of a model's blocks (pipeline parallelism); see [`stages`].
//! - **mesh**: the ranks arranged along named axes (`dp × pp × tp`); see [`world::Mesh`].
//! - **global batch**: the samples of one optimizer step over all ranks;
//!   **micro_batch**: the part of a rank's shard run in one forward/backward.
//!
//! # Example
//! ```no_run
//! # use kiln_core::prelude::*;
//! # fn train<B: burn::tensor::backend::AutodiffBackend, M: TrainModel<B>, O: kiln_core::optim::GuardedOptimizer<M, B> + 'static, I: Send + 'static>(
//! #     model: M, optim: O, data: DataSource<B, I, M::Input>, devices: Vec<B::Device>,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! let world = World::local(devices)?;
//! let sampler = EpochSampler::new(data.len(), 256, 42)?;
//! let mut ddp = Ddp::new(&world, model, optim, data, DdpConfig::default())?;
//! for batch in sampler.batches().take(100) {
//!     let out = ddp.step(&batch, 1e-3)?;
//!     println!("loss {:.4}", out.loss);
//! }
//! let trained = ddp.model()?;
//! # Ok(()) }
//! ```

pub mod checkpoint;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
pub mod fit;
pub mod grads;
pub mod learner;
pub mod memory;
pub mod model;
pub mod optim;
pub mod output;
pub mod params;
pub mod plan;
pub mod stages;
pub mod strategy;
pub mod tensor_parallel;

// The layer below, a crate of its own: who takes part, how ranks talk, timing statistics.
pub use kiln_collective::{collective, stats, world};

pub use collective::{Collective, CollectiveError, ReduceOp};
pub use model::TrainModel;
pub use strategy::{Strategy, StrategyError};
pub use world::{World, WorldError};

/// The names most programs need.
pub mod prelude {
    pub use crate::collective::{Collective, InProcess, ReduceOp};
    pub use crate::data::{DataSource, EpochSampler, Remainder, ShardPolicy};
    pub use crate::fit::FitModel;
    pub use crate::model::{
        ParallelModel, PipelineModel, StepLoss, Supported, TensorParallelModel, TrainModel,
        Unsupported,
    };
    pub use crate::plan::{Plan, PlanRequest};
    pub use crate::strategy::{
        DataParallel, DataParallelConfig, Ddp, DdpConfig, Pipeline, PipelineConfig, Schedule,
        ShardState, Single, SingleConfig, StepOutput, Strategy, StrategyConfigs, StrategyError,
        StrategyKind, StrategyModel, Tensor, TensorConfig,
    };
    pub use crate::tensor_parallel::{TpBackend, TpGroup};
    pub use crate::world::Mesh;
    pub use crate::world::World;
}
