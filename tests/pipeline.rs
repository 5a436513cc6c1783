//! Pipeline equivalence: `k` steps of `Pipeline` give the parameters of `k` steps of plain
//! single-device training on the same global batches, within 1e-5 relative, for p = 2, 3, 4
//! stages, m = 1, 4, 7 micro-batches (7 does not divide the batch), both schedules, gradient
//! accumulation, `dp × pp`, recomputation and uneven stages (1 + 3, 3 + 1, 1 + 2 + 1 blocks), for the MLP, the transformer, the AD model and the QLoRA
//! transformer. The model it returns is the ordinary whole model, which loads
//! into `Single`. 1F1B holds at most p micro-batches' activations per stage, GPipe all m.

mod common;

use burn::data::dataloader::batcher::Batcher;
use burn::module::Module;
use burn::optim::AdamWConfig;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use common::*;
use kiln::core::World;
use kiln::core::model::PipelineModel;
use kiln::core::strategy::{Pipeline, PipelineConfig, Schedule, Strategy};
use kiln::core::world::Mesh;
use kiln::nn::models::{MlpConfig, TransformerConfig};

const STEPS: usize = 3;
/// Global batch: 7 micro-batches do not divide it, and dp = 2 shards it 7 + 6.
const BATCH: usize = 13;

fn config(stages: usize, micro_batches: usize, schedule: Schedule) -> PipelineConfig {
    PipelineConfig {
        stages,
        micro_batches,
        schedule,
        threads_per_rank: Some(1),
        collective_timeout_s: 60.0,
        ..PipelineConfig::default()
    }
}

/// Trains `case`'s model through `Pipeline` on `world` (a `dp × pp` mesh when given).
fn train<M, I, Bt>(
    case: &Case<M, I, Bt>,
    batches: &[Vec<usize>],
    world: World<burn::tensor::Device<B>>,
    config: PipelineConfig,
) -> (M, Vec<kiln::core::strategy::RankStats>)
where
    M: PipelineModel<B>,
    I: Clone + Send + Sync + 'static,
    Bt: Batcher<B, I, M::Input> + Clone + 'static,
{
    let mut pipeline = Pipeline::new(
        &world,
        case.model.clone(),
        AdamWConfig::new().init(),
        case.source(),
        config,
    )
    .unwrap();
    for batch in batches {
        let out = pipeline.step(batch, LR).unwrap();
        assert_eq!(out.samples, batch.len());
        assert!(out.loss.is_finite() && out.loss > 0.0, "loss {}", out.loss);
    }
    (pipeline.model().unwrap(), pipeline.stats())
}

fn world(ranks: usize) -> World<burn::tensor::Device<B>> {
    World::local(vec![Default::default(); ranks]).unwrap()
}

/// The whole matrix for one model with 4 blocks: p = 2, 3, 4 × m = 1, 4, 7 × both schedules,
/// recomputation, gradient accumulation 2, and dp × pp = 2 × 2; 1F1B holds at most p micro-batches per
/// stage and GPipe all m.
fn check_every_shape<M, I, Bt>(name: &str, case: &Case<M, I, Bt>)
where
    M: PipelineModel<B>,
    I: Clone + Send + Sync + 'static,
    Bt: Batcher<B, I, M::Input> + Clone + 'static,
{
    let batches = batches(case.dataset.len(), BATCH, STEPS);
    let expected = reference(case, &batches);
    for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
        // Stage 0's parameter bytes under the even split, by stages, for the uneven cases.
        let mut even_first_bytes = std::collections::HashMap::new();
        for stages in [2, 3, 4] {
            for micro_batches in [1, 4, 7] {
                let (model, stats) = train(
                    case,
                    &batches,
                    world(stages),
                    config(stages, micro_batches, schedule),
                );
                let what = format!("{name} {schedule} p={stages} m={micro_batches}");
                assert_equivalent(&model, &expected, &case.model, &what);
                for s in stats {
                    if s.rank == 0 {
                        even_first_bytes.insert(stages, s.param_bytes);
                    }
                    let peak = s.peak_live_micro_batches;
                    match schedule {
                        Schedule::GPipe => assert_eq!(peak, micro_batches, "{what}"),
                        Schedule::OneFOneB => {
                            assert!(peak <= stages, "{what}: stage {} held {peak}", s.rank);
                            assert!(peak <= micro_batches, "{what}");
                        }
                    }
                    assert!(s.compute > std::time::Duration::ZERO, "{what}");
                }
            }
        }
        // Stage-granular activation checkpointing: the same training, recomputed.
        for (stages, micro_batches) in [(3, 4), (2, 7)] {
            let recompute = PipelineConfig {
                recompute: true,
                ..config(stages, micro_batches, schedule)
            };
            let (model, _) = train(case, &batches, world(stages), recompute);
            let what = format!("{name} {schedule} p={stages} m={micro_batches} recomputed");
            assert_equivalent(&model, &expected, &case.model, &what);
        }
        let accumulate = PipelineConfig {
            grad_accumulation: 2,
            ..config(2, 3, schedule)
        };
        let (model, _) = train(case, &batches, world(2), accumulate);
        let what = format!("{name} {schedule} accumulation 2");
        assert_equivalent(&model, &expected, &case.model, &what);
        let (model, stats) = train(case, &batches, world(4), config(2, 3, schedule));
        assert_eq!(stats.len(), 4);
        let what = format!("{name} {schedule} dp × pp = 2 × 2");
        assert_equivalent(&model, &expected, &case.model, &what);
        // Uneven stages, and uneven stages on a dp × pp mesh. Each first stage holds more
        // parameters than the even split's exactly when it holds more blocks (the blocks of
        // these models are alike), which shows the boundaries were the ones asked for.
        for (blocks, ranks) in [
            (vec![1, 3], 2),
            (vec![3, 1], 2),
            (vec![1, 2, 1], 3),
            (vec![1, 3], 4),
        ] {
            let stages = blocks.len();
            let uneven = PipelineConfig {
                stage_blocks: Some(blocks.clone()),
                ..config(stages, 4, schedule)
            };
            let (model, stats) = train(case, &batches, world(ranks), uneven);
            let what = format!("{name} {schedule} stages of {blocks:?} blocks on {ranks} ranks");
            assert_equivalent(&model, &expected, &case.model, &what);
            let bytes = stats.iter().find(|s| s.rank == 0).unwrap().param_bytes;
            let even_bytes = even_first_bytes[&stages];
            let even_first = 4usize.div_ceil(stages);
            assert_eq!(
                bytes.cmp(&even_bytes),
                blocks[0].cmp(&even_first),
                "{what}: the first stage holds {bytes} bytes, the even split's {even_bytes}"
            );
        }
    }
}

#[test]
fn the_mlp_pipelines_like_single_device_training() {
    check_every_shape("mlp", &mlp_case(4, 16));
}

#[test]
fn the_transformer_pipelines_like_single_device_training() {
    let base = transformer_case();
    let device = Default::default();
    let model = seeded::<B, _>(&device, 7, || {
        TransformerConfig::new()
            .with_layers(4)
            .init::<B>(&device)
            .fork(&device)
    });
    let case = Case {
        model,
        dataset: base.dataset,
        batcher: base.batcher,
    };
    check_every_shape("transformer", &case);
}

#[test]
fn the_ad_model_pipelines_like_single_device_training() {
    use kiln::ad::env::DarkRoomConfig;
    use kiln::ad::model::AdModelConfig;
    let base = ad_case();
    let device = Default::default();
    // `ad_case`'s model with 4 blocks: the same room and windows.
    let room = DarkRoomConfig {
        size: 5,
        horizon: 6,
    };
    let config = AdModelConfig {
        context: 10,
        d_model: 16,
        d_ff: 32,
        layers: 4,
        ..AdModelConfig::default()
    };
    let model = seeded::<B, _>(&device, 7, || {
        config.init::<B>(&room, &device).fork(&device)
    });
    let case = Case {
        model,
        dataset: base.dataset,
        batcher: base.batcher,
    };
    check_every_shape("ad", &case);
}

/// The QLoRA transformer (frozen NF4 bases, trainable adapters and embeddings).
#[test]
fn the_qlora_model_pipelines_like_single_device_training() {
    use kiln::nn::lora::{LoraConfig, LoraKind, QuantConfig};
    use kiln::nn::models::LoraTransformerConfig;
    let base = qlora_case();
    let device = Default::default();
    let model = seeded::<B, _>(&device, 7, || {
        LoraTransformerConfig::new()
            .with_layers(4)
            .with_lora(LoraConfig::new().with_rank(4))
            .with_kind(LoraKind::QLora(QuantConfig::new()))
            .init::<B>(&device)
            .fork(&device)
    });
    let case = Case {
        model,
        dataset: base.dataset,
        batcher: base.batcher,
    };
    check_every_shape("qlora", &case);
}

#[test]
fn pipeline_times_data_parallel_matches() {
    let case = mlp_case(4, 16);
    let batches = batches(case.dataset.len(), BATCH, STEPS);
    let expected = reference(&case, &batches);
    for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
        // An explicit 2 × 2 mesh, and the same from a flat world of 4 ranks.
        let mesh = Mesh::new(&[("dp", 2), ("pp", 2)]).unwrap();
        let meshed = world(4).with_mesh(mesh).unwrap();
        for world in [meshed, world(4)] {
            let (model, stats) = train(&case, &batches, world, config(2, 4, schedule));
            assert_eq!(stats.len(), 4);
            assert_equivalent(&model, &expected, &case.model, &format!("{schedule} 2 × 2"));
        }
    }
}

#[test]
fn the_assembled_model_loads_into_single_and_gives_the_same_outputs() {
    let case = mlp_case(4, 16);
    let batches = batches(case.dataset.len(), BATCH, STEPS);
    let (trained, _) = train(&case, &batches, world(2), config(2, 4, Schedule::OneFOneB));
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder.record(trained.clone().into_record(), ()).unwrap();
    let device = Default::default();
    let loaded = MlpConfig::new()
        .with_layers(4)
        .with_hidden(16)
        .init::<B>(&device)
        .load_record(recorder.load(bytes, &device).unwrap());
    let batch = case.source::<B, _>().load(&batches[0], &device).unwrap();
    let (a, b) = (
        trained.forward(batch.features.clone()),
        loaded.forward(batch.features),
    );
    assert_eq!(
        a.into_data().to_vec::<f32>().unwrap(),
        b.into_data().to_vec::<f32>().unwrap()
    );
}

#[test]
fn impossible_pipelines_are_one_line_errors() {
    let case = mlp_case(2, 8);
    let make = |world: World<_>, config: PipelineConfig| {
        Pipeline::new(
            &world,
            case.model.clone(),
            AdamWConfig::new().init(),
            case.source(),
            config,
        )
        .err()
        .expect("refused")
        .to_string()
    };
    assert_eq!(
        make(world(3), config(3, 2, Schedule::GPipe)),
        "the pipeline has 3 stages but the model has 2 blocks to split between; use at most 2 \
         stages"
    );
    assert!(
        make(world(3), config(2, 2, Schedule::GPipe))
            .starts_with("a pipeline of 2 stages needs a world of dp × 2 ranks"),
    );
    let blocks = |stage_blocks: Vec<usize>, stages| PipelineConfig {
        stage_blocks: Some(stage_blocks),
        ..config(stages, 2, Schedule::GPipe)
    };
    assert_eq!(
        make(world(2), blocks(vec![1, 2], 2)),
        "stage_blocks [1, 2] add up to 3 blocks but the model has 2; the counts must cover every \
         block once"
    );
    assert_eq!(
        make(world(2), blocks(vec![0, 2], 2)),
        "stage_blocks gives stage 0 no blocks ([0, 2]); every stage needs at least one (use fewer \
         stages instead)"
    );
    assert_eq!(
        make(world(2), blocks(vec![2], 2)),
        "stage_blocks lists 1 stages ([2]) but the pipeline has 2; give one count of blocks per \
         stage, first to last, or set stages to 1"
    );
    let mut pipeline = Pipeline::new(
        &world(2),
        case.model.clone(),
        AdamWConfig::new().init(),
        case.source(),
        config(2, 8, Schedule::OneFOneB),
    )
    .unwrap();
    let error = pipeline.step(&[0, 1, 2, 3], LR).unwrap_err().to_string();
    assert_eq!(
        error,
        "8 micro-batches but a replica's shard of the global batch of 4 (over 1 replica(s)) \
         has only 4 samples; use at most 4 micro-batches or a larger batch"
    );
}
