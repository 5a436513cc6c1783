//! A strategy configuration that cannot work: what resolving a plan, or a strategy's own
//! settings, refuses before any rank starts.

use crate::optim::Precision;
use crate::plan::StrategyKind;

/// A strategy configuration that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// `auto`'s planner found no layout of the ranks that fits the model.
    #[error("auto: {0}")]
    Unplannable(#[from] crate::plan::cost::PlanError),
    /// Mixed precision asked of a strategy that splits the model.
    #[error(
        "precision {precision} does not run under {strategy} with pipeline stages yet \
         (MixedPrecision wraps a whole model's or a tensor-parallel shard's step, not a \
         pipeline stage's); use single, data_parallel, ddp or tensor without stages, or f32"
    )]
    PrecisionUnsupported {
        /// The precision asked for.
        precision: Precision,
        /// The strategy.
        strategy: StrategyKind,
    },
    /// `auto`'s degrees, as the user set them, against what the run fixes.
    #[error(
        "auto: [parallel.auto] (or its flags) fixes {user}, against {run} ({because}); drop \
         the setting or make it agree"
    )]
    AutoFixedApart {
        /// What the user fixed.
        user: String,
        /// What the run fixes.
        run: String,
        /// Why the run fixes it (a checkpoint's layout, the precision).
        because: String,
    },
    /// `auto`'s micro-batches named twice, apart: under `auto` gradient accumulation is the
    /// replicas' micro-batches.
    #[error(
        "auto: its micro-batches are set twice, apart: {micro_batches} ([parallel.auto] \
         micro_batches or --micro-batches) and a gradient accumulation of {accumulation} \
         ([parallel.ddp] grad_accumulation or --grad-accum); under auto both name the \
         micro-batches each replica cuts its samples into: set one"
    )]
    AutoMicroBatchesApart {
        /// `[parallel.auto] micro_batches`.
        micro_batches: usize,
        /// The accumulation `auto` reads (`[parallel.ddp]`'s).
        accumulation: usize,
    },
    /// No device to train on.
    #[error("no device given; pass at least one device (the CPU device may repeat)")]
    NoDevices,
    /// `Single` asked to run on several ranks.
    #[error(
        "the single strategy trains on one rank but {ranks} were asked for; use world 1, or \
         data_parallel, ddp or auto"
    )]
    SingleWithMany {
        /// Ranks asked for.
        ranks: usize,
    },
    /// Gradient accumulation of zero micro-steps.
    #[error("grad_accumulation must be at least 1 (1 means no accumulation)")]
    ZeroAccumulation,
    /// A bucket cap that is not a positive size.
    #[error("bucket_cap_mb must be a positive number of MiB, got {0}")]
    BucketCap(f64),
    /// A collective timeout that is not positive, or longer than a week.
    #[error(
        "collective_timeout_s must be a positive number of seconds up to a week (604800), got {0}"
    )]
    Timeout(f64),
    /// Threads per rank out of range.
    #[error(
        "threads_per_rank is {0}; it must be 1 to {MAX_THREADS_PER_RANK} (a rank's intra-op \
         threads: this machine's cores shared among its ranks, or fewer)"
    )]
    Threads(usize),
    /// A world that spans processes given to a strategy that cannot span them.
    #[error("the world spans {processes} processes, but {strategy} cannot: {reason}")]
    MultiProcess {
        /// The strategy.
        strategy: StrategyKind,
        /// Processes in the world.
        processes: usize,
        /// Why, and what to do instead.
        reason: &'static str,
    },
    /// Ranks that do not divide among the processes.
    #[error(
        "{world} ranks do not divide among {processes} processes; every process holds the same \
         number of ranks, so make --world a multiple of the processes (or leave it unset)"
    )]
    WorldNotDivisible {
        /// Ranks in all.
        world: usize,
        /// Processes.
        processes: usize,
    },
    /// This process's model has another number of parameters than the first process's.
    #[error(
        "this process's model has {ours} parameter tensors but the first process's has \
         {theirs}; every process must build the same model"
    )]
    ModelDiffers {
        /// This process's.
        ours: usize,
        /// The first process's.
        theirs: usize,
    },
    /// The processes could not be connected.
    #[error(transparent)]
    Connect(#[from] crate::collective::ConnectError),
    /// A mesh that splits the model (pipeline or tensor axes) given to a strategy that
    /// replicates it whole.
    #[error(
        "{strategy} keeps a whole replica on every rank, but mesh {mesh} also splits the model; \
         give it a mesh with only a dp axis (World::local does), or use a strategy that splits"
    )]
    MeshSplitsTheModel {
        /// The strategy.
        strategy: &'static str,
        /// The mesh, as `dp=2 × pp=2`.
        mesh: String,
    },
    /// `shard_state = "optimizer"` with an optimizer whose state is not kept per parameter.
    #[error(
        "ddp: shard_state = \"optimizer\" needs an optimizer that keeps its state per \
         parameter (Burn's optimizers and the fused AdamW do; implement \
         GuardedOptimizer::retain_state and merge_state for your own), or use \
         shard_state = \"none\""
    )]
    StateNotSplittable,
    /// `gather_units` without ZeRO-3.
    #[error(
        "gather_units gathers released parameters unit by unit, but shard_state is \"{0}\"; \
         set shard_state = \"parameters\" or leave gather_units off"
    )]
    GatherUnitsWithoutZero3(&'static str),
    /// A strategy asked of a model that lacks the contract it needs.
    #[error(
        "{strategy} needs a model that implements kiln_core::model::{contract}, but this one \
         does not (its ParallelModel says {capability} = Unsupported); use single, \
         data_parallel or ddp, or implement it"
    )]
    Unsupported {
        /// What was asked: `pipeline`, `tensor`, `stages under tensor`, `precision bf16`.
        strategy: String,
        /// The contract missing.
        contract: &'static str,
        /// The capability of `ParallelModel` that says so.
        capability: &'static str,
    },
    /// A model that cannot be sharded as asked.
    #[error(transparent)]
    Shard(#[from] crate::model::ShardError),
    /// More accumulation micro-batches than samples in a step.
    #[error(
        "grad_accumulation of {micro_batches} micro-batches exceeds the global batch of {batch} \
         samples; accumulate at most {batch}"
    )]
    AccumulationExceedsBatch {
        /// Micro-batches asked for.
        micro_batches: usize,
        /// The global batch.
        batch: usize,
    },
    /// Zero data-parallel replicas.
    #[error("dp must be at least 1 (the number of data-parallel replicas)")]
    ZeroReplicas,
    /// A mesh beyond what one process drives (or beyond counting).
    #[error(
        "the mesh ({ranks}) is more than the {} ranks one process drives; lower --dp, \
         --stages, --tp or --world",
        crate::world::MAX_LOCAL_RANKS
    )]
    TooManyRanks {
        /// The degrees, described.
        ranks: String,
    },
    /// Tensor parallelism of zero shards.
    #[error("tp must be at least 1")]
    ZeroShards,
    /// A world that is not the product of the degrees.
    #[error(
        "the world has {world} ranks, which is not dp × (stages × shards) = {} × {model_parallel}; \
         give a world that is a multiple of {model_parallel}, or name only --dp",
        if *dp == 0 { "?".to_string() } else { dp.to_string() }
    )]
    WorldNotMesh {
        /// Ranks named.
        world: usize,
        /// Replicas named (0: not named).
        dp: usize,
        /// Ranks of one replica: its pipeline stages times its tensor-parallel shards.
        model_parallel: usize,
    },
    /// Devices that are not the plan's ranks.
    #[error("{devices} device(s) given for the plan {plan}; give one device per rank")]
    DevicesNotPlan {
        /// Devices given.
        devices: usize,
        /// The plan.
        plan: String,
    },
    /// A global batch smaller than the data-parallel replicas.
    #[error(
        "the global batch of {batch} is smaller than the {replicas} data-parallel replicas: \
         every replica needs at least one sample per step; use a batch of at least {replicas}"
    )]
    BatchSmallerThanReplicas {
        /// The global batch.
        batch: usize,
        /// Replicas.
        replicas: usize,
    },
    /// A setting that the configuration as a whole would ignore.
    #[error("{setting} has no effect {when}; {fix}")]
    Ignored {
        /// The setting.
        setting: &'static str,
        /// In which configuration.
        when: &'static str,
        /// What to do instead.
        fix: &'static str,
    },
    /// A pipeline of zero stages.
    #[error("stages must be at least 1")]
    ZeroStages,
    /// A pipeline flush of zero micro-batches.
    #[error("micro_batches must be at least 1")]
    ZeroMicroBatches,
    /// `auto`'s per-device memory limits cannot be read.
    #[error("auto: max_memory {text:?} cannot be read: {why}")]
    MaxMemory {
        /// The limits as given.
        text: String,
        /// What is wrong with them.
        why: String,
    },
    /// Memory limits for `auto` where nothing plans against them: without a model described
    /// to the planner, `auto` runs full replicas unmeasured.
    #[error(
        "auto: max_memory and memory_margin bound the planner's layouts, but this run gives \
         the planner no model to measure (auto then runs a full replica per rank); drop them, \
         or name the strategy and its layout"
    )]
    LimitsWithoutPlanner,
    /// `auto`'s memory margin is not a size.
    #[error("auto: memory_margin {text:?} cannot be read: {why}")]
    MemoryMargin {
        /// The margin as given.
        text: String,
        /// What is wrong with it.
        why: String,
    },
    /// More stages than the model has blocks to split between.
    #[error(
        "the pipeline has {stages} stages but the model has {blocks} blocks to split between; \
         use at most {blocks} stages"
    )]
    TooManyStages {
        /// Stages asked for.
        stages: usize,
        /// The model's blocks.
        blocks: usize,
    },
    /// `stage_blocks` naming another number of stages than `stages`.
    #[error(
        "stage_blocks lists {} stages ({blocks:?}) but the pipeline has {stages}; give one count \
         of blocks per stage, first to last, or set stages to {}",
        .blocks.len(),
        .blocks.len()
    )]
    StageBlocksCount {
        /// The counts given.
        blocks: Vec<usize>,
        /// Stages asked for.
        stages: usize,
    },
    /// A stage of no blocks in `stage_blocks`.
    #[error(
        "stage_blocks gives stage {stage} no blocks ({blocks:?}); every stage needs at least one \
         (use fewer stages instead)"
    )]
    EmptyStage {
        /// The empty stage, from 0.
        stage: usize,
        /// The counts given.
        blocks: Vec<usize>,
    },
    /// `stage_blocks` that do not add up to the model's blocks.
    #[error(
        "stage_blocks {blocks:?} add up to {} blocks but the model has {model_blocks}; the \
         counts must cover every block once",
        .blocks.iter().map(|&n| n as u128).sum::<u128>()
    )]
    StageBlocksSum {
        /// The counts given.
        blocks: Vec<usize>,
        /// The model's blocks.
        model_blocks: usize,
    },
    /// `stage_blocks` given to `auto`, which plans its own stages.
    #[error(
        "stage_blocks {blocks:?} is set, but auto plans its own stages (as even as the blocks \
         allow); remove it, or choose pipeline or tensor to keep these boundaries"
    )]
    StageBlocksUnderAuto {
        /// The counts given.
        blocks: Vec<usize>,
    },
    /// A split the model cannot train exactly ([`PipelineModel::check_split`]).
    ///
    /// [`PipelineModel::check_split`]: crate::model::PipelineModel::check_split
    #[error("the model cannot be split into {stages} pipeline stages: {reason}")]
    SplitRefused {
        /// Stages asked for.
        stages: usize,
        /// The model's reason, with what to do instead.
        reason: String,
    },
    /// A world that is not `dp × stages` ranks.
    #[error(
        "a pipeline of {stages} stages needs a world of dp × {stages} ranks (a mesh with axes \
         dp and pp = {stages}), but the world has {world_size} ranks as mesh {mesh}"
    )]
    PipelineMesh {
        /// The world's mesh.
        mesh: String,
        /// Stages asked for.
        stages: usize,
        /// Ranks in the world.
        world_size: usize,
    },
    /// More micro-batches than a replica has samples.
    #[error(
        "{micro_batches} micro-batches but a replica's shard of the global batch of {batch} \
         (over {replicas} replica(s)) has only {samples} samples; use at most {samples} \
         micro-batches or a larger batch"
    )]
    MicroBatchesExceedBatch {
        /// Micro-batches asked for.
        micro_batches: usize,
        /// Samples of the smallest shard.
        samples: usize,
        /// The global batch.
        batch: usize,
        /// Data-parallel replicas.
        replicas: usize,
    },
    /// A thread pool for a rank could not be built.
    #[error("could not start the thread pool of rank {rank}: {reason}")]
    ThreadPool {
        /// The rank.
        rank: usize,
        /// The pool builder's message.
        reason: String,
    },
}

/// The longest collective timeout a config may set, in seconds: a week.
pub const MAX_TIMEOUT_S: f64 = 604_800.0;

/// The most intra-op threads a rank may have. Beyond the cores, threads only take turns; far
/// beyond, a pool of them takes minutes to start (rayon would start up to 65535).
pub const MAX_THREADS_PER_RANK: usize = 1024;

/// Checks a rank's intra-op threads.
pub(crate) fn check_threads(threads: usize) -> Result<(), ConfigError> {
    match threads {
        1..=MAX_THREADS_PER_RANK => Ok(()),
        _ => Err(ConfigError::Threads(threads)),
    }
}

/// Checks the settings that Ddp and Pipeline share.
pub(crate) fn check_shared_settings(
    grad_accumulation: usize,
    bucket_cap_mb: f64,
    collective_timeout_s: f64,
    threads_per_rank: Option<usize>,
) -> Result<(), ConfigError> {
    if grad_accumulation == 0 {
        return Err(ConfigError::ZeroAccumulation);
    }
    if !(bucket_cap_mb > 0.0 && bucket_cap_mb.is_finite()) {
        return Err(ConfigError::BucketCap(bucket_cap_mb));
    }
    // A week is longer than any collective waits for a live peer; beyond it, a wait is a
    // hang (and past 2^64 seconds not even a `Duration`).
    if !(collective_timeout_s > 0.0 && collective_timeout_s <= MAX_TIMEOUT_S) {
        return Err(ConfigError::Timeout(collective_timeout_s));
    }
    if let Some(threads) = threads_per_rank {
        check_threads(threads)?;
    }
    Ok(())
}
