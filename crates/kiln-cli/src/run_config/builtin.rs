//! The built-in models with their synthetic data, handed to whatever runs them: training, or
//! the planner's timing of a step. One place builds them, so what `auto` times is what trains.

use burn::tensor::backend::AutodiffBackend;
use kiln_core::data::DataSource;
use kiln_core::fit::FitModel;
use kiln_core::plan::cost::Workload;
use kiln_kernels::FusedAdamWConfig;
use kiln_nn::models::{MlpConfig, TransformerConfig};
use kiln_nn::tasks::{ClassificationBatcher, FibonacciTask, SequenceBatcher, TeacherTask};
use kiln_nn::tensor_parallel::ShardedBackend;

use super::{ModelKind, TrainConfig};

/// The optimizer `kiln train` and `kiln finetune` train with, and the planner times: AdamW on
/// the fused kernel (one launch per parameter on a GPU, one pass on the CPU) with Burn's
/// defaults. Its state is Burn's `AdamWState`, so checkpoints are Burn AdamW's.
pub(crate) fn adamw() -> FusedAdamWConfig {
    FusedAdamWConfig::new()
}

/// Tokens of each sequence of the transformer's task.
const SEQUENCE: usize = 16;

/// Something run on a built-in model and its data, whichever the model.
pub(crate) trait ModelJob<B: AutodiffBackend + ShardedBackend> {
    /// What it returns.
    type Output;

    /// Runs on `model` and `data`.
    fn run<M, I>(self, model: M, data: DataSource<B, I, M::Input>) -> Self::Output
    where
        M: FitModel<B>,
        I: Send + Sync + Clone + 'static;
}

/// Builds `config`'s model on `device` (from its seed) and its data set, and runs `job` on
/// them.
pub(crate) fn with_builtin<B, J>(config: &TrainConfig, device: &B::Device, job: J) -> J::Output
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
    J: ModelJob<B>,
{
    B::seed(device, config.seed);
    match config.model {
        ModelKind::Mlp => {
            let model = mlp(config).init::<B>(device);
            let task = TeacherTask {
                samples: config.samples,
                features: 32,
                classes: 10,
                seed: config.seed,
            };
            job.run(
                model,
                DataSource::new(task.dataset(), ClassificationBatcher),
            )
        }
        ModelKind::Transformer => {
            let model = transformer(config).init::<B>(device);
            let task = FibonacciTask {
                samples: config.samples,
                len: SEQUENCE,
                vocab: 16,
                seed: config.seed,
            };
            job.run(model, DataSource::new(task.dataset(), SequenceBatcher))
        }
    }
}

/// What a step of `config`'s model asks of the planner.
pub(crate) fn workload(config: &TrainConfig) -> Workload {
    match config.model {
        ModelKind::Mlp => mlp(config).workload(config.batch),
        ModelKind::Transformer => transformer(config).workload(SEQUENCE, config.batch),
    }
}

/// The MLP `config` names: its own sizes, with `config.layers` hidden layers where set.
fn mlp(config: &TrainConfig) -> MlpConfig {
    let model = MlpConfig::new();
    match config.layers {
        Some(layers) => model.with_layers(layers),
        None => model,
    }
}

/// The transformer `config` names: its own sizes, with `config.layers` blocks where set.
fn transformer(config: &TrainConfig) -> TransformerConfig {
    let model = TransformerConfig::new();
    match config.layers {
        Some(layers) => model.with_layers(layers),
        None => model,
    }
}
