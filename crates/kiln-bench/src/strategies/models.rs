//! The models the benchmark trains, with their data, and one timed round of a scenario.

use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::optim::AdamWConfig;
use burn::tensor::backend::AutodiffBackend;
use kiln_ad::dataset::{WindowBatcher, WindowDataset};
use kiln_ad::env::DarkRoomConfig;
use kiln_ad::model::AdModelConfig;
use kiln_ad::source::{QLearningConfig, learning_histories};
use kiln_core::data::{DataSource, EpochSampler};
use kiln_core::plan::Plan;
use kiln_core::strategy::StrategyModel;
use kiln_core::strategy::{RankStats, StrategyError, build};
use kiln_nn::lora::{LoraConfig, LoraKind, QuantConfig};
use kiln_nn::models::{LoraTransformerConfig, MlpConfig, TransformerConfig};
use kiln_nn::tasks::{ClassificationBatcher, FibonacciTask, SequenceBatcher, TeacherTask};
use kiln_nn::tensor_parallel::ShardedBackend;

use super::{BenchModel, Matrix, Scale, Scenario};

/// Seed of every model, data set and sample order, so rounds differ only in timing.
const SEED: u64 = 7;
const LR: f64 = 1e-3;

/// What one round of a scenario measured.
#[derive(Debug, Clone)]
pub(super) struct Round {
    /// Wall time of the timed steps.
    pub wall: Duration,
    /// Samples per step.
    pub batch: usize,
    /// Each rank's time over the timed steps.
    pub ranks: Vec<RankStats>,
}

/// Trains a fresh model of `scenario` through the strategy of `plan` on `devices` for the
/// matrix's warm-up and timed steps.
pub(super) fn run_round<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
    devices: &[B::Device],
    scenario: &Scenario,
    plan: &Plan,
    matrix: &Matrix,
) -> Result<Round, StrategyError> {
    let device = &devices[0];
    B::seed(device, SEED);
    let quick = matrix.scale == Scale::Quick;
    let pick = |quick_value: usize, full_value: usize| if quick { quick_value } else { full_value };
    let round = RoundOf {
        devices,
        scenario,
        plan,
        matrix,
    };
    // The transformer and the QLoRA transformer learn the same sequences.
    let sequences = || {
        FibonacciTask {
            samples: pick(128, 4096),
            len: 16,
            vocab: 16,
            seed: SEED,
        }
        .dataset()
    };
    match scenario.model {
        BenchModel::Mlp => {
            let model = MlpConfig::new()
                .with_hidden(pick(32, 256))
                .with_layers(pick(2, 4))
                .init::<B>(device);
            let task = TeacherTask {
                samples: pick(256, 8192),
                features: 32,
                classes: 10,
                seed: SEED,
            };
            round.train(model, task.dataset(), ClassificationBatcher)
        }
        BenchModel::Transformer => {
            let model = TransformerConfig::new()
                .with_layers(pick(2, 4))
                .init::<B>(device);
            round.train(model, sequences(), SequenceBatcher)
        }
        BenchModel::Ad => {
            let room = DarkRoomConfig::default();
            let config = AdModelConfig {
                context: pick(12, 60),
                d_model: pick(16, 64),
                d_ff: pick(32, 256),
                ..AdModelConfig::default()
            };
            let source = QLearningConfig {
                histories_per_goal: 1,
                episodes: pick(4, 40),
                ..QLearningConfig::default()
            };
            let goals = &room.cells()[..pick(4, 16)];
            let histories = Arc::new(learning_histories(room, goals, &source, SEED));
            let windows = WindowDataset::new(histories.clone(), config.context)
                .expect("the benchmark's histories are longer than its context");
            let batcher = WindowBatcher::new(histories, config.context);
            let model = config.init::<B>(&room, device);
            round.train(model, windows, batcher)
        }
        BenchModel::Qlora => {
            let model = LoraTransformerConfig::new()
                .with_layers(pick(2, 4))
                .with_d_model(pick(32, 64))
                .with_d_ff(pick(64, 256))
                .with_lora(LoraConfig::new())
                .with_kind(LoraKind::QLora(QuantConfig::new()))
                .init::<B>(device);
            round.train(model, sequences(), SequenceBatcher)
        }
    }
}

/// One round of one scenario, whatever the model.
struct RoundOf<'a, B: AutodiffBackend> {
    devices: &'a [B::Device],
    scenario: &'a Scenario,
    plan: &'a Plan,
    matrix: &'a Matrix,
}

impl<B: AutodiffBackend + ShardedBackend> RoundOf<'_, B> {
    /// The round itself, for any model.
    fn train<M, D, I, Bt>(self, model: M, dataset: D, batcher: Bt) -> Result<Round, StrategyError>
    where
        M: StrategyModel<B>,
        D: Dataset<I> + 'static,
        I: Clone + Send + Sync + 'static,
        Bt: Batcher<B, I, M::Input> + Clone + Send + Sync + 'static,
    {
        let Self {
            devices,
            scenario,
            plan,
            matrix,
        } = self;
        let data = DataSource::new(dataset, batcher);
        let batch = scenario.model.batch(matrix.scale);
        let batches: Vec<Vec<usize>> = EpochSampler::new(data.len(), batch, SEED)?
            .batches()
            .take(matrix.warmup + matrix.steps)
            .collect();
        let model = model.fork(&devices[0]);
        let mut strategy = build(plan, devices.to_vec(), model, &AdamWConfig::new(), data)?;
        for batch in &batches[..matrix.warmup] {
            strategy.step(batch, LR)?;
        }
        let before = strategy.stats();
        let start = Instant::now();
        for batch in &batches[matrix.warmup..] {
            strategy.step(batch, LR)?;
        }
        let wall = start.elapsed();
        let ranks = before
            .into_iter()
            .zip(strategy.stats())
            .map(|(before, after)| after.since(&before))
            .collect();
        Ok(Round { wall, batch, ranks })
    }
}
