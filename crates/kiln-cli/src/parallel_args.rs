//! The flags that shape the mesh and its communication, shared by `kiln train` and `kiln ad
//! train`: `--dp`, `--stages`, `--tp`, the pipeline's micro-batches, schedule and
//! recomputation, the gradient buckets, and which state `ddp`'s replicas split. Each overrides the same setting of `[parallel.*]`
//! (`[parallel.auto]`'s under `auto`); a flag the chosen strategy does not read is refused,
//! not ignored.

use kiln_core::strategy::{Schedule, ShardState, StrategyConfigs, StrategyKind};

use crate::names::{schedule_parser, shard_state_parser};

/// `--dp`, `--stages`, `--stage-blocks`, `--tp`, `--micro-batches`, `--schedule`,
/// `--recompute`, `--bucket-cap-mb`, `--shard-state`, `--max-memory`, `--memory-margin`.
#[derive(clap::Args, Debug)]
pub struct ParallelArgs {
    /// Data-parallel replicas: with `pipeline` and `tensor` the world becomes
    /// dp × stages × shards ranks [default: the world over the other degrees].
    #[arg(long)]
    dp: Option<usize>,
    /// Pipeline stages of `pipeline`, or of each shard under `tensor`; under `auto`, the
    /// stages every layout it considers keeps [default: 2 for pipeline, 1 for tensor, the
    /// planner's choice for auto].
    #[arg(long)]
    stages: Option<usize>,
    /// Blocks of each pipeline stage, first to last, e.g. `--stage-blocks 10,14` (adding up to
    /// the model's blocks; their number is the stages) [default: as even as the blocks allow].
    #[arg(long, value_delimiter = ',', value_name = "N,N,..")]
    stage_blocks: Option<Vec<usize>>,
    /// Tensor-parallel shards of every sharded layer (with `--strategy tensor`; under `auto`,
    /// the shards every layout it considers keeps) [default: 2 for tensor, the planner's
    /// choice for auto].
    #[arg(long)]
    tp: Option<usize>,
    /// Pipeline micro-batches per flush; under `auto`, the micro-batches of each replica's
    /// samples every layout it considers keeps (the pipeline's with stages, gradient
    /// accumulation without) [default: 4, the planner's choice for auto].
    #[arg(long)]
    micro_batches: Option<usize>,
    /// Pipeline schedule (not under `auto`, which runs 1F1B, the schedule its memory model
    /// counts) [default: 1f1b].
    #[arg(long, value_parser = schedule_parser())]
    schedule: Option<Schedule>,
    /// Pipeline activation checkpointing: each stage keeps only its micro-batches' inputs and
    /// recomputes the forward in the backward (less memory, one more forward); under `auto`,
    /// every layout with stages it considers recomputes.
    #[arg(long)]
    recompute: bool,
    /// Largest gradient bucket of the data-parallel all-reduce, in MiB (ddp, pipeline,
    /// tensor) [default: 25].
    #[arg(long)]
    bucket_cap_mb: Option<f64>,
    /// Which training state ddp's replicas split among themselves instead of each holding it
    /// whole: `optimizer` is ZeRO-1 (each replica keeps the optimizer state of about 1 / dp
    /// of the parameters and steps those; training is unchanged), `gradients` is ZeRO-2 (as
    /// ZeRO-1, and each replica receives only those parameters' reduced gradients),
    /// `parameters` is ZeRO-3 (as ZeRO-2, and between steps each replica holds only those
    /// parameters, gathered from their owners before each forward) [default: none].
    #[arg(long, value_parser = shard_state_parser())]
    shard_state: Option<ShardState>,
    /// Under `auto`, what its planner may fill of some devices, by rank, as Accelerate's
    /// `max_memory`: `0=10GiB,1=8GiB` (the others: 90 % of their memory; on CUDA, of what is
    /// free at start).
    #[arg(long, value_name = "RANK=SIZE,..")]
    max_memory: Option<String>,
    /// Under `auto`, what its planner leaves free on every device without a --max-memory
    /// limit, e.g. `2GiB` [default: 10 % of the device; on CUDA, of what is free at start].
    #[arg(long, value_name = "SIZE")]
    memory_margin: Option<String>,
}

/// A flag given with a strategy that does not read it.
#[derive(Debug, thiserror::Error)]
#[error(
    "{flag} applies to {applies}, but the strategy is {strategy}; drop it or choose one of those"
)]
pub struct FlagError {
    flag: &'static str,
    applies: &'static str,
    strategy: StrategyKind,
}

impl ParallelArgs {
    /// Writes the flags into `configs` for `strategy` and returns `--dp`.
    ///
    /// # Errors
    /// [`FlagError`] for a flag `strategy` does not read (`--stages` with `ddp`, …).
    pub fn apply(
        &self,
        configs: &mut StrategyConfigs,
        strategy: StrategyKind,
    ) -> Result<Option<usize>, FlagError> {
        use StrategyKind::{Auto, DataParallel, Pipeline, Single, Tensor};
        let refuse = |flag, applies| FlagError {
            flag,
            applies,
            strategy,
        };
        if self.dp.is_some() && strategy == Single {
            return Err(refuse(
                "--dp",
                "data_parallel, ddp, pipeline, tensor and auto",
            ));
        }
        if let Some(mib) = self.bucket_cap_mb {
            if matches!(strategy, Single | DataParallel) {
                return Err(refuse("--bucket-cap-mb", "ddp, pipeline, tensor and auto"));
            }
            configs.set_bucket_cap_mb(mib);
        }
        if let Some(state) = self.shard_state {
            // Auto's planner splits the state itself where the whole does not fit.
            if strategy != StrategyKind::Ddp {
                return Err(refuse("--shard-state", "ddp"));
            }
            configs.ddp.shard_state = state;
        }
        if let Some(stages) = self.stages {
            match strategy {
                Pipeline => configs.pipeline.stages = stages,
                Tensor => configs.tensor.stages = stages,
                Auto => configs.auto.stages = Some(stages),
                _ => return Err(refuse("--stages", "pipeline, tensor and auto")),
            }
        }
        if let Some(tp) = self.tp {
            match strategy {
                Tensor => configs.tensor.tp = tp,
                Auto => configs.auto.tp = Some(tp),
                _ => return Err(refuse("--tp", "tensor and auto")),
            }
        }
        if let Some(blocks) = &self.stage_blocks {
            // The counts also say how many stages there are, unless --stages does.
            match strategy {
                Pipeline if self.stages.is_none() => configs.pipeline.stages = blocks.len(),
                Tensor if self.stages.is_none() => configs.tensor.stages = blocks.len(),
                Pipeline | Tensor => {}
                _ => return Err(refuse("--stage-blocks", "pipeline and tensor")),
            }
            configs.pipeline.stage_blocks = Some(blocks.clone());
        }
        if let Some(limits) = &self.max_memory {
            if strategy != Auto {
                return Err(refuse("--max-memory", "auto"));
            }
            configs.auto.max_memory = Some(limits.clone());
        }
        if let Some(margin) = &self.memory_margin {
            if strategy != Auto {
                return Err(refuse("--memory-margin", "auto"));
            }
            configs.auto.memory_margin = Some(margin.clone());
        }
        if strategy == Auto {
            if self.schedule.is_some() {
                return Err(refuse(
                    "--schedule",
                    "pipeline and tensor (with --stages); auto runs 1F1B, the schedule whose \
                     memory its planner counts,",
                ));
            }
            configs.auto.micro_batches = self.micro_batches.or(configs.auto.micro_batches);
            if self.recompute {
                configs.auto.recompute = Some(true);
            }
            return Ok(self.dp);
        }
        let pipeline_flags = [
            ("--micro-batches", self.micro_batches.is_some()),
            ("--schedule", self.schedule.is_some()),
            ("--recompute", self.recompute),
        ];
        // Tensor reads the pipeline's schedule only when it has stages.
        let staged = strategy == Pipeline || (strategy == Tensor && configs.tensor.stages > 1);
        if let Some((flag, _)) = pipeline_flags.iter().find(|(_, given)| *given && !staged) {
            return Err(refuse(flag, "pipeline and tensor (with --stages)"));
        }
        if let Some(micro_batches) = self.micro_batches {
            configs.pipeline.micro_batches = micro_batches;
        }
        if let Some(schedule) = self.schedule {
            configs.pipeline.schedule = schedule;
        }
        if self.recompute {
            configs.pipeline.recompute = true;
        }
        Ok(self.dp)
    }
}
