//! A plain Burn model trained with burn-train's `SupervisedTraining` through Kiln's `Ddp` on two
//! ranks: metrics, a checkpoint per epoch, and a resume from the first epoch's checkpoint.
//!
//! ```text
//! cargo run --release --example learner
//! ```
//! The model is an ordinary Burn module (not one of Kiln's), a two-layer classifier of points
//! inside or outside a circle. Only two things differ from single-device burn-train code: the
//! `Learner`'s optimizer is the adapter's, and the training strategy is
//! `TrainingStrategy::Custom(KilnLearning)`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::AdamWConfig;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use burn::train::metric::{AccuracyMetric, LossMetric, MetricDefinition, MetricId};
use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, LearnerSummary, SupervisedTraining, TrainOutput,
    TrainStep, TrainingStrategy,
};
use kiln::core::World;
use kiln::core::learner::{KilnLearning, SendStrategy};
use kiln::core::strategy::{Ddp, DdpConfig, Single, SingleConfig};

type B = Autodiff<Flex>;

/// A two-layer classifier: any Burn module would do.
#[derive(Module, Debug)]
pub struct Net<B: Backend> {
    hidden: Linear<B>,
    out: Linear<B>,
    relu: Relu,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(2, 32).init(device),
            out: LinearConfig::new(32, 2).init(device),
            relu: Relu::new(),
        }
    }

    fn classify(&self, batch: PointBatch<B>) -> ClassificationOutput<B> {
        let logits = self
            .out
            .forward(self.relu.forward(self.hidden.forward(batch.points)));
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.clone(), batch.labels.clone());
        ClassificationOutput::new(loss, logits, batch.labels)
    }
}

impl<B: AutodiffBackend> TrainStep for Net<B> {
    type Input = PointBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: PointBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let output = self.classify(batch);
        TrainOutput::new(self, output.loss.backward(), output)
    }
}

impl<B: Backend> InferenceStep for Net<B> {
    type Input = PointBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: PointBatch<B>) -> ClassificationOutput<B> {
        self.classify(batch)
    }
}

/// A point and whether it lies inside the circle of radius 0.6.
#[derive(Debug, Clone)]
pub struct Point {
    xy: [f32; 2],
    inside: bool,
}

/// Points `[n, 2]` and labels `[n]`.
#[derive(Debug, Clone)]
pub struct PointBatch<B: Backend> {
    points: Tensor<B, 2>,
    labels: Tensor<B, 1, Int>,
}

#[derive(Debug, Clone)]
struct PointBatcher;

impl<B: Backend> Batcher<B, Point, PointBatch<B>> for PointBatcher {
    fn batch(&self, items: Vec<Point>, device: &B::Device) -> PointBatch<B> {
        let n = items.len();
        let xy: Vec<f32> = items.iter().flat_map(|p| p.xy).collect();
        let labels: Vec<i64> = items.iter().map(|p| i64::from(p.inside)).collect();
        PointBatch {
            points: Tensor::from_data(TensorData::new(xy, [n, 2]), device),
            labels: Tensor::from_data(TensorData::new(labels, [n]), device),
        }
    }
}

/// `n` points on a deterministic spiral-ish scatter over [-1, 1]².
fn points(n: usize, offset: usize) -> InMemDataset<Point> {
    InMemDataset::new(
        (offset..offset + n)
            .map(|i| {
                let (a, r) = (i as f32 * 2.399, ((i * 7919) % 1000) as f32 / 1000.0);
                let xy = [r * a.cos(), r * a.sin()];
                Point {
                    xy,
                    inside: xy[0].hypot(xy[1]) < 0.6,
                }
            })
            .collect(),
    )
}

/// How big a run is.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    /// Training points.
    pub samples: usize,
    /// Points per batch of each rank.
    pub batch: usize,
    /// Epochs in all (a resumed run ends at the same epoch).
    pub epochs: usize,
    /// Ranks: 1 trains with Single, more with Ddp.
    pub ranks: usize,
}

/// Trains `Net` through Ddp on `size.ranks` CPU ranks (Single on one) into `dir`, resuming from
/// the checkpoint of epoch `resume` when given; returns the trained model.
pub fn train(dir: &Path, size: Size, resume: Option<usize>) -> Result<Net<Flex>, String> {
    let device = Default::default();
    B::seed(&device, 3);
    let model = Net::<B>::new(&device).fork(&device);

    // ANCHOR: adapter
    let devices = vec![device; size.ranks];
    let world = World::local(devices.clone()).map_err(|e| e.to_string())?;
    let learning = KilnLearning::new(
        devices,
        1,
        Box::new(move |model, data| {
            let optim = AdamWConfig::new().init();
            Ok(if world.world_size() == 1 {
                let config = SingleConfig {
                    threads_per_rank: Some(1),
                    ..SingleConfig::default()
                };
                Box::new(Single::new(model, optim, data, device, config)?) as SendStrategy<_, _>
            } else {
                let config = DdpConfig {
                    threads_per_rank: Some(1),
                    ..DdpConfig::default()
                };
                Box::new(Ddp::new(&world, model, optim, data, config)?)
            })
        }),
    );
    let error = learning.error_handle();
    let learner = Learner::new(model, learning.optimizer(), 1e-2);
    // ANCHOR_END: adapter

    // ANCHOR: training
    let train = DataLoaderBuilder::new(PointBatcher)
        .batch_size(size.batch)
        .build(points(size.samples, 0));
    let valid = DataLoaderBuilder::<Flex, _, _>::new(PointBatcher)
        .batch_size(size.batch)
        .build(points(size.samples / 4, 10_000));
    let mut training = SupervisedTraining::new(dir, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .with_file_checkpointer(NamedMpkFileRecorder::<FullPrecisionSettings>::new())
        .renderer(EpochLines::default())
        .with_application_logger(None)
        .num_epochs(size.epochs)
        .with_training_strategy(TrainingStrategy::Custom(Arc::new(learning)));
    if let Some(epoch) = resume {
        training = training.checkpoint(epoch);
    }
    let result = training.launch(learner);
    if let Some(error) = error.lock().map_err(|e| e.to_string())?.take() {
        return Err(error.to_string());
    }
    // ANCHOR_END: training
    Ok(result.model)
}

/// Prints one line per epoch: the last train and valid values of each metric.
#[derive(Default)]
struct EpochLines {
    names: Vec<(MetricId, String)>,
    train: Vec<(String, String)>,
    valid: Vec<(String, String)>,
}

impl EpochLines {
    fn remember(&self, list: &mut Vec<(String, String)>, state: MetricState) {
        let entry = match state {
            MetricState::Generic(entry) | MetricState::Numeric(entry, _) => entry,
        };
        let Some((_, name)) = self.names.iter().find(|(id, _)| *id == entry.metric_id) else {
            return;
        };
        let value = entry.serialized_entry.formatted;
        match list.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => list.push((name.clone(), value)),
        }
    }
}

impl MetricsRendererTraining for EpochLines {
    fn update_train(&mut self, state: MetricState) {
        let mut train = std::mem::take(&mut self.train);
        self.remember(&mut train, state);
        self.train = train;
    }

    fn update_valid(&mut self, state: MetricState) {
        let mut valid = std::mem::take(&mut self.valid);
        self.remember(&mut valid, state);
        self.valid = valid;
    }

    fn render_train(&mut self, _: TrainingProgress, _: Vec<ProgressType>) {}

    fn render_valid(&mut self, item: TrainingProgress, _: Vec<ProgressType>) {
        if item
            .progress
            .is_some_and(|p| p.items_processed >= p.items_total)
        {
            let show = |list: &[(String, String)]| {
                list.iter()
                    .map(|(n, v)| format!("{n} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            println!(
                "epoch {}: train {} | valid {}",
                item.global_progress.items_processed,
                show(&self.train),
                show(&self.valid)
            );
        }
    }

    fn on_train_end(
        &mut self,
        _: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        Ok(())
    }
}

impl MetricsRendererEvaluation for EpochLines {
    fn update_test(&mut self, _: EvaluationName, _: MetricState) {}

    fn render_test(&mut self, _: EvaluationProgress, _: Vec<ProgressType>) {}

    fn on_test_end(
        &mut self,
        _: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        Ok(())
    }
}

impl MetricsRenderer for EpochLines {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names.push((definition.metric_id, definition.name));
    }
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kiln-learner-{name}-{}", std::process::id()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let size = Size {
        samples: 4096,
        batch: 64,
        epochs: 3,
        ranks: 2,
    };
    let dir = scratch("example");
    println!(
        "Training 3 epochs through Ddp on 2 ranks into {}",
        dir.display()
    );
    train(&dir, size, None)?;
    println!("Resuming from the checkpoint of epoch 2 for the last epoch again");
    train(&dir, size, Some(2))?;
    println!("Checkpoints: {}", dir.join("checkpoint").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::data::dataloader::split::split_dataloader;
    use burn::module::{ModuleVisitor, Param};

    /// Burn's parameter initialisation draws from one process-wide generator, which `train`
    /// seeds: tests that train must not interleave.
    static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

    const TINY: Size = Size {
        samples: 96,
        batch: 8,
        epochs: 2,
        ranks: 2,
    };

    fn parameters(model: &Net<Flex>) -> Vec<Vec<f32>> {
        struct Collect(Vec<Vec<f32>>);
        impl ModuleVisitor<Flex> for Collect {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Flex, D>>) {
                self.0.push(param.val().into_data().to_vec().unwrap());
            }
        }
        let mut collect = Collect(Vec::new());
        model.visit(&mut collect);
        collect.0
    }

    #[test]
    fn a_resumed_run_ends_where_the_uninterrupted_one_does() {
        let _seeded = SEEDED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (straight, resumed) = (scratch("straight"), scratch("resumed"));
        let whole = train(&straight, TINY, None).unwrap();
        let one = Size { epochs: 1, ..TINY };
        train(&resumed, one, None).unwrap();
        let continued = train(&resumed, TINY, Some(1)).unwrap();
        for dir in [straight, resumed] {
            let _ = std::fs::remove_dir_all(dir);
        }
        assert!(
            parameters(&whole) == parameters(&continued),
            "resuming from the epoch-1 checkpoint (model, Kiln's optimizer state, scheduler) \
             must give the uninterrupted run's parameters bit for bit"
        );
    }

    #[test]
    fn a_ddp_checkpoint_resumes_in_single_and_a_single_one_in_ddp() {
        let _seeded = SEEDED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (first, then) in [(2, 1), (1, 2)] {
            let dir = scratch(&format!("cross-{first}-{then}"));
            let one = Size {
                epochs: 1,
                ranks: first,
                ..TINY
            };
            let after_one = train(&dir, one, None).unwrap();
            let resumed = Size {
                ranks: then,
                ..TINY
            };
            let after_two = train(&dir, resumed, Some(1)).unwrap();
            let _ = std::fs::remove_dir_all(&dir);
            assert!(
                parameters(&after_two) != parameters(&after_one),
                "{first} rank(s) then {then}: the resumed epoch trained"
            );
            assert!(
                parameters(&after_two)
                    .iter()
                    .flatten()
                    .all(|v| v.is_finite())
            );
        }
    }

    #[test]
    fn the_logged_loss_is_the_mean_over_the_ranks() {
        let _seeded = SEEDED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = scratch("loss");
        let one = Size { epochs: 1, ..TINY };
        train(&dir, one, None).unwrap();
        let log = std::fs::read_to_string(dir.join("train/epoch-1/Loss.log")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let logged: Vec<f64> = log
            .lines()
            .map(|line| line.split(',').next().unwrap().parse().unwrap())
            .collect();

        // The first step by hand: each rank's first batch of its half of the data, the initial
        // model's mean loss on it, then the mean over the two ranks.
        let device = Default::default();
        B::seed(&device, 3);
        let model = Net::<B>::new(&device).fork(&device);
        let loader = DataLoaderBuilder::new(PointBatcher)
            .batch_size(TINY.batch)
            .build(points(TINY.samples, 0));
        let halves = split_dataloader(loader, &[device, device]);
        let losses: Vec<f64> = halves
            .iter()
            .map(|half| {
                let batch = half.iter().next().unwrap();
                let loss = TrainStep::step(&model, batch).item.loss;
                f64::from(loss.into_scalar())
            })
            .collect();
        let mean = (losses[0] + losses[1]) / 2.0;
        assert_ne!(losses[0], losses[1], "the ranks saw different data");
        // One entry per rank's item, each the global mean.
        assert_eq!(logged.len(), 2 * TINY.samples / 2 / TINY.batch, "{log}");
        for value in &logged[..2] {
            assert!(
                (value - mean).abs() <= 1e-4 * mean.abs(),
                "logged {value}, mean over the ranks {mean} (ranks {losses:?})"
            );
        }
    }
}
