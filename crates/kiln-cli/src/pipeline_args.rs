//! The pipeline's flags, shared by `kiln train` and `kiln ad train`.

use kiln_core::strategy::{PipelineConfig, Schedule, StrategyKind};

use crate::names::schedule_parser;

/// `--stages`, `--micro-batches`, `--schedule`, `--dp`, `--recompute`: each overrides `[parallel.pipeline]`.
#[derive(clap::Args, Debug)]
pub struct PipelineArgs {
    /// Pipeline stages (with `--strategy pipeline`) [default: 2].
    #[arg(long)]
    stages: Option<usize>,
    /// Pipeline micro-batches per flush [default: 4].
    #[arg(long)]
    micro_batches: Option<usize>,
    /// Pipeline schedule [default: 1f1b].
    #[arg(long, value_parser = schedule_parser())]
    schedule: Option<Schedule>,
    /// Pipeline data-parallel replicas: the world becomes dp × stages ranks.
    #[arg(long)]
    dp: Option<usize>,
    /// Pipeline activation checkpointing: each stage keeps only its micro-batches' inputs and
    /// recomputes the forward in the backward (less memory, one more forward).
    #[arg(long)]
    recompute: bool,
}

impl PipelineArgs {
    /// Applies the flags to `pipeline`, and returns the world size they imply: `dp × stages`
    /// with `--dp`, or one replica of the stages for `--strategy pipeline` when nothing else
    /// (`world_given`) named the ranks and the world is still the default of 1.
    pub fn apply(
        &self,
        pipeline: &mut PipelineConfig,
        strategy: StrategyKind,
        world: usize,
        world_given: bool,
    ) -> usize {
        if let Some(stages) = self.stages {
            pipeline.stages = stages;
        }
        if let Some(micro_batches) = self.micro_batches {
            pipeline.micro_batches = micro_batches;
        }
        if let Some(schedule) = self.schedule {
            pipeline.schedule = schedule;
        }
        if self.recompute {
            pipeline.recompute = true;
        }
        match self.dp {
            Some(dp) => dp * pipeline.stages,
            None if strategy == StrategyKind::Pipeline && !world_given && world == 1 => {
                pipeline.stages
            }
            None => world,
        }
    }
}
