//! The flags of a training run that every training command shares (`kiln train`, `kiln
//! finetune`): strategy, devices, steps, batch, optimizer. Each overrides the same field of
//! the command's [`TrainConfig`].

use kiln_core::optim::LrDecay;
use kiln_core::strategy::StrategyKind;

use super::{ConfigError, TrainConfig};
use crate::backend::{BackendKind, DeviceList, parse_devices};
use crate::names::strategy_parser;
use crate::optimizer_args::OptimizerArgs;
use crate::parallel_args::ParallelArgs;

/// Where and how a run trains.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Parallelism strategy [default: auto].
    #[arg(long, value_parser = strategy_parser())]
    strategy: Option<StrategyKind>,
    /// Backend [default: flex].
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Ranks (devices; CPU ranks share the CPU) [default: the length of --devices, or the
    /// product of --dp, --stages and --tp; for auto on the CPU its cores].
    #[arg(long)]
    world: Option<usize>,
    /// Device of each rank, e.g. `0,0` for two ranks on GPU 0 or `0,1` for two GPUs
    /// [default: CPU ranks share the CPU, CUDA ranks take GPUs 0..world].
    #[arg(long, value_parser = parse_devices)]
    devices: Option<DeviceList>,
    /// Optimizer steps [default: kiln train 300, kiln finetune 100].
    #[arg(long)]
    steps: Option<usize>,
    /// Global batch size, all ranks together [default: kiln train 64, kiln finetune 8].
    #[arg(long)]
    batch: Option<usize>,
    /// Seed of model, data and sample order [default: 42].
    #[arg(long)]
    seed: Option<u64>,
    /// Learning rate of AdamW [default: kiln train 0.003, kiln finetune 0.0002].
    #[arg(long, allow_negative_numbers = true)]
    lr: Option<f64>,
    /// What the learning rate does after the warm-up: stay, or fall to 0 at the last step
    /// linearly or along a cosine (transformers' formulas) [default: constant].
    #[arg(long, value_enum)]
    lr_scheduler: Option<LrSchedulerArg>,
    /// Steps of linear warm-up from 0 to --lr [default: 0].
    #[arg(long, conflicts_with = "warmup_ratio")]
    warmup_steps: Option<usize>,
    /// The warm-up as a fraction of --steps, rounded up [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    warmup_ratio: Option<f64>,
    /// AdamW's decoupled weight decay [default: kiln train 0.0001, kiln finetune 0].
    #[arg(long, allow_negative_numbers = true)]
    weight_decay: Option<f64>,
    /// Micro-batches per rank and step, gradient accumulation; under `auto`, the micro-batches
    /// of each replica's samples every layout it considers keeps, as `--micro-batches`
    /// [default: 1, the planner's choice for auto].
    #[arg(long)]
    grad_accum: Option<usize>,
    #[command(flatten)]
    parallel: ParallelArgs,
    #[command(flatten)]
    optimizer: OptimizerArgs,
    /// Intra-op threads per rank (default: cores shared evenly).
    #[arg(long)]
    threads_per_rank: Option<usize>,
}

/// `--lr-scheduler`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LrSchedulerArg {
    Constant,
    Linear,
    Cosine,
}

impl RunArgs {
    /// Writes the flags given into `c`, and returns the replicas `--dp` names for the plan.
    ///
    /// # Errors
    /// A parallelism flag the chosen strategy does not read.
    pub fn apply(self, c: &mut TrainConfig) -> Result<Option<usize>, ConfigError> {
        macro_rules! set {
            ($($flag:ident),* $(,)?) => {$(
                if let Some(v) = self.$flag { c.$flag = v; }
            )*};
        }
        set!(
            strategy,
            backend,
            steps,
            batch,
            seed,
            lr,
            warmup_steps,
            warmup_ratio,
            weight_decay
        );
        if let Some(decay) = self.lr_scheduler {
            c.lr_scheduler = match decay {
                LrSchedulerArg::Constant => LrDecay::Constant,
                LrSchedulerArg::Linear => LrDecay::Linear,
                LrSchedulerArg::Cosine => LrDecay::Cosine,
            };
        }
        if let Some(world) = self.world {
            c.world = Some(world);
        }
        if let Some(DeviceList(devices)) = self.devices {
            // The list names this process's ranks; an explicit --world must agree (checked by
            // Placement), and without one it makes the world (`Launched::world`), whatever the
            // config's `world` said.
            if self.world.is_none() {
                c.world = None;
            }
            c.devices = Some(devices);
        }
        self.optimizer.apply(&mut c.optimizer);
        if let Some(micro_batches) = self.grad_accum {
            c.parallel.set_grad_accumulation(micro_batches);
            // Named, even as 1: `auto` then keeps it rather than choosing.
            if c.strategy == StrategyKind::Auto {
                c.parallel.auto.micro_batches = Some(micro_batches);
            }
        }
        if let Some(t) = self.threads_per_rank {
            c.parallel.set_threads_per_rank(t);
        }
        Ok(self.parallel.apply(&mut c.parallel, c.strategy)?)
    }
}
