//! Shared pieces of the workspace tests: the reference models and data, a plain Burn training
//! loop as the single-device reference, and parameter comparison.

#![allow(dead_code)] // each test binary uses a different part

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
pub use burn::data::dataset::Dataset;
use burn::data::dataset::InMemDataset;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{AdamWConfig, Optimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln::ad::dataset::{WindowBatcher, WindowDataset, WindowRef};
use kiln::ad::env::DarkRoomConfig;
use kiln::ad::model::{AdModelConfig, AdTransformer};
use kiln::ad::source::{QLearningConfig, learning_histories};
use kiln::core::data::{DataSource, EpochSampler, Remainder};
use kiln::core::model::TrainModel;
use kiln::core::plan::{Plan, PlanRequest};
use kiln::core::strategy::{StrategyConfigs, StrategyKind};
use kiln::nn::lora::{LoraConfig, LoraKind, QuantConfig};
use kiln::nn::models::{
    LoraTransformer, LoraTransformerConfig, Mlp, MlpConfig, Transformer, TransformerConfig,
};
use kiln::nn::tasks::{
    ClassificationBatcher, ClassificationItem, FibonacciTask, SequenceBatcher, SequenceItem,
    TeacherTask,
};

/// The test backend: Burn's Flex CPU backend with autodiff.
pub type B = Autodiff<Flex>;

pub const LR: f64 = 1e-2;

/// Relative tolerance of the equivalence tests (book/src/concepts/equivalence.md): the relative error of the whole
/// parameter vector, `max|actual − expected| / max|expected|` over every parameter value.
///
/// Why model-wide rather than per tensor: Adam normalises every update to about `lr`, so a
/// zero-initialised bias holds only a few lr-sized steps, and the f32 rounding of its
/// cancelling gradient sums (which differ with the batch split) reaches ~1e-5 of *that*
/// tensor's tiny magnitude while staying ~1e-7 of the model's.
pub const RELATIVE_TOLERANCE: f32 = 1e-5;

/// A model, its data set and batcher, for one test case.
///
/// Burn initialises parameters lazily and each clone of an uninitialised module would draw its
/// own values; the constructors `fork` the model once so every clone shares them.
pub struct Case<M, I, Bt> {
    pub model: M,
    pub dataset: InMemDataset<I>,
    pub batcher: Bt,
}

impl<M: Clone, I: Clone + Send + Sync + 'static, Bt: Clone> Case<M, I, Bt> {
    pub fn source<Ab: Backend, O>(&self) -> DataSource<Ab, I, O>
    where
        Bt: Batcher<Ab, I, O> + 'static,
    {
        DataSource::new(self.dataset.clone_items(), self.batcher.clone())
    }
}

trait CloneItems<I> {
    fn clone_items(&self) -> InMemDataset<I>;
}

impl<I: Clone + Send + Sync> CloneItems<I> for InMemDataset<I> {
    fn clone_items(&self) -> InMemDataset<I> {
        InMemDataset::new(self.iter().collect())
    }
}

/// `init()` with `device`'s generator seeded with `seed`, under a lock held by every test of
/// the binary that initialises this way. Burn's seed belongs to the backend, not the thread:
/// two tests initialising at once interleave their draws, and each starts from weights its seed
/// did not choose. Then the reference itself moves between runs, and an equivalence check at a
/// fixed tolerance passes or fails with the weights it drew (measured on wgpu: 1.6e-7 alone,
/// up to 2.1e-5 beside another test).
pub fn seeded<Bk: Backend, T>(device: &Bk::Device, seed: u64, init: impl FnOnce() -> T) -> T {
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _held = INIT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Bk::seed(device, seed);
    init()
}

pub fn mlp_case(
    layers: usize,
    hidden: usize,
) -> Case<Mlp<B>, ClassificationItem, ClassificationBatcher> {
    mlp_case_on(layers, hidden, &Default::default())
}

pub fn mlp_case_on<Ab: AutodiffBackend>(
    layers: usize,
    hidden: usize,
    device: &Ab::Device,
) -> Case<Mlp<Ab>, ClassificationItem, ClassificationBatcher> {
    let device = device.clone();
    Case {
        model: seeded::<Ab, _>(&device, 7, || {
            MlpConfig::new()
                .with_layers(layers)
                .with_hidden(hidden)
                .init(&device)
                .fork(&device)
        }),
        dataset: TeacherTask {
            samples: 256,
            features: 32,
            classes: 10,
            seed: 11,
        }
        .dataset(),
        batcher: ClassificationBatcher,
    }
}

pub fn transformer_case() -> Case<Transformer<B>, SequenceItem, SequenceBatcher> {
    transformer_case_on(&Default::default())
}

pub fn transformer_case_on<Ab: AutodiffBackend>(
    device: &Ab::Device,
) -> Case<Transformer<Ab>, SequenceItem, SequenceBatcher> {
    let device = device.clone();
    Case {
        model: seeded::<Ab, _>(&device, 7, || {
            TransformerConfig::new().init(&device).fork(&device)
        }),
        dataset: FibonacciTask {
            samples: 128,
            len: 12,
            vocab: 16,
            seed: 11,
        }
        .dataset(),
        batcher: SequenceBatcher,
    }
}

/// QLoRA fine-tuning: a transformer of NF4-quantised blocks whose adapters (rank 4) and
/// embeddings train, on the Fibonacci task. It runs the fused ops' reference path and backward.
pub fn qlora_case() -> Case<LoraTransformer<B>, SequenceItem, SequenceBatcher> {
    qlora_case_on(&Default::default())
}

pub fn qlora_case_on<Ab: AutodiffBackend + kiln::kernels::KernelBackend>(
    device: &Ab::Device,
) -> Case<LoraTransformer<Ab>, SequenceItem, SequenceBatcher> {
    let device = device.clone();
    let model = seeded::<Ab, _>(&device, 7, || {
        LoraTransformerConfig::new()
            .with_layers(1)
            .with_lora(LoraConfig::new().with_rank(4))
            .with_kind(LoraKind::QLora(QuantConfig::new()))
            .init(&device)
            .fork(&device)
    });
    Case {
        model,
        dataset: FibonacciTask {
            samples: 128,
            len: 12,
            vocab: 16,
            seed: 11,
        }
        .dataset(),
        batcher: SequenceBatcher,
    }
}

/// The Algorithm Distillation transformer, scaled down, on windows of real Q-learning
/// histories in a 5×5 room.
pub fn ad_case() -> Case<AdTransformer<B>, WindowRef, WindowBatcher> {
    let device = Default::default();
    let room = DarkRoomConfig {
        size: 5,
        horizon: 6,
    };
    let source = QLearningConfig {
        histories_per_goal: 1,
        episodes: 4,
        ..QLearningConfig::default()
    };
    let histories = std::sync::Arc::new(learning_histories(room, &room.cells()[..6], &source, 5));
    let model = AdModelConfig {
        context: 10,
        d_model: 16,
        d_ff: 32,
        ..AdModelConfig::default()
    };
    let windows = WindowDataset::new(histories.clone(), model.context).unwrap();
    Case {
        model: seeded::<B, _>(&device, 7, || model.init(&room, &device).fork(&device)),
        dataset: InMemDataset::new(windows.iter().collect()),
        batcher: WindowBatcher::new(histories, model.context),
    }
}

/// The plan of `kind` on `world` ranks with `configs`, for global batches of `batch`.
pub fn plan(kind: StrategyKind, world: usize, configs: &StrategyConfigs, batch: usize) -> Plan {
    Plan::resolve(PlanRequest {
        world: Some(world),
        configs: configs.clone(),
        ..PlanRequest::new(kind, batch)
    })
    .unwrap_or_else(|e| panic!("{kind} world {world}: {e}"))
}

/// The first `steps` global batches of `batch` samples, shuffled with seed 3.
pub fn batches(len: usize, batch: usize, steps: usize) -> Vec<Vec<usize>> {
    EpochSampler::new(len, batch, 3)
        .unwrap()
        .with_remainder(Remainder::Drop)
        .batches()
        .take(steps)
        .collect()
}

/// Plain single-device Burn training: whole global batch, AdamW, no Kiln code.
pub fn reference<M, I, Bt>(case: &Case<M, I, Bt>, batches: &[Vec<usize>]) -> M
where
    M: TrainModel<B>,
    I: Clone + Send + Sync,
    Bt: Batcher<B, I, M::Input>,
{
    reference_on(case, batches, &Default::default())
}

pub fn reference_on<Ab, M, I, Bt>(
    case: &Case<M, I, Bt>,
    batches: &[Vec<usize>],
    device: &Ab::Device,
) -> M
where
    Ab: AutodiffBackend,
    M: TrainModel<Ab>,
    I: Clone + Send + Sync,
    Bt: Batcher<Ab, I, M::Input>,
{
    let device = device.clone();
    let mut optim = AdamWConfig::new().init::<Ab, M>();
    let mut model = case.model.clone();
    for batch in batches {
        let items = batch
            .iter()
            .map(|&i| case.dataset.get(i).unwrap())
            .collect();
        let output = model.step(case.batcher.batch(items, &device));
        model = optim.step(LR, model, output.grads);
    }
    model
}

/// Every float parameter's values, in visiting order.
pub fn parameters<Bk: Backend, M: Module<Bk>>(model: &M) -> Vec<Vec<f32>> {
    struct Collect(Vec<Vec<f32>>);
    impl<Bk: Backend> ModuleVisitor<Bk> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
            self.0
                .push(param.val().into_data().convert::<f32>().to_vec().unwrap());
        }
    }
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

/// Asserts that `actual` matches `expected` within [`RELATIVE_TOLERANCE`], and that training
/// moved the parameters (so a strategy that does nothing cannot pass). The message names the
/// tensor with the largest difference.
pub fn assert_equivalent<Bk: Backend, M: Module<Bk>>(
    actual: &M,
    expected: &M,
    initial: &M,
    what: &str,
) {
    assert_equivalent_within(actual, expected, initial, what, RELATIVE_TOLERANCE);
}

/// [`assert_equivalent`] with another relative tolerance, for runtimes whose arithmetic is
/// not plain f32 (TF32 matmuls on CUDA).
pub fn assert_equivalent_within<Bk: Backend, M: Module<Bk>>(
    actual: &M,
    expected: &M,
    initial: &M,
    what: &str,
    tolerance: f32,
) {
    let (actual, expected, initial) = (
        parameters(actual),
        parameters(expected),
        parameters(initial),
    );
    assert_eq!(actual.len(), expected.len(), "{what}: parameter count");
    assert_ne!(expected, initial, "{what}: the reference did not train");
    let max_abs = |values: &[f32]| values.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = expected
        .iter()
        .map(|e| max_abs(e))
        .fold(f32::MIN_POSITIVE, f32::max);
    let (worst, diff) = actual
        .iter()
        .zip(&expected)
        .map(|(a, e)| a.iter().zip(e).fold(0f32, |m, (x, y)| m.max((x - y).abs())))
        .enumerate()
        .fold(
            (0, 0f32),
            |best, (i, d)| if d > best.1 { (i, d) } else { best },
        );
    assert!(
        diff <= tolerance * scale,
        "{what}: parameters differ by {diff:e} (relative {:e}, tolerance {tolerance:e}), \
         worst in parameter tensor {worst}",
        diff / scale
    );
}

/// Which strategy [`shared_device_matches_single`] runs on one device.
#[derive(Debug, Clone, Copy)]
pub enum OnOneDevice {
    /// `DataParallel`: one thread per device.
    DataParallel,
    /// `Ddp`, its state split as the
    /// [`ShardState`](kiln::core::strategy::ShardState) says.
    Ddp(kiln::core::strategy::ShardState),
}

/// Ddp (replica check every step) or DataParallel with `world` ranks sharing one `device`,
/// three steps of the MLP, against single-device training on that device, within
/// `tolerance`: the check of a backend whose work is queued per thread (wgpu, CUDA).
pub fn shared_device_matches_single<Ab: AutodiffBackend>(
    device: Ab::Device,
    world: usize,
    on: OnOneDevice,
    tolerance: f32,
) {
    use kiln::core::World;
    use kiln::core::strategy::{DataParallel, DataParallelConfig, Ddp, DdpConfig, Strategy};
    let case = mlp_case_on::<Ab>(2, 16, &device);
    let batches = batches(case.dataset.len(), 13, 3);
    let expected = reference_on(&case, &batches, &device);
    let devices = vec![device; world];
    let mut strategy: Box<dyn Strategy<Ab, _>> = if let OnOneDevice::Ddp(shard_state) = on {
        let config = DdpConfig {
            check_replicas_every: Some(1),
            shard_state,
            ..DdpConfig::default()
        };
        Box::new(
            Ddp::new(
                &World::local(devices).unwrap(),
                case.model.clone(),
                AdamWConfig::new().init(),
                case.source(),
                config,
            )
            .unwrap(),
        )
    } else {
        Box::new(
            DataParallel::new(
                case.model.clone(),
                AdamWConfig::new().init(),
                case.source(),
                devices,
                DataParallelConfig::default(),
            )
            .unwrap(),
        )
    };
    for batch in &batches {
        strategy.step(batch, LR).unwrap();
    }
    let what = format!("{on:?} world {world} on one device");
    assert_equivalent_within(
        &strategy.model().unwrap(),
        &expected,
        &case.model,
        &what,
        tolerance,
    );
}

/// The parameters after `steps` steps of the MLP in f16 (its first parameter frozen, as a LoRA
/// model's base is) on one rank of `Ab` with the fused AdamW, mixed precision taking its f16
/// parameters from the copies (`copies`: the optimizer's, and its own of the frozen one) or
/// casting them; and whether the last step left a copy for every parameter.
fn f16_steps<Ab>(copies: bool, steps: usize, device: &Ab::Device) -> (Vec<Vec<f32>>, bool)
where
    Ab: AutodiffBackend<InnerBackend: kiln::kernels::KernelBackend>
        + kiln::core::tensor_parallel::TpBackend,
{
    use kiln::core::optim::{MixedPrecision, Precision};
    use kiln::core::strategy::{Single, SingleConfig, Strategy};
    use kiln::kernels::{FusedAdamWConfig, LowCopies};
    let case = mlp_case_on::<Ab>(2, 16, device);
    let shared = LowCopies::new(Precision::F16.dtype());
    shared.set_on(copies);
    let frozen = case.model.clone().map(&mut FreezeFirst(true));
    let model = MixedPrecision::new(frozen, Precision::F16)
        .with_low_precision_grads()
        .with_low_copies(shared.clone());
    let optim = FusedAdamWConfig::new()
        .init::<Ab, _>()
        .with_low_copies(shared.clone());
    let config = SingleConfig {
        threads_per_rank: Some(1),
        ..SingleConfig::default()
    };
    let mut single = Single::new(model, optim, case.source(), device.clone(), config).unwrap();
    for batch in batches(case.dataset.len(), 13, steps) {
        single.step(&batch, LR).unwrap();
    }
    let mut found = Found::<Ab> {
        values: Vec::new(),
        copies: &shared,
        all: true,
        backend: std::marker::PhantomData,
    };
    single.model().unwrap().model.visit(&mut found);
    (found.values, found.all)
}

/// Freezes the first float parameter it maps.
struct FreezeFirst(bool);

impl<B: Backend> burn::module::ModuleMapper<B> for FreezeFirst {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if std::mem::take(&mut self.0) {
            param.set_require_grad(false)
        } else {
            param
        }
    }
}

/// Each float parameter's values, and whether `copies` holds a copy made from it.
struct Found<'a, Ab> {
    values: Vec<Vec<f32>>,
    copies: &'a kiln::kernels::LowCopies,
    all: bool,
    backend: std::marker::PhantomData<Ab>,
}

impl<Ab: AutodiffBackend<InnerBackend: kiln::kernels::KernelBackend>> ModuleVisitor<Ab>
    for Found<'_, Ab>
{
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ab, D>>) {
        let inner = param.val().inner();
        self.all &= self.copies.copy_of(param.id, &inner).is_some();
        self.values.push(param.val().into_data().to_vec().unwrap());
    }
}

/// On a backend that can tell tensors apart (fusion), f16 training from the fused AdamW's
/// copies of the parameters equals training that casts them, bit for bit, and every parameter
/// has its copy after a step; with the copies off, none is kept.
pub fn f16_copies_train_as_casts<Ab>(device: Ab::Device)
where
    Ab: AutodiffBackend<InnerBackend: kiln::kernels::KernelBackend>
        + kiln::core::tensor_parallel::TpBackend,
{
    let (cast, none) = f16_steps::<Ab>(false, 4, &device);
    let (copied, all) = f16_steps::<Ab>(true, 4, &device);
    assert!(!none, "copies were kept while off");
    assert!(all, "a parameter had no copy after the step");
    assert_eq!(cast.len(), copied.len());
    for (i, (a, b)) in cast.iter().zip(&copied).enumerate() {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "parameter {i} differs"
        );
    }
}
