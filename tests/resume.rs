//! Resume: `k` steps, a checkpoint on disk (the model's record and the strategy's optimizer
//! state), then a new strategy built from both in a "new process" (a freshly initialised model
//! loading the record) for `k` more steps ends with the parameters of `2k` uninterrupted steps,
//! bit for bit, for every strategy (`Tensor` too, on the model that shards). Checkpoints are in the model's own shape: one from Ddp
//! resumes in Single. A state of another layout or optimizer is refused with a clear error.

mod common;

use std::path::{Path, PathBuf};

use burn::data::dataloader::batcher::Batcher;
use burn::optim::AdamWConfig;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use common::*;
use kiln::core::optim::{OptimizerState, PerformanceConfig, StateError};
use kiln::core::strategy::StrategyModel;
use kiln::core::strategy::{
    PerformanceSpec, RankError, ShardState, StrategyConfigs, StrategyError, StrategyKind, build,
};

const K: usize = 3;

fn configs(stages: usize) -> StrategyConfigs {
    let mut configs = StrategyConfigs::default();
    configs.set_threads_per_rank(1);
    configs.ddp.collective_timeout_s = 60.0;
    configs.pipeline.collective_timeout_s = 60.0;
    configs.pipeline.stages = stages;
    configs.pipeline.micro_batches = 2;
    // Tensor: tp = 2 (the default), with these stages.
    configs.tensor.stages = stages;
    configs.tensor.collective_timeout_s = 60.0;
    configs
}

/// AdamW with clipping, so the PerformanceOptimizer's state passes through too.
fn spec() -> PerformanceSpec<AdamWConfig> {
    PerformanceSpec::new(
        AdamWConfig::new(),
        PerformanceConfig::new().with_clip_norm(Some(1.0)),
    )
    .unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-resume-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::new()
}

/// Trains `model` with `kind` on `batches`, after loading `resume_from`'s optimizer state if
/// given; saves the model and the optimizer state into `save_to` if given.
#[allow(clippy::too_many_arguments)]
fn train<M, I, Bt>(
    kind: StrategyKind,
    world: usize,
    configs: &StrategyConfigs,
    case: &Case<M, I, Bt>,
    model: M,
    batches: &[Vec<usize>],
    resume_from: Option<&Path>,
    save_to: Option<&Path>,
) -> M
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
        model,
        &spec(),
        case.source(),
    )
    .unwrap_or_else(|e| panic!("{kind} world {world}: {e}"));
    if let Some(dir) = resume_from {
        let state = OptimizerState::load(dir).unwrap();
        strategy.load_optimizer_state(&state).unwrap();
    }
    for batch in batches {
        strategy.step(batch, LR).unwrap();
    }
    let model = strategy.model().unwrap();
    if let Some(dir) = save_to {
        strategy.optimizer_state().unwrap().save(dir).unwrap();
        model
            .clone()
            .save_file(dir.join("model"), &recorder())
            .unwrap();
    }
    model
}

/// `2k` uninterrupted steps against `k` steps, a checkpoint, and `k` steps of a new strategy
/// (of kind `resume_kind`) over a new model loading it. `fresh` builds the model again, as a
/// new process would, with its own parameter ids and values.
fn check_resume<M, I, Bt>(
    name: &str,
    case: &Case<M, I, Bt>,
    fresh: impl Fn() -> M,
    (kind, world, stages): (StrategyKind, usize, usize),
    (resume_kind, resume_world): (StrategyKind, usize),
    bit_exact: bool,
) where
    M: StrategyModel<B>,
    I: Clone + Send + Sync + 'static,
    Bt: Batcher<B, I, M::Input> + Clone + 'static,
{
    let configs = configs(stages);
    check_resume_with(
        name,
        case,
        fresh,
        (kind, world, &configs),
        (resume_kind, resume_world, &configs),
        bit_exact,
    );
}

/// [`check_resume`] with the settings of each run given.
fn check_resume_with<M, I, Bt>(
    name: &str,
    case: &Case<M, I, Bt>,
    fresh: impl Fn() -> M,
    (kind, world, configs): (StrategyKind, usize, &StrategyConfigs),
    (resume_kind, resume_world, resume_configs): (StrategyKind, usize, &StrategyConfigs),
    bit_exact: bool,
) where
    M: StrategyModel<B>,
    I: Clone + Send + Sync + 'static,
    Bt: Batcher<B, I, M::Input> + Clone + 'static,
{
    let batches = batches(case.dataset.len(), 11, 2 * K);
    let shard = |c: &StrategyConfigs| c.ddp.shard_state;
    let what = format!(
        "{name}: {kind} world {world} (shard_state {}) resumed as {resume_kind} world \
         {resume_world} (shard_state {})",
        shard(configs),
        shard(resume_configs)
    );
    let straight = train(
        kind,
        world,
        configs,
        case,
        case.model.clone(),
        &batches,
        None,
        None,
    );

    let dir = scratch(&format!(
        "{name}-{kind}-{world}-{}-{resume_kind}-{}",
        shard(configs),
        shard(resume_configs)
    ));
    train(
        kind,
        world,
        configs,
        case,
        case.model.clone(),
        &batches[..K],
        None,
        Some(&dir),
    );
    let restored = fresh()
        .load_file(dir.join("model"), &recorder(), &Default::default())
        .unwrap();
    let resumed = train(
        resume_kind,
        resume_world,
        resume_configs,
        case,
        restored,
        &batches[K..],
        Some(&dir),
        None,
    );
    let _ = std::fs::remove_dir_all(&dir);

    if bit_exact {
        assert!(
            parameters(&resumed) == parameters(&straight),
            "{what}: the resumed run differs from the uninterrupted one"
        );
    } else {
        assert_equivalent(&resumed, &straight, &case.model, &what);
    }
}

fn same(kind: StrategyKind, world: usize, stages: usize) -> [(StrategyKind, usize, usize); 1] {
    [(kind, world, stages)]
}

/// Every strategy, resumed as itself: bit for bit.
fn every_strategy() -> Vec<(StrategyKind, usize, usize)> {
    [
        same(StrategyKind::Single, 1, 1),
        same(StrategyKind::DataParallel, 2, 1),
        same(StrategyKind::Ddp, 2, 1),
        same(StrategyKind::Ddp, 3, 1),
        same(StrategyKind::Pipeline, 2, 2),
        same(StrategyKind::Pipeline, 4, 2),
    ]
    .concat()
}

#[test]
fn mlp_resumes_bit_for_bit_with_every_strategy() {
    let case = mlp_case(2, 16);
    for (kind, world, stages) in every_strategy() {
        let fresh = || mlp_case(2, 16).model;
        check_resume(
            "mlp",
            &case,
            fresh,
            (kind, world, stages),
            (kind, world),
            true,
        );
    }
}

#[test]
fn ad_model_resumes_bit_for_bit_with_every_strategy() {
    let case = ad_case();
    // The MLP does not shard; the AD model does: tp = 2, dp × tp = 2 × 2, pp × tp = 2 × 2.
    let tensor = [
        same(StrategyKind::Tensor, 2, 1),
        same(StrategyKind::Tensor, 4, 1),
        same(StrategyKind::Tensor, 4, 2),
    ]
    .concat();
    for (kind, world, stages) in [every_strategy(), tensor].concat() {
        let fresh = || ad_case().model;
        check_resume(
            "ad",
            &case,
            fresh,
            (kind, world, stages),
            (kind, world),
            true,
        );
    }
}

#[test]
fn a_ddp_checkpoint_resumes_in_single_and_back() {
    let case = mlp_case(2, 16);
    let fresh = || mlp_case(2, 16).model;
    let (ddp, single) = (StrategyKind::Ddp, StrategyKind::Single);
    // Other strategies sum gradients in another order: equal within rounding, not bits.
    check_resume("mlp", &case, fresh, (ddp, 3, 1), (single, 1), false);
    check_resume("mlp", &case, fresh, (single, 1, 1), (ddp, 2), false);
    check_resume(
        "mlp",
        &case,
        fresh,
        (StrategyKind::DataParallel, 2, 1),
        (ddp, 3),
        false,
    );
}

#[test]
fn a_zero_checkpoint_resumes_as_itself_as_another_stage_as_plain_ddp_and_in_single() {
    let case = mlp_case(2, 16);
    let fresh = || mlp_case(2, 16).model;
    let plain = configs(1);
    let mut zero1 = configs(1);
    zero1.ddp.shard_state = ShardState::Optimizer;
    let mut zero2 = configs(1);
    zero2.ddp.shard_state = ShardState::Gradients;
    let mut zero3 = configs(1);
    zero3.ddp.shard_state = ShardState::Parameters;
    let (ddp, single) = (StrategyKind::Ddp, StrategyKind::Single);
    // The owners step exactly what every replica of plain ddp steps: the same bits. Single
    // sums gradients in another order: equal within rounding, not bits.
    for (from, to, bits) in [
        ((ddp, 3, &zero1), (ddp, 3, &zero1), true),
        ((ddp, 3, &zero1), (ddp, 3, &plain), true),
        ((ddp, 2, &plain), (ddp, 2, &zero1), true),
        ((ddp, 3, &zero1), (single, 1, &plain), false),
        ((ddp, 3, &zero2), (ddp, 3, &zero2), true),
        ((ddp, 3, &zero2), (ddp, 3, &zero1), true),
        ((ddp, 2, &zero1), (ddp, 2, &zero2), true),
        ((ddp, 3, &zero2), (single, 1, &plain), false),
        ((ddp, 3, &zero3), (ddp, 3, &zero3), true),
        ((ddp, 3, &zero3), (ddp, 3, &zero1), true),
        ((ddp, 2, &zero2), (ddp, 2, &zero3), true),
        ((ddp, 3, &zero3), (single, 1, &plain), false),
    ] {
        check_resume_with("mlp", &case, fresh, from, to, bits);
    }
}

/// A Ddp over two ranks for `case`'s model.
fn ddp_of<M, I, Bt>(case: &Case<M, I, Bt>) -> Box<dyn kiln::core::strategy::Strategy<B, M>>
where
    M: StrategyModel<B>,
    I: Clone + Send + Sync + 'static,
    Bt: Batcher<B, I, M::Input> + Clone + 'static,
{
    let devices = vec![Default::default(); 2];
    let model = case.model.clone();
    build(
        &plan(StrategyKind::Ddp, 2, &configs(1), 2),
        devices,
        model,
        &spec(),
        case.source(),
    )
    .unwrap()
}

#[test]
fn a_pipeline_state_is_refused_by_ddp_with_both_layouts_named() {
    let case = mlp_case(2, 16);
    let batches = batches(case.dataset.len(), 11, 1);
    let dir = scratch("layout");
    train(
        StrategyKind::Pipeline,
        2,
        &configs(2),
        &case,
        case.model.clone(),
        &batches,
        None,
        Some(&dir),
    );
    let state = OptimizerState::load(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let error = ddp_of(&case).load_optimizer_state(&state).unwrap_err();
    assert!(
        matches!(error, StrategyError::State(StateError::Layout { .. })),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("2-stage pipeline") && message.contains("whole model"),
        "{message}"
    );
}

#[test]
fn a_corrupt_or_missing_state_is_an_error_not_a_panic() {
    let dir = scratch("corrupt");
    assert!(matches!(
        OptimizerState::load(&dir),
        Err(StateError::Io { .. } | StateError::Missing(_))
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("optimizer.mpk"), b"not a state").unwrap();
    let state = OptimizerState::load(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let case = mlp_case(2, 16);
    let error = ddp_of(&case).load_optimizer_state(&state).unwrap_err();
    let StrategyError::Failed { failures, .. } = &error else {
        panic!("expected a rank failure, got {error}");
    };
    assert!(
        failures
            .iter()
            .all(|f| matches!(f.error, RankError::State(StateError::Decode(_)))),
        "{error}"
    );
}
