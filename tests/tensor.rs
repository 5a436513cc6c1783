//! Tensor parallelism trains exactly as one device does: `k` steps of `Tensor` give the
//! parameters of `k` steps of plain single-device training within 1e-5 relative, for tp = 2
//! and 4, `dp × tp`, `pp × tp` and `dp × pp × tp`, with gradient accumulation and with
//! clipping that clips, on the transformer (Burn's layers), the AD model (Kiln's blocks) and
//! the LoRA and QLoRA transformers. A sharded model gathers back into the ordinary model bit
//! for bit, its replicated parameters stay the same on every shard, and each rank holds its
//! share of the bytes.

mod common;

use burn::data::dataloader::batcher::Batcher;
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::AdamWConfig;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use common::*;
use kiln::core::World;
use kiln::core::model::TensorParallelModel;
use kiln::core::optim::PerformanceConfig;
use kiln::core::params::param_bytes;
use kiln::core::strategy::{
    PerformanceSpec, Schedule, Strategy, StrategyConfigs, StrategyKind, StrategyModel,
    Tensor as Tp, build,
};
use kiln::core::tensor_parallel::TpGroup;
use kiln::nn::lora::{LoraConfig, LoraKind, QuantConfig};
use kiln::nn::models::{LoraTransformer, LoraTransformerConfig, TransformerConfig};
use kiln::nn::tasks::{FibonacciTask, SequenceBatcher, SequenceItem};

const STEPS: usize = 3;
/// Global batch: dp = 2 shards it 7 + 6, and 2 micro-batches 4 + 3 and 3 + 3.
const BATCH: usize = 13;

/// A `dp × pp × tp` shape of `Tensor`.
#[derive(Clone, Copy, Debug)]
struct Shape {
    dp: usize,
    pp: usize,
    tp: usize,
    accumulation: usize,
    /// The schedule of the stages (with `pp > 1`).
    schedule: Schedule,
    /// Blocks of each stage (with `pp > 1`); `None` for an even split.
    stage_blocks: Option<&'static [usize]>,
}

const fn tp(tp: usize) -> Shape {
    Shape {
        dp: 1,
        pp: 1,
        tp,
        accumulation: 1,
        schedule: Schedule::OneFOneB,
        stage_blocks: None,
    }
}

impl Shape {
    fn world(self) -> usize {
        self.dp * self.pp * self.tp
    }

    fn configs(self) -> StrategyConfigs {
        let mut configs = StrategyConfigs::default();
        configs.set_threads_per_rank(1);
        configs.set_grad_accumulation(self.accumulation);
        configs.tensor.tp = self.tp;
        configs.tensor.stages = self.pp;
        configs.tensor.collective_timeout_s = 60.0;
        configs.tensor.check_replicas_every = (self.pp == 1).then_some(1);
        configs.pipeline.micro_batches = 2;
        configs.pipeline.schedule = self.schedule;
        configs.pipeline.stage_blocks = self.stage_blocks.map(<[usize]>::to_vec);
        configs
    }
}

fn spec(clip: Option<f64>) -> PerformanceSpec<AdamWConfig> {
    PerformanceSpec::new(
        AdamWConfig::new(),
        PerformanceConfig::new().with_clip_norm(clip),
    )
    .unwrap()
}

/// Trains `case`'s model through `Tensor` of `shape`; returns the gathered model, every
/// shard of the first replica, and the ranks' totals.
fn train<M, I, Bt>(
    case: &Case<M, I, Bt>,
    batches: &[Vec<usize>],
    shape: Shape,
    clip: Option<f64>,
) -> (M, Vec<M::Sharded>, Vec<kiln::core::strategy::RankStats>)
where
    M: TensorParallelModel<B, Sharded: StrategyModel<B>>,
    I: Clone + Send + Sync + 'static,
    Bt: Batcher<B, I, M::Input> + Clone + 'static,
{
    let configs = shape.configs();
    let world = World::local(vec![Default::default(); shape.world()]).unwrap();
    let mut tensor = Tp::new(
        &world,
        case.model.clone(),
        &spec(clip),
        case.source(),
        configs.tensor.clone(),
        &configs.pipeline,
    )
    .unwrap_or_else(|e| panic!("{shape:?}: {e}"));
    for batch in batches {
        let out = tensor.step(batch, LR).unwrap();
        assert_eq!(out.samples, batch.len(), "{shape:?}");
        if let Some(clip) = clip {
            let norm = out.guard.unwrap().grad_norm;
            assert!(norm > clip, "{shape:?}: the step clipped (norm {norm})");
        }
    }
    (
        tensor.model().unwrap(),
        tensor.shards().unwrap(),
        tensor.stats(),
    )
}

/// Every float parameter's bits, by id.
fn bits<Bk: Backend, M: Module<Bk>>(module: &M) -> Vec<(ParamId, Vec<usize>, Vec<u32>)> {
    struct Bits<Bk>(
        Vec<(ParamId, Vec<usize>, Vec<u32>)>,
        std::marker::PhantomData<Bk>,
    );
    impl<Bk: Backend> ModuleVisitor<Bk> for Bits<Bk> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
            let t = param.val();
            let values = t.dims().to_vec();
            let data = t.into_data().convert::<f32>().to_vec::<f32>().unwrap();
            self.0.push((
                param.id,
                values,
                data.into_iter().map(f32::to_bits).collect(),
            ));
        }
    }
    let mut bits = Bits::<Bk>(Vec::new(), std::marker::PhantomData);
    module.visit(&mut bits);
    bits.0
}

/// The replicated parameters of `shards` (those whose shape is the whole model's) are the
/// same, bit for bit, on every shard; returns their bytes on one shard.
fn replicated_agree<M: Module<B>, S: Module<B>>(whole: &M, shards: &[S], what: &str) -> u64 {
    let shapes: std::collections::HashMap<_, _> = bits::<B, M>(whole)
        .into_iter()
        .map(|(id, dims, _)| (id, dims))
        .collect();
    let first = bits::<B, S>(&shards[0]);
    let mut bytes = 0;
    for shard in &shards[1..] {
        for ((id, dims, values), (other_id, _, other)) in first.iter().zip(bits::<B, S>(shard)) {
            assert_eq!(*id, other_id, "{what}: the shards hold the same parameters");
            if shapes.get(id) == Some(dims) {
                assert_eq!(values, &other, "{what}: replicated parameter {id} differs");
            }
        }
    }
    for (id, dims, values) in &first {
        if shapes.get(id) == Some(dims) {
            bytes += 4 * values.len() as u64;
        }
    }
    bytes
}

/// Every shape of `Tensor` against single-device training on `case`, and what a trained
/// sharding must keep: replicated parameters equal on the shards, each rank its share of the
/// bytes. Returns each shape's rank 0's parameter bytes.
fn check<M, I, Bt>(name: &str, case: &Case<M, I, Bt>, shapes: &[Shape]) -> Vec<u64>
where
    M: TensorParallelModel<B, Sharded: StrategyModel<B>>,
    I: Clone + Send + Sync + 'static,
    Bt: Batcher<B, I, M::Input> + Clone + 'static,
{
    let batches = batches(case.dataset.len(), BATCH, STEPS);
    let expected = reference(case, &batches);
    let whole_bytes = param_bytes::<B, M>(&case.model).params;
    let mut first_rank_bytes = Vec::new();
    for &shape in shapes {
        let what = format!("{name} {shape:?}");
        let (model, shards, stats) = train(case, &batches, shape, None);
        assert_equivalent(&model, &expected, &case.model, &what);
        assert_eq!(shards.len(), shape.tp, "{what}");
        let replicated = replicated_agree(&model, &shards, &what);
        assert_eq!(stats.len(), shape.world(), "{what}");
        if shape.pp == 1 {
            // Each rank holds the replicated parameters and 1/tp of the others, exactly.
            for s in &stats {
                assert_eq!(
                    shape.tp as u64 * (s.param_bytes - replicated),
                    whole_bytes - replicated,
                    "{what}: rank {} holds {} bytes",
                    s.rank,
                    s.param_bytes
                );
                assert!(s.optimizer_bytes > 0, "{what}");
                assert!(s.shard_traffic.calls > 0, "{what}: rank {}", s.rank);
            }
        }
        first_rank_bytes.push(stats.iter().find(|s| s.rank == 0).unwrap().param_bytes);
    }
    first_rank_bytes
}

const SHAPES: [Shape; 5] = [
    tp(2),
    tp(4),
    Shape { dp: 2, ..tp(2) },
    Shape { pp: 2, ..tp(2) },
    Shape {
        accumulation: 2,
        ..tp(2)
    },
];

#[test]
fn the_transformer_shards_like_single_device_training() {
    check("transformer", &transformer_case(), &SHAPES);
}

#[test]
fn the_transformer_trains_on_a_three_axis_mesh() {
    // GPipe: a stage's ranks start each backward right after the last, the tightest
    // interleaving of collectives inside backward passes.
    let shape = Shape {
        dp: 2,
        pp: 2,
        schedule: Schedule::GPipe,
        ..tp(2)
    };
    check("transformer", &transformer_case(), &[shape]);
}

#[test]
fn the_ad_model_shards_like_single_device_training() {
    check("ad", &ad_case(), &SHAPES[..4]);
}

/// The LoRA transformer (dense bases) at `d_model` and `d_ff`, 4 heads, adapters of rank 4.
fn lora_case(
    kind: LoraKind,
    width: usize,
    layers: usize,
) -> Case<LoraTransformer<B>, SequenceItem, SequenceBatcher> {
    let device = Default::default();
    let model = seeded::<B, _>(&device, 7, || {
        LoraTransformerConfig::new()
            .with_layers(layers)
            .with_d_model(width)
            .with_d_ff(width)
            .with_lora(LoraConfig::new().with_rank(4))
            .with_kind(kind)
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

#[test]
fn the_lora_transformer_shards_like_single_device_training() {
    check("lora", &lora_case(LoraKind::Lora, 32, 2), &SHAPES[..4]);
}

/// Stages of unequal blocks under `tensor`, as under `pipeline`.
#[test]
fn the_lora_transformer_shards_into_uneven_stages() {
    let uneven = |blocks| Shape {
        pp: 2,
        stage_blocks: Some(blocks),
        ..tp(2)
    };
    let shapes = [uneven(&[1, 2]), uneven(&[2, 1])];
    let bytes = check("lora", &lora_case(LoraKind::Lora, 32, 3), &shapes);
    // The boundaries are the ones asked for: rank 0 (stage 0) holds more with two blocks.
    let (one, two) = (bytes[0], bytes[1]);
    assert!(
        one < two,
        "stage 0 of 1 block {one} bytes, of 2 blocks {two}"
    );
}

/// A 4-bit base shards along whole blocks: rows of 64 per shard need widths of 64 × tp.
#[test]
fn the_qlora_transformer_shards_like_single_device_training() {
    let quant = LoraKind::QLora(QuantConfig::new());
    check("qlora", &lora_case(quant.clone(), 128, 1), &[tp(2)]);
    check("qlora", &lora_case(quant, 256, 1), &[tp(4)]);
}

/// Global-norm clipping counts every sharded parameter once over its shards and every
/// replicated one once: `Tensor` clips as `Single` does, to the same norms.
#[test]
fn clipping_counts_each_parameter_once() {
    let case = transformer_case();
    let batches = batches(case.dataset.len(), BATCH, STEPS);
    let clip = Some(0.05);
    let mut single = build(
        &plan(StrategyKind::Single, 1, &StrategyConfigs::default(), BATCH),
        vec![Default::default()],
        case.model.clone(),
        &spec(clip),
        case.source(),
    )
    .unwrap();
    let expected_norms: Vec<f64> = batches
        .iter()
        .map(|b| single.step(b, LR).unwrap().guard.unwrap().grad_norm)
        .collect();
    let expected = single.model().unwrap();
    for shape in [tp(2), Shape { dp: 2, ..tp(2) }, Shape { pp: 2, ..tp(2) }] {
        let what = format!("clipped {shape:?}");
        let configs = shape.configs();
        let mut tensor = build(
            &plan(StrategyKind::Tensor, shape.world(), &configs, BATCH),
            vec![Default::default(); shape.world()],
            case.model.clone(),
            &spec(clip),
            case.source(),
        )
        .unwrap();
        for (batch, expected) in batches.iter().zip(&expected_norms) {
            let norm = tensor.step(batch, LR).unwrap().guard.unwrap().grad_norm;
            assert!(norm > 0.05, "{what}: every step clips");
            assert!(
                (norm - expected).abs() <= 1e-5 * expected,
                "{what}: norm {norm}, single device {expected}"
            );
        }
        assert_equivalent(&tensor.model().unwrap(), &expected, &case.model, &what);
    }
}

/// Sharding and gathering back give the model bit for bit; a model trained with `Tensor`
/// saves and loads into a fresh ordinary model, which computes the same outputs.
#[test]
fn a_sharded_model_gathers_back_and_loads_into_the_ordinary_model() {
    let case = transformer_case();
    // An unconnected group checks shapes: it shards without a collective.
    assert!(case.model.shard(TpGroup::unconnected(4)).is_ok());
    // The real shards, one per rank, gathered after zero steps.
    let batches = batches(case.dataset.len(), BATCH, 2);
    let (gathered, _, _) = train(&case, &batches[..0], tp(4), None);
    assert_eq!(bits::<B, _>(&gathered), bits::<B, _>(&case.model));

    let (trained, _, _) = train(&case, &batches, tp(2), None);
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder.record(trained.clone().into_record(), ()).unwrap();
    let device = Default::default();
    let fresh = TransformerConfig::new()
        .init::<B>(&device)
        .load_record(recorder.load(bytes, &device).unwrap());
    let tokens = Tensor::<B, 2, burn::tensor::Int>::from_ints([[1, 2, 3, 5, 8, 13]], &device);
    assert_eq!(
        fresh.forward(tokens.clone()).into_data(),
        trained.forward(tokens).into_data()
    );
}

/// What cannot be sharded is refused in one line, before anything starts.
#[test]
fn impossible_shardings_are_refused_in_one_line() {
    let case = transformer_case();
    let refused = |shape: Shape, model: &kiln::nn::models::Transformer<B>| {
        let configs = shape.configs();
        let world = World::local(vec![Default::default(); shape.world()]).unwrap();
        Tp::new(
            &world,
            model.clone(),
            &spec(None),
            case.source(),
            configs.tensor,
            &configs.pipeline,
        )
        .err()
        .expect("refused")
        .to_string()
    };
    // 4 heads over 3 shards; more shards than heads.
    assert!(refused(tp(3), &case.model).contains("attention heads (4) does not divide by tp = 3"));
    assert!(refused(tp(8), &case.model).contains("tp = 8 is larger than the 4 attention heads"));
    // A feed-forward width that does not divide.
    let odd = TransformerConfig::new()
        .with_d_ff(66)
        .init::<B>(&Default::default());
    assert!(refused(tp(4), &odd).contains("output features (66) does not divide by tp = 4"));
    // A 4-bit base whose shard would cut its quantisation blocks.
    let qlora = lora_case(LoraKind::QLora(QuantConfig::new()), 32, 1);
    let configs = tp(2).configs();
    let error = Tp::new(
        &World::local(vec![Default::default(); 2]).unwrap(),
        qlora.model.clone(),
        &spec(None),
        qlora.source(),
        configs.tensor,
        &configs.pipeline,
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(error.contains("quantisation blocks"), "{error}");
    // A world that is not dp × pp × tp.
    let error = plan_error(StrategyKind::Tensor, 3, tp(2).configs());
    assert!(error.contains("not dp × (stages × shards)"), "{error}");
    // A model without a sharding plan.
    let mlp = mlp_case(2, 16);
    let error = build(
        &plan(StrategyKind::Tensor, 2, &tp(2).configs(), BATCH),
        vec![Default::default(); 2],
        mlp.model.clone(),
        &spec(None),
        mlp.source(),
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(error.contains("TensorParallelModel"), "{error}");
}

fn plan_error(kind: StrategyKind, world: usize, configs: StrategyConfigs) -> String {
    kiln::core::plan::Plan::resolve(kiln::core::plan::PlanRequest {
        world: Some(world),
        configs,
        ..kiln::core::plan::PlanRequest::new(kind, BATCH)
    })
    .unwrap_err()
    .to_string()
}

/// A user's own tensor-parallel model, through the public contracts: `y = down(relu(up(x)))`
/// fitting a regression target, `up` column-parallel and `down` row-parallel when sharded.
/// Its batches can carry a fault for shard 1: a NaN in its `up.weight` gradient, or a panic
/// in its forward before the shards meet.
mod tiny {
    use burn::data::dataloader::batcher::Batcher;
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::GradientsParams;
    use burn::tensor::backend::{AutodiffBackend, Backend};
    use burn::tensor::{Tensor, TensorData};
    use burn::train::{RegressionOutput, TrainOutput, TrainStep};
    use kiln::core::model::{
        ParallelModel, ShardError, Supported, TensorParallelModel, Unsupported,
    };
    use kiln::core::tensor_parallel::{TpBackend, TpGroup};
    use kiln::nn::tensor_parallel::{ColumnParallelLinear, RowParallelLinear};

    #[derive(Debug, Clone, Copy, PartialEq)]
    pub enum Fault {
        None,
        NanGradient,
        Panic,
    }

    #[derive(Debug, Clone)]
    pub struct Item {
        pub x: [f32; 4],
        pub y: f32,
        pub fault: Fault,
    }

    #[derive(Debug, Clone)]
    pub struct Batch<B: Backend> {
        x: Tensor<B, 2>,
        y: Tensor<B, 2>,
        fault: Fault,
    }

    #[derive(Debug, Clone)]
    pub struct Batches;

    impl<B: Backend> Batcher<B, Item, Batch<B>> for Batches {
        fn batch(&self, items: Vec<Item>, device: &B::Device) -> Batch<B> {
            let n = items.len();
            let x: Vec<f32> = items.iter().flat_map(|i| i.x).collect();
            let y: Vec<f32> = items.iter().map(|i| i.y).collect();
            Batch {
                x: Tensor::from_data(TensorData::new(x, [n, 4]), device),
                y: Tensor::from_data(TensorData::new(y, [n, 1]), device),
                fault: items
                    .iter()
                    .map(|i| i.fault)
                    .find(|f| *f != Fault::None)
                    .unwrap_or(Fault::None),
            }
        }
    }

    pub fn items(fault: Option<(usize, Fault)>) -> Vec<Item> {
        (0..24)
            .map(|i| {
                let f = i as f32 / 24.0;
                Item {
                    x: [f, 1.0 - f, f * f, 0.5],
                    y: (3.0 * f).sin(),
                    fault: match fault {
                        Some((at, fault)) if at == i => fault,
                        _ => Fault::None,
                    },
                }
            })
            .collect()
    }

    #[derive(Module, Debug)]
    pub struct Tiny<B: Backend> {
        up: Linear<B>,
        down: Linear<B>,
    }

    pub fn tiny<B: Backend>(device: &B::Device) -> Tiny<B> {
        Tiny {
            up: LinearConfig::new(4, 8).init(device),
            down: LinearConfig::new(8, 1).init(device),
        }
        .fork(device)
    }

    fn loss<B: AutodiffBackend>(y: Tensor<B, 2>, target: Tensor<B, 2>) -> Tensor<B, 1> {
        (y - target).square().mean()
    }

    impl<B: AutodiffBackend> TrainStep for Tiny<B> {
        type Input = Batch<B>;
        type Output = RegressionOutput<B>;

        fn step(&self, batch: Batch<B>) -> TrainOutput<RegressionOutput<B>> {
            let y = self
                .down
                .forward(burn::tensor::activation::relu(self.up.forward(batch.x)));
            let loss = loss(y.clone(), batch.y.clone());
            TrainOutput::new(
                self,
                loss.backward(),
                RegressionOutput::new(loss, y, batch.y),
            )
        }
    }

    #[derive(Module, Debug)]
    pub struct TinyShard<B: TpBackend> {
        up: ColumnParallelLinear<B>,
        down: RowParallelLinear<B>,
        #[module(skip)]
        tp: TpGroup<B>,
    }

    impl<B: AutodiffBackend<InnerBackend: TpBackend> + TpBackend> TrainStep for TinyShard<B> {
        type Input = Batch<B>;
        type Output = RegressionOutput<B>;

        fn step(&self, batch: Batch<B>) -> TrainOutput<RegressionOutput<B>> {
            let faulty = self.tp.rank() == 1;
            let hidden = burn::tensor::activation::relu(self.up.forward(batch.x));
            assert!(
                !(faulty && batch.fault == Fault::Panic),
                "shard 1 fell over mid-forward"
            );
            let y = self.down.forward(hidden);
            let loss = loss(y.clone(), batch.y.clone());
            let mut grads = GradientsParams::from_grads(loss.backward(), self);
            if faulty && batch.fault == Fault::NanGradient {
                let id = self.up.weight.id;
                let grad = grads.remove::<B::InnerBackend, 2>(id).unwrap();
                grads.register(id, grad.mul_scalar(f32::NAN));
            }
            TrainOutput {
                grads,
                item: RegressionOutput::new(loss, y, batch.y),
            }
        }
    }

    impl<B: AutodiffBackend<InnerBackend: TpBackend> + TpBackend> TensorParallelModel<B> for Tiny<B> {
        type Sharded = TinyShard<B>;

        fn shard(&self, tp: TpGroup<B>) -> Result<TinyShard<B>, ShardError> {
            Ok(TinyShard {
                up: ColumnParallelLinear::shard(&self.up, tp.clone(), false)?,
                down: RowParallelLinear::shard(&self.down, tp.clone(), true)?,
                tp,
            })
        }

        fn gather(shards: Vec<TinyShard<B>>) -> Self {
            let ups: Vec<_> = shards.iter().map(|s| s.up.clone()).collect();
            let downs: Vec<_> = shards.iter().map(|s| s.down.clone()).collect();
            Tiny {
                up: ColumnParallelLinear::gather(&ups),
                down: RowParallelLinear::gather(&downs),
            }
        }
    }

    impl<B: AutodiffBackend<InnerBackend: TpBackend> + TpBackend> ParallelModel<B> for Tiny<B> {
        type Pipeline = Unsupported;
        type Tensor = Supported;
        type LowPrecision = Unsupported;
    }

    impl<B: AutodiffBackend<InnerBackend: TpBackend> + TpBackend> ParallelModel<B> for TinyShard<B> {
        type Pipeline = Unsupported;
        type Tensor = Unsupported;
        type LowPrecision = Unsupported;
    }
}

/// `Tensor` of the tiny model on `dp × 2` ranks, halting on a non-finite value.
fn tiny_tensor(
    dp: usize,
    fault: Option<(usize, tiny::Fault)>,
    timeout_s: f64,
) -> Box<dyn Strategy<B, tiny::Tiny<B>>> {
    let mut configs = Shape { dp, ..tp(2) }.configs();
    configs.tensor.collective_timeout_s = timeout_s;
    let data = kiln::core::data::DataSource::new(
        burn::data::dataset::InMemDataset::new(tiny::items(fault)),
        tiny::Batches,
    );
    build(
        &plan(StrategyKind::Tensor, 2 * dp, &configs, 12),
        vec![Default::default(); 2 * dp],
        tiny::tiny::<B>(&Default::default()),
        &spec(None),
        data,
    )
    .unwrap()
}

/// A user's own model shards through the public contracts and trains as one device does.
#[test]
fn a_user_model_shards_through_the_contracts() {
    let device = Default::default();
    let case = Case {
        model: tiny::tiny::<B>(&device),
        dataset: burn::data::dataset::InMemDataset::new(tiny::items(None)),
        batcher: tiny::Batches,
    };
    check("tiny", &case, &[tp(2), Shape { dp: 2, ..tp(2) }]);
}

/// A NaN in one shard's gradient is named by every rank with its parameter, its shard and its
/// rank (on `dp × tp` = 2 × 2, rank 3 is replica 1's shard 1).
#[test]
fn a_nan_in_one_shard_is_named_with_parameter_shard_and_rank() {
    use kiln::core::strategy::{RankError, StrategyError};
    // Sample 20 lands in replica 1's half of the batch 12..24.
    let mut tensor = tiny_tensor(2, Some((20, tiny::Fault::NanGradient)), 60.0);
    tensor.step(&(0..12).collect::<Vec<_>>(), LR).unwrap();
    let error = tensor.step(&(12..24).collect::<Vec<_>>(), LR).unwrap_err();
    let StrategyError::Failed { failures, .. } = &error else {
        panic!("expected a rank failure, got {error}");
    };
    assert_eq!(failures.len(), 4, "{error}");
    for failure in failures {
        let RankError::NonFinite(report) = &failure.error else {
            panic!("rank {}: {}", failure.rank, failure.error);
        };
        assert_eq!((report.rank, report.shard), (Some(3), Some(1)), "{report}");
    }
    let message = error.to_string();
    assert!(
        message.contains("the gradient of up.weight holds NaN or infinity at step 2 on rank 3 (tensor-parallel shard 1)"),
        "{message}"
    );
}

/// A shard that panics mid-forward, while its peer waits for it inside an all-reduce, ends
/// every rank with an error naming it, well within the collective timeout.
#[test]
fn a_shard_that_panics_mid_forward_is_named_within_the_timeout() {
    use kiln::core::strategy::{RankError, StrategyError};
    let timeout = std::time::Duration::from_secs(20);
    let mut tensor = tiny_tensor(1, Some((3, tiny::Fault::Panic)), timeout.as_secs_f64());
    tensor.step(&(12..24).collect::<Vec<_>>(), LR).unwrap();
    let start = std::time::Instant::now();
    let error = tensor.step(&(0..12).collect::<Vec<_>>(), LR).unwrap_err();
    assert!(start.elapsed() < timeout / 2, "took {:?}", start.elapsed());
    let StrategyError::Failed { culprit, failures } = &error else {
        panic!("expected a rank failure, got {error}");
    };
    assert_eq!(*culprit, 1, "{error}");
    let own = failures
        .iter()
        .find(|f| f.rank == 1)
        .expect("rank 1 reports");
    assert!(
        matches!(&own.error, RankError::Panicked(m) if m.contains("mid-forward")),
        "{error}"
    );
    let peer = failures
        .iter()
        .find(|f| f.rank == 0)
        .expect("rank 0 reports");
    assert!(
        matches!(&peer.error, RankError::Collective(e) if e.culprit() == Some(1)),
        "{error}"
    );
}
