//! The PerformanceOptimizer's guards through every strategy.
//!
//! - Global-norm clipping: `k` steps of every strategy at worlds 1–4 (and the pipeline at
//!   2 × 1, 3 × 1, 2 × 2 stages × replicas) with clipping give the parameters of plain
//!   single-device training that clips by the global norm by hand, within 1e-5 relative.
//! - The NaN/Inf guard: a NaN injected into one rank's gradient is reported with the
//!   parameter's path, the rank and the step; under `halt` every rank returns that error, under
//!   `skip` every replica stays identical and unchanged for that step and training goes on.

mod common;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use burn::train::{RegressionOutput, TrainOutput, TrainStep};
use common::*;
use kiln::core::data::{DataSource, ShardPolicy};
use kiln::core::model::{ParallelModel, TrainModel};
use kiln::core::optim::{NanPolicy, NonFinite, NonFiniteValue, PerformanceConfig};
use kiln::core::strategy::{
    PerformanceSpec, RankError, ShardState, StepOutput, Strategy, StrategyConfigs, StrategyError,
    StrategyKind, StrategyModel, build,
};

const STEPS: usize = 3;
/// Small enough that every step of every case clips (the tests check they did).
const MAX_NORM: f64 = 0.05;

type Inner = <B as AutodiffBackend>::InnerBackend;

/// Every strategy's settings for the tests: one thread per rank, replicas checked bit for bit
/// after every Ddp step, a short collective timeout.
fn configs(accumulation: usize, stages: usize) -> StrategyConfigs {
    let mut configs = StrategyConfigs::default();
    configs.set_grad_accumulation(accumulation);
    configs.set_threads_per_rank(1);
    configs.ddp.check_replicas_every = Some(1);
    configs.ddp.collective_timeout_s = 60.0;
    configs.pipeline.collective_timeout_s = 60.0;
    configs.pipeline.stages = stages;
    configs.pipeline.micro_batches = 2;
    configs
}

fn guarded(config: PerformanceConfig) -> PerformanceSpec<AdamWConfig> {
    PerformanceSpec::new(AdamWConfig::new(), config).unwrap()
}

/// The global L2 norm of `grads`, read value by value in f64: the test's own arithmetic.
fn global_norm<M: AutodiffModule<B>>(model: &M, grads: &GradientsParams) -> f64 {
    struct Norm<'a>(&'a GradientsParams, f64);
    impl ModuleVisitor<B> for Norm<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(grad) = self.0.get::<Inner, D>(param.id) {
                let values = grad.into_data().to_vec::<f32>().unwrap();
                self.1 += values.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>();
            }
        }
    }
    let mut norm = Norm(grads, 0.0);
    model.visit(&mut norm);
    norm.1.sqrt()
}

/// Every gradient times `factor`.
fn scaled<M: AutodiffModule<B>>(model: &M, grads: GradientsParams, factor: f64) -> GradientsParams {
    struct Scale(GradientsParams, f64);
    impl ModuleMapper<B> for Scale {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            if let Some(grad) = self.0.remove::<Inner, D>(param.id) {
                self.0.register(param.id, grad.mul_scalar(self.1));
            }
            param
        }
    }
    let mut scale = Scale(grads, factor);
    let _ = model.clone().map(&mut scale);
    scale.0
}

/// Plain single-device Burn training that clips by the global norm as PyTorch's
/// `clip_grad_norm_` does, by hand; returns the model and each step's norm before clipping.
fn clipped_reference<M, I, Bt>(case: &Case<M, I, Bt>, batches: &[Vec<usize>]) -> (M, Vec<f64>)
where
    M: TrainModel<B>,
    I: Clone + Send + Sync,
    Bt: Batcher<B, I, M::Input>,
{
    let device = Default::default();
    let mut optim = AdamWConfig::new().init::<B, M>();
    let mut model = case.model.clone();
    let mut norms = Vec::new();
    for batch in batches {
        let items = batch
            .iter()
            .map(|&i| case.dataset.get(i).unwrap())
            .collect();
        let grads = model.step(case.batcher.batch(items, &device)).grads;
        let norm = global_norm(&model, &grads);
        let grads = if norm > MAX_NORM {
            scaled(&model, grads, MAX_NORM / (norm + 1e-6))
        } else {
            grads
        };
        norms.push(norm);
        model = optim.step(LR, model, grads);
    }
    (model, norms)
}

fn train<M, I, Bt>(
    kind: StrategyKind,
    world: usize,
    configs: &StrategyConfigs,
    spec: &PerformanceSpec<AdamWConfig>,
    case: &Case<M, I, Bt>,
    batches: &[Vec<usize>],
) -> (M, Vec<StepOutput>)
where
    M: StrategyModel<B>,
    I: Clone + Send + Sync + 'static,
    Bt: Batcher<B, I, M::Input> + Clone + 'static,
{
    let devices = vec![Default::default(); world];
    let batch = batches.first().map_or(world, Vec::len);
    let mut strategy = build(
        &plan(kind, world, configs, batch),
        devices,
        case.model.clone(),
        spec,
        case.source(),
    )
    .unwrap_or_else(|e| panic!("{kind} world {world}: {e}"));
    let outputs = batches
        .iter()
        .map(|batch| strategy.step(batch, LR).unwrap())
        .collect();
    (strategy.model().unwrap(), outputs)
}

/// `kind` on `world` ranks (a pipeline of `stages` stages × `world / stages` replicas) with
/// clipping, against the clipped reference.
fn check_clipped<M, I, Bt>(
    name: &str,
    case: &Case<M, I, Bt>,
    kind: StrategyKind,
    world: usize,
    stages: usize,
) where
    M: StrategyModel<B>,
    I: Clone + Send + Sync + 'static,
    Bt: Batcher<B, I, M::Input> + Clone + 'static,
{
    check_clipped_with(name, case, kind, world, &configs(2, stages));
}

/// [`check_clipped`] with `configs`.
fn check_clipped_with<M, I, Bt>(
    name: &str,
    case: &Case<M, I, Bt>,
    kind: StrategyKind,
    world: usize,
    configs: &StrategyConfigs,
) where
    M: StrategyModel<B>,
    I: Clone + Send + Sync + 'static,
    Bt: Batcher<B, I, M::Input> + Clone + 'static,
{
    let stages = configs.pipeline.stages;
    // 11 samples divide by none of 2, 3, 4; accumulation 2 cuts the shards unevenly again.
    let batches = batches(case.dataset.len(), 11, STEPS);
    let (expected, norms) = clipped_reference(case, &batches);
    assert!(
        norms.iter().all(|&n| n > MAX_NORM),
        "{name}: every step must clip, norms {norms:?}"
    );
    let spec = guarded(PerformanceConfig::new().with_clip_norm(Some(MAX_NORM)));
    let (actual, outputs) = train(kind, world, configs, &spec, case, &batches);
    let what = format!(
        "clipped {name} {kind} world {world} ({stages} stage(s), shard_state {})",
        configs.ddp.shard_state
    );
    for (step, (out, norm)) in outputs.iter().zip(&norms).enumerate() {
        let report = out.guard.expect("a guarded step reports");
        assert!(!report.skipped, "{what}: step {step} skipped");
        // The first step's gradients are the same computation; later ones differ by the
        // strategies' rounding of the parameters they were taken at.
        let tolerance = if step == 0 { 1e-5 } else { 1e-3 };
        assert!(
            (report.grad_norm - norm).abs() <= tolerance * norm,
            "{what}: step {step} norm {} against the reference's {norm}",
            report.grad_norm
        );
    }
    assert_equivalent(&actual, &expected, &case.model, &what);
}

macro_rules! clipping {
    ($($name:ident: $kind:ident, $world:literal;)*) => {$(
        mod $name {
            use super::*;

            #[test]
            fn mlp() {
                check_clipped("mlp", &mlp_case(2, 16), StrategyKind::$kind, $world, 1);
            }

            #[test]
            fn transformer() {
                check_clipped("transformer", &transformer_case(), StrategyKind::$kind, $world, 1);
            }

            #[test]
            fn ad_model() {
                check_clipped("AD model", &ad_case(), StrategyKind::$kind, $world, 1);
            }

            #[test]
            fn qlora_model() {
                check_clipped("QLoRA model", &qlora_case(), StrategyKind::$kind, $world, 1);
            }
        }
    )*};
}

clipping! {
    clipped_single: Single, 1;
    clipped_data_parallel_1: DataParallel, 1;
    clipped_data_parallel_2: DataParallel, 2;
    clipped_data_parallel_3: DataParallel, 3;
    clipped_data_parallel_4: DataParallel, 4;
    clipped_ddp_1: Ddp, 1;
    clipped_ddp_2: Ddp, 2;
    clipped_ddp_3: Ddp, 3;
    clipped_ddp_4: Ddp, 4;
}

/// Ddp with the optimizer state split among the replicas (ZeRO-1), the reduced gradients too
/// (ZeRO-2), and the parameters between steps (ZeRO-3): the norm is still the whole model's
/// (under ZeRO-2 and -3 the sum of the owners' parts), each owner clips its own parameters by
/// it.
mod clipped_zero {
    use super::*;

    fn zero(stage: ShardState) -> StrategyConfigs {
        let mut configs = configs(2, 1);
        configs.ddp.shard_state = stage;
        configs
    }

    #[test]
    fn mlp_transformer_and_qlora_model_over_2_3_and_4_replicas() {
        for stage in [
            ShardState::Optimizer,
            ShardState::Gradients,
            ShardState::Parameters,
        ] {
            let ddp = StrategyKind::Ddp;
            for world in [2, 3, 4] {
                check_clipped_with("mlp", &mlp_case(2, 16), ddp, world, &zero(stage));
            }
            check_clipped_with("transformer", &transformer_case(), ddp, 3, &zero(stage));
            check_clipped_with("QLoRA model", &qlora_case(), ddp, 2, &zero(stage));
        }
    }
}

/// The pipeline: the global norm sums every stage's gradients (and counts each stage once over
/// its replicas).
mod clipped_pipeline {
    use super::*;

    #[test]
    fn mlp_2_and_3_stages_and_2_stages_of_2_replicas() {
        let case = mlp_case(4, 16);
        for (world, stages) in [(2, 2), (3, 3), (4, 2)] {
            check_clipped("mlp", &case, StrategyKind::Pipeline, world, stages);
        }
    }

    #[test]
    fn transformer_2_stages_and_2_stages_of_2_replicas() {
        let case = transformer_case();
        for (world, stages) in [(2, 2), (4, 2)] {
            check_clipped("transformer", &case, StrategyKind::Pipeline, world, stages);
        }
    }

    #[test]
    fn ad_model_2_stages_and_2_stages_of_2_replicas() {
        let case = ad_case();
        for (world, stages) in [(2, 2), (4, 2)] {
            check_clipped("AD model", &case, StrategyKind::Pipeline, world, stages);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The NaN guard, on a model whose gradient can be poisoned on purpose.

/// Two linear layers; a batch holding a poisoned sample gets a NaN in `second.weight`'s
/// gradient while its loss stays finite, as an overflow inside one layer's backward would.
#[derive(Module, Debug)]
struct Poisonable<B: Backend> {
    first: Linear<B>,
    second: Linear<B>,
}

#[derive(Debug, Clone)]
struct PoisonItem {
    x: [f32; 4],
    y: f32,
    poisoned: bool,
}

#[derive(Debug, Clone)]
struct PoisonBatch<B: Backend> {
    x: Tensor<B, 2>,
    y: Tensor<B, 2>,
    poisoned: bool,
}

#[derive(Debug, Clone)]
struct PoisonBatcher;

impl<B: Backend> Batcher<B, PoisonItem, PoisonBatch<B>> for PoisonBatcher {
    fn batch(&self, items: Vec<PoisonItem>, device: &B::Device) -> PoisonBatch<B> {
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|i| i.x).collect();
        let y: Vec<f32> = items.iter().map(|i| i.y).collect();
        PoisonBatch {
            x: Tensor::from_data(TensorData::new(x, [n, 4]), device),
            y: Tensor::from_data(TensorData::new(y, [n, 1]), device),
            poisoned: items.iter().any(|i| i.poisoned),
        }
    }
}

impl<B: AutodiffBackend> TrainStep for Poisonable<B> {
    type Input = PoisonBatch<B>;
    type Output = RegressionOutput<B>;

    fn step(&self, batch: PoisonBatch<B>) -> TrainOutput<RegressionOutput<B>> {
        let output = self.second.forward(self.first.forward(batch.x).tanh());
        let loss = (output.clone() - batch.y.clone()).square().mean();
        let mut grads = GradientsParams::from_grads(loss.backward(), self);
        if batch.poisoned {
            let id = self.second.weight.id;
            let grad = grads.remove::<B::InnerBackend, 2>(id).unwrap();
            grads.register(id, grad.mul_scalar(f32::NAN));
        }
        TrainOutput {
            grads,
            item: RegressionOutput::new(loss, output, batch.y),
        }
    }
}

// A user's own model: it declares that it only trains whole.
impl<B: AutodiffBackend + kiln::core::tensor_parallel::TpBackend> ParallelModel<B>
    for Poisonable<B>
{
    type Pipeline = kiln::core::model::Unsupported;
    type Tensor = kiln::core::model::Unsupported;
    type LowPrecision = kiln::core::model::Unsupported;
}

/// 24 samples; sample `poisoned` (if any) poisons its batch.
fn poison_data(poisoned: Option<usize>) -> DataSource<B, PoisonItem, PoisonBatch<B>> {
    DataSource::new(InMemDataset::new(poison_items(poisoned)), PoisonBatcher)
}

fn poison_items(poisoned: Option<usize>) -> Vec<PoisonItem> {
    (0..24)
        .map(|i| {
            let f = i as f32 / 24.0;
            PoisonItem {
                x: [f, 1.0 - f, f * f, 0.5],
                y: (3.0 * f).sin(),
                poisoned: Some(i) == poisoned,
            }
        })
        .collect()
}

fn poisonable() -> Poisonable<B> {
    let device = Default::default();
    seeded::<B, _>(&device, 5, || {
        Poisonable {
            first: LinearConfig::new(4, 8).init(&device),
            second: LinearConfig::new(8, 1).init(&device),
        }
        .fork(&device)
    })
}

/// Three steps of 12 samples: 0..12, 12..24 (sample 17 may be poisoned), 0..12 again.
fn poison_batches() -> Vec<Vec<usize>> {
    vec![(0..12).collect(), (12..24).collect(), (0..12).collect()]
}

/// The rank whose shard holds sample `sample` of `batch`, for `world` replicas.
fn rank_holding(batch: &[usize], world: usize, sample: usize) -> usize {
    ShardPolicy::Uneven
        .shard(batch, world)
        .unwrap()
        .iter()
        .position(|shard| shard.contains(&sample))
        .unwrap()
}

/// `model` trained by `kind` on `world` ranks (Ddp's state split among them as `stage` says)
/// under `policy`, with sample `poisoned` poisoned.
fn poisoned_strategy(
    (kind, world, stage): (StrategyKind, usize, ShardState),
    policy: NanPolicy,
    poisoned: Option<usize>,
    model: &Poisonable<B>,
) -> Box<dyn Strategy<B, Poisonable<B>>> {
    let spec = guarded(PerformanceConfig::new().with_nan_policy(policy));
    let mut configs = configs(1, 1);
    configs.ddp.shard_state = stage;
    build(
        &plan(kind, world, &configs, world),
        vec![Default::default(); world],
        model.clone(),
        &spec,
        poison_data(poisoned),
    )
    .unwrap()
}

#[test]
fn halt_names_the_parameter_rank_and_step_on_every_rank() {
    for (kind, world, stage) in [
        (StrategyKind::Single, 1, ShardState::None),
        (StrategyKind::DataParallel, 3, ShardState::None),
        (StrategyKind::Ddp, 3, ShardState::None),
        (StrategyKind::Ddp, 3, ShardState::Optimizer),
        (StrategyKind::Ddp, 3, ShardState::Gradients),
        (StrategyKind::Ddp, 3, ShardState::Parameters),
    ] {
        let batches = poison_batches();
        let culprit = rank_holding(&batches[1], world, 17);
        let model = poisonable();
        let run = (kind, world, stage);
        let mut strategy = poisoned_strategy(run, NanPolicy::Halt, Some(17), &model);
        strategy.step(&batches[0], LR).unwrap();
        let error = strategy.step(&batches[1], LR).unwrap_err();
        let expected = RankError::NonFinite(NonFinite {
            shard: None,
            step: 2,
            rank: Some(culprit),
            value: NonFiniteValue::Gradient {
                param: Some("second.weight".into()),
                ordinal: 2,
            },
            ranks_affected: 1,
        });
        let StrategyError::Failed {
            culprit: blamed,
            failures,
        } = &error
        else {
            panic!("{kind}: expected a rank failure, got {error}");
        };
        assert_eq!(*blamed, culprit, "{kind}: {error}");
        // DataParallel decides once, on its main device; the others on every rank.
        let ranks = if kind == StrategyKind::DataParallel {
            1
        } else {
            world
        };
        assert_eq!(failures.len(), ranks, "{kind}: {error}");
        for failure in failures {
            assert_eq!(failure.error, expected, "{kind} rank {}", failure.rank);
        }
        let message = error.to_string();
        for needle in ["second.weight", "step 2", &format!("on rank {culprit}")] {
            assert!(
                message.contains(needle),
                "{kind}: {message:?} lacks {needle:?}"
            );
        }
        assert!(
            strategy.step(&batches[2], LR).is_err(),
            "{kind}: a halted strategy must not train on"
        );
    }
}

#[test]
fn skip_leaves_every_replica_unchanged_and_training_goes_on() {
    for (kind, world, stage) in [
        (StrategyKind::Single, 1, ShardState::None),
        (StrategyKind::DataParallel, 3, ShardState::None),
        (StrategyKind::Ddp, 3, ShardState::None),
        (StrategyKind::Ddp, 4, ShardState::None),
        (StrategyKind::Ddp, 4, ShardState::Optimizer),
        (StrategyKind::Ddp, 4, ShardState::Gradients),
        (StrategyKind::Ddp, 4, ShardState::Parameters),
    ] {
        let batches = poison_batches();
        // One model for both runs: Burn's initialisation draws from a process-wide generator
        // that other tests use at the same time.
        let model = poisonable();
        let run = (kind, world, stage);
        let mut strategy = poisoned_strategy(run, NanPolicy::Skip, Some(17), &model);
        let first = strategy.step(&batches[0], LR).unwrap();
        assert!(!first.guard.unwrap().skipped);
        let before = parameters(&strategy.model().unwrap());

        let poisoned = strategy.step(&batches[1], LR).unwrap();
        assert!(poisoned.guard.unwrap().skipped, "{kind} world {world}");
        // Ddp checks after every step that all replicas equal rank 0's, bit for bit.
        assert_eq!(parameters(&strategy.model().unwrap()), before, "{kind}");

        let after = strategy.step(&batches[2], LR).unwrap();
        assert!(!after.guard.unwrap().skipped);
        let trained = strategy.model().unwrap();

        // Training went on as if the poisoned batch had never come: the optimizer state was
        // left alone too.
        let mut clean = poisoned_strategy(run, NanPolicy::Skip, None, &model);
        clean.step(&batches[0], LR).unwrap();
        clean.step(&batches[2], LR).unwrap();
        assert_eq!(
            parameters(&trained),
            parameters(&clean.model().unwrap()),
            "{kind} world {world}: training after the skipped step"
        );
    }
}

#[test]
fn a_non_finite_loss_is_named_as_the_loss() {
    // Sample 17's target is NaN: its rank's loss is NaN, and so is every gradient behind it.
    let batches = poison_batches();
    let world = 3;
    let culprit = rank_holding(&batches[1], world, 17);
    let spec = guarded(PerformanceConfig::new());
    let mut items = poison_items(None);
    items[17].y = f32::NAN;
    let mut ddp = build(
        &plan(StrategyKind::Ddp, world, &configs(1, 1), world),
        vec![Default::default(); world],
        poisonable(),
        &spec,
        DataSource::new(InMemDataset::new(items), PoisonBatcher),
    )
    .unwrap();
    ddp.step(&batches[0], LR).unwrap();
    let error = ddp.step(&batches[1], LR).unwrap_err();
    let StrategyError::Failed { failures, .. } = &error else {
        panic!("expected a rank failure, got {error}");
    };
    for failure in failures {
        let RankError::NonFinite(report) = &failure.error else {
            panic!("rank {}: {}", failure.rank, failure.error);
        };
        assert_eq!(
            (report.step, report.rank, &report.value),
            (2, Some(culprit), &NonFiniteValue::Loss)
        );
    }
    assert!(
        error.to_string().contains("the loss is NaN or infinite"),
        "{error}"
    );
}

#[test]
fn a_pipeline_stage_names_its_own_parameter_and_the_others_its_stage() {
    // A NaN feature of sample 5 reaches only the first layer's weight gradient (ReLU zeroes
    // it on the way forward): stage 0 holds that parameter, stage 1 does not.
    let mut case = mlp_case(2, 8);
    let mut items: Vec<_> = case.dataset.iter().collect();
    items[5].features[0] = f32::NAN;
    case.dataset = InMemDataset::new(items);
    let spec = guarded(PerformanceConfig::new());
    let devices = vec![Default::default(); 2];
    let mut pipeline = build(
        &plan(StrategyKind::Pipeline, 2, &configs(1, 2), 10),
        devices,
        case.model.clone(),
        &spec,
        case.source(),
    )
    .unwrap();
    pipeline.step(&(10..20).collect::<Vec<_>>(), LR).unwrap();
    let error = pipeline.step(&(0..10).collect::<Vec<_>>(), LR).unwrap_err();
    let StrategyError::Failed { culprit, failures } = &error else {
        panic!("expected a rank failure, got {error}");
    };
    assert_eq!(*culprit, 0, "{error}");
    let names: Vec<_> = failures
        .iter()
        .map(|failure| match &failure.error {
            RankError::NonFinite(NonFinite {
                shard: None,
                step: 2,
                rank: Some(0),
                value: NonFiniteValue::Gradient { param, .. },
                ..
            }) => param.clone(),
            other => panic!("rank {}: {other}", failure.rank),
        })
        .collect();
    assert_eq!(
        names,
        [Some("hidden.0.weight".to_string()), None],
        "{error}"
    );
}

#[test]
fn a_bad_clip_norm_is_refused_with_its_name() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let error = PerformanceSpec::new(
            AdamWConfig::new(),
            PerformanceConfig::new().with_clip_norm(Some(bad)),
        )
        .unwrap_err();
        assert!(error.to_string().contains("clip_norm"), "{error}");
    }
}
