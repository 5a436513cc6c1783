//! Failures never hang: a rank that panics mid-step makes every other rank return an error
//! naming it, well within the collective timeout, and the strategy refuses further steps.

mod common;

use std::time::{Duration, Instant};

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::optim::AdamWConfig;
use common::*;
use kiln::core::World;
use kiln::core::collective::CollectiveError;
use kiln::core::data::DataSource;
use kiln::core::strategy::{
    DataParallel, DataParallelConfig, Ddp, DdpConfig, RankError, ShardState, Strategy,
    StrategyError,
};
use kiln::nn::models::Mlp;
use kiln::nn::tasks::{ClassificationBatch, ClassificationBatcher, ClassificationItem};

const POISON: f32 = 1.0e30;

/// A batcher that panics on a marked sample, standing in for any bug in user code.
#[derive(Clone)]
struct PoisonedBatcher;

impl Batcher<B, ClassificationItem, ClassificationBatch<B>> for PoisonedBatcher {
    fn batch(
        &self,
        items: Vec<ClassificationItem>,
        device: &burn::tensor::Device<B>,
    ) -> ClassificationBatch<B> {
        assert!(
            items.iter().all(|i| i.features[0] != POISON),
            "poisoned sample"
        );
        ClassificationBatcher.batch(items, device)
    }
}

/// Sample 3 is poisoned; with 2 ranks and the batch `[0, 1, 2, 3]` it lands on rank 1.
fn poisoned_source() -> DataSource<B, ClassificationItem, ClassificationBatch<B>> {
    let case = mlp_case(1, 8);
    let mut items: Vec<ClassificationItem> = (0..8).map(|i| case.dataset.get(i).unwrap()).collect();
    items[3].features[0] = POISON;
    DataSource::new(InMemDataset::new(items), PoisonedBatcher)
}

fn assert_rank_1_blamed(error: &StrategyError) {
    let StrategyError::Failed { culprit, failures } = error else {
        panic!("expected a rank failure, got {error}");
    };
    assert_eq!(*culprit, 1, "{error}");
    let own = failures
        .iter()
        .find(|f| f.rank == 1)
        .expect("rank 1 reports");
    assert!(
        matches!(&own.error, RankError::Panicked(m) if m.contains("poisoned sample")),
        "{error}"
    );
}

#[test]
fn ddp_rank_panic_is_named_by_the_others_within_the_timeout() {
    let timeout = Duration::from_secs(20);
    let world = World::local(vec![Default::default(); 2]).unwrap();
    let config = DdpConfig {
        collective_timeout_s: timeout.as_secs_f64(),
        threads_per_rank: Some(1),
        ..DdpConfig::default()
    };
    let model = mlp_case(1, 8).model;
    let mut ddp = Ddp::new(
        &world,
        model,
        AdamWConfig::new().init(),
        poisoned_source(),
        config,
    )
    .unwrap();
    ddp.step(&[4, 5, 6, 7], LR).expect("a clean step");

    let start = Instant::now();
    let error = ddp.step(&[0, 1, 2, 3], LR).unwrap_err();
    assert!(start.elapsed() < timeout / 2, "took {:?}", start.elapsed());

    assert_rank_1_blamed(&error);
    let StrategyError::Failed { failures, .. } = &error else {
        unreachable!()
    };
    let other = failures
        .iter()
        .find(|f| f.rank == 0)
        .expect("rank 0 reports too");
    assert!(
        matches!(
            &other.error,
            RankError::Collective(CollectiveError::PeerFailed { failed_rank: 1, .. })
        ),
        "{other}"
    );
    assert!(error.to_string().contains("rank 1"), "{error}");

    assert_eq!(
        ddp.step(&[4, 5, 6, 7], LR).unwrap_err(),
        StrategyError::Broken { culprit: 1 }
    );
}

#[test]
fn data_parallel_device_panic_is_named() {
    let model = mlp_case(1, 8).model;
    let config = DataParallelConfig {
        threads_per_rank: Some(1),
        ..Default::default()
    };
    let mut dp = DataParallel::new(
        model,
        AdamWConfig::new().init(),
        poisoned_source(),
        vec![Default::default(); 2],
        config,
    )
    .unwrap();
    let error = dp.step(&[0, 1, 2, 3], LR).unwrap_err();
    assert_rank_1_blamed(&error);
    // The model survives a failed forward pass: the next clean step works.
    dp.step(&[4, 5, 6, 7], LR).unwrap();
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let world = World::local(vec![Default::default(); 3]).unwrap();
    let config = DdpConfig {
        threads_per_rank: Some(1),
        ..DdpConfig::default()
    };
    let mut ddp = Ddp::new(
        &world,
        mlp_case(1, 8).model,
        AdamWConfig::new().init(),
        poisoned_source(),
        config,
    )
    .unwrap();
    let small = ddp.step(&[4, 5], LR).unwrap_err();
    assert!(small.to_string().contains("at least 3"), "{small}");
    let out_of_range = ddp.step(&[4, 5, 100], LR).unwrap_err();
    assert!(out_of_range.to_string().contains("100"), "{out_of_range}");
}

#[test]
fn impossible_configs_are_rejected() {
    let world = World::local(vec![Default::default(); 2]).unwrap();
    for (config, needle) in [
        (
            DdpConfig {
                grad_accumulation: 0,
                ..DdpConfig::default()
            },
            "grad_accumulation",
        ),
        (
            DdpConfig {
                bucket_cap_mb: 0.0,
                ..DdpConfig::default()
            },
            "bucket_cap_mb",
        ),
        (
            DdpConfig {
                collective_timeout_s: -1.0,
                ..DdpConfig::default()
            },
            "collective_timeout_s",
        ),
        (
            DdpConfig {
                shard_state: ShardState::Gradients,
                gather_units: true,
                ..DdpConfig::default()
            },
            "gather_units gathers released parameters unit by unit, but shard_state is \"gradients\"",
        ),
    ] {
        let error = Ddp::new(
            &world,
            mlp_case(1, 8).model,
            AdamWConfig::new().init(),
            poisoned_source(),
            config,
        )
        .err()
        .expect("rejected");
        assert!(error.to_string().contains(needle), "{error}");
    }
}

#[test]
fn ddp_refuses_a_mesh_that_splits_the_model() {
    use kiln::core::world::Mesh;
    let case = mlp_case(1, 8);
    let world = World::local(vec![Default::default(); 4])
        .unwrap()
        .with_mesh(Mesh::new(&[("dp", 2), ("pp", 2)]).unwrap())
        .unwrap();
    let error = Ddp::new(
        &world,
        case.model.clone(),
        AdamWConfig::new().init(),
        case.source(),
        DdpConfig::default(),
    )
    .err()
    .expect("a dp × pp mesh is refused");
    assert_eq!(
        error.to_string(),
        "ddp keeps a whole replica on every rank, but mesh dp=2 × pp=2 also splits the model; \
         give it a mesh with only a dp axis (World::local does), or use a strategy that splits"
    );
}

/// A stage that panics (here: on a poisoned sample, which both stages load) fails the step
/// well within the timeout on every rank, with the failure named, and breaks the strategy.
#[test]
fn pipeline_stage_panic_is_named_within_the_timeout() {
    use kiln::core::strategy::{Pipeline, PipelineConfig, Schedule};
    let timeout = Duration::from_secs(20);
    let config = PipelineConfig {
        stages: 2,
        micro_batches: 2,
        schedule: Schedule::OneFOneB,
        collective_timeout_s: timeout.as_secs_f64(),
        threads_per_rank: Some(1),
        ..PipelineConfig::default()
    };
    let mut pipeline = Pipeline::new(
        &World::local(vec![Default::default(); 2]).unwrap(),
        mlp_case(2, 8).model,
        AdamWConfig::new().init(),
        poisoned_source(),
        config,
    )
    .unwrap();
    pipeline.step(&[4, 5, 6, 7], LR).expect("a clean step");

    let start = Instant::now();
    let error = pipeline.step(&[0, 1, 2, 3], LR).unwrap_err();
    assert!(start.elapsed() < timeout / 2, "took {:?}", start.elapsed());
    let StrategyError::Failed { failures, culprit } = &error else {
        panic!("expected a rank failure, got {error}");
    };
    assert_eq!(failures.len(), 2, "{error}");
    let blamed = failures.iter().find(|f| f.rank == *culprit).unwrap();
    assert!(
        matches!(&blamed.error, RankError::Panicked(m) if m.contains("poisoned sample")),
        "{error}"
    );
    assert!(matches!(
        pipeline.step(&[4, 5, 6, 7], LR).unwrap_err(),
        StrategyError::Broken { .. }
    ));
}

/// What [`OnRank1`] does on rank 1 after (or instead of) the inner optimizer's step.
#[derive(Clone, Copy)]
enum Rank1 {
    /// Moves one small value of the last parameter by one unit in the last place after every
    /// step: replicas that differ by the least amount f32 can express.
    Nudges,
    /// Panics in the step: under a split optimizer state, after the gradients' all-reduce
    /// and before the owners' broadcast, which the other ranks then wait in.
    Panics,
}

/// An optimizer that behaves like its inner one except on rank 1, where it does what its
/// [`Rank1`] says.
#[derive(Clone)]
struct OnRank1<O>(O, Rank1);

impl<O, M, Bk> burn::optim::Optimizer<M, Bk> for OnRank1<O>
where
    O: burn::optim::Optimizer<M, Bk>,
    M: burn::module::AutodiffModule<Bk>,
    Bk: burn::tensor::backend::AutodiffBackend,
{
    type Record = O::Record;

    fn step(&mut self, lr: f64, module: M, grads: burn::optim::GradientsParams) -> M {
        // Rank r's work runs on its pool's threads, `kiln-rank{r}-{i}`.
        let on_rank_1 = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("kiln-rank1-"));
        if on_rank_1 && matches!(self.1, Rank1::Panics) {
            panic!("rank 1's optimizer step fails");
        }
        let module = self.0.step(lr, module, grads);
        if on_rank_1 {
            let left = count_floats::<Bk, M>(&module);
            module.map(&mut NudgeLast { left })
        } else {
            module
        }
    }

    fn step_multi(&mut self, lr: f64, module: M, grads: burn::optim::MultiGradientsParams) -> M {
        self.0.step_multi(lr, module, grads)
    }

    fn to_record(&self) -> Self::Record {
        self.0.to_record()
    }

    fn load_record(self, record: Self::Record) -> Self {
        Self(self.0.load_record(record), self.1)
    }
}

impl<O, M, Bk> kiln::core::optim::GuardedOptimizer<M, Bk> for OnRank1<O>
where
    O: kiln::core::optim::GuardedOptimizer<M, Bk>,
    M: burn::module::AutodiffModule<Bk>,
    Bk: burn::tensor::backend::AutodiffBackend,
{
    fn retain_state(self, keep: &std::collections::HashSet<burn::module::ParamId>) -> Option<Self> {
        let act = self.1;
        self.0.retain_state(keep).map(|o| Self(o, act))
    }

    fn merge_state(self, other: Self) -> Option<Self> {
        let act = self.1;
        self.0.merge_state(other.0).map(|o| Self(o, act))
    }
}

fn count_floats<Bk: burn::tensor::backend::Backend, M: burn::module::Module<Bk>>(
    module: &M,
) -> usize {
    struct Count(usize);
    impl<Bk: burn::tensor::backend::Backend> burn::module::ModuleVisitor<Bk> for Count {
        fn visit_float<const D: usize>(
            &mut self,
            _: &burn::module::Param<burn::tensor::Tensor<Bk, D>>,
        ) {
            self.0 += 1;
        }
    }
    let mut count = Count(0);
    module.visit(&mut count);
    count.0
}

/// Moves the smallest nonzero value of the last float parameter up by one ulp.
struct NudgeLast {
    left: usize,
}

impl<Bk: burn::tensor::backend::Backend> burn::module::ModuleMapper<Bk> for NudgeLast {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<burn::tensor::Tensor<Bk, D>>,
    ) -> burn::module::Param<burn::tensor::Tensor<Bk, D>> {
        self.left -= 1;
        if self.left > 0 {
            return param;
        }
        param.map(|t| {
            let dims = t.dims();
            let mut values = t.to_data().convert::<f32>().to_vec::<f32>().unwrap();
            let smallest = (0..values.len())
                .filter(|&i| values[i] != 0.0)
                .min_by(|&a, &b| values[a].abs().total_cmp(&values[b].abs()))
                .unwrap();
            values[smallest] = f32::from_bits(values[smallest].to_bits() + 1);
            burn::tensor::Tensor::from_data(
                burn::tensor::TensorData::new(values, dims),
                &t.device(),
            )
            .set_require_grad(t.is_require_grad())
        })
    }
}

/// Replicas that differ in the last bit of one value are caught at the step it happens, with
/// the parameter named: the check compares exact bits, not a float checksum (a sum over every
/// value would absorb a one-ulp change of a small one).
#[test]
fn ddp_replica_check_names_a_parameter_one_ulp_off() {
    let case = mlp_case(2, 16);
    let config = DdpConfig {
        check_replicas_every: Some(1),
        threads_per_rank: Some(1),
        ..DdpConfig::default()
    };
    let mut ddp = Ddp::new(
        &World::local(vec![Default::default(); 2]).unwrap(),
        case.model.clone(),
        OnRank1(AdamWConfig::new().init(), Rank1::Nudges),
        case.source(),
        config,
    )
    .unwrap();
    let error = ddp.step(&[0, 1, 2, 3], LR).unwrap_err();
    let StrategyError::Failed { failures, .. } = &error else {
        panic!("expected a rank failure, got {error}");
    };
    let own = failures
        .iter()
        .find(|f| f.rank == 1)
        .expect("rank 1 reports");
    assert_eq!(
        own.error,
        RankError::ReplicasDiverged {
            step: 1,
            param: "head.bias".into()
        },
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("parameter head.bias is not bit-identical to rank 0's"),
        "{error}"
    );
}

#[test]
fn a_rank_that_fails_before_the_owners_broadcast_is_named_within_the_timeout() {
    // ZeRO-1, and ZeRO-2 whose owners received their gradients alone first.
    for stage in [ShardState::Optimizer, ShardState::Gradients] {
        owner_fails_before_its_broadcast(stage);
    }
}

#[test]
fn under_zero3_a_rank_that_fails_is_named_and_no_gather_waits_for_it() {
    // Rank 1 fails in its optimizer step, after the gradients reached their owners. Rank 0
    // does not wait for a broadcast after the step (its gather comes with the next step), so
    // it finishes; the step names rank 1, and what would gather next (a step, the model) is
    // refused at once instead of waiting in a gather rank 1 never joins.
    let timeout = Duration::from_secs(20);
    let mut ddp = rank_1_panics_in_its_step(ShardState::Parameters, timeout);
    let start = Instant::now();
    let error = ddp.step(&[0, 1, 2, 3], LR).unwrap_err();
    let StrategyError::Failed { culprit, failures } = &error else {
        panic!("expected a rank failure, got {error}");
    };
    assert_eq!(*culprit, 1, "{error}");
    assert!(
        failures.iter().any(|f| f.rank == 1
            && matches!(&f.error, RankError::Panicked(m) if m.contains("optimizer step fails"))),
        "{error}"
    );
    for error in [
        ddp.step(&[0, 1, 2, 3], LR).unwrap_err(),
        ddp.model().expect_err("no model from a broken world"),
    ] {
        assert_eq!(error, StrategyError::Broken { culprit: 1 });
    }
    assert!(start.elapsed() < timeout / 2, "took {:?}", start.elapsed());
}

#[test]
fn a_model_that_does_not_gather_its_units_is_refused_before_its_update() {
    // `gather_units` with a model that runs its layers without gathering them: the step would
    // have run on placeholders, so it fails, naming a parameter it left ungathered, and the
    // replicas keep the parameters they started with.
    let world = World::local(vec![Default::default(); 2]).unwrap();
    let config = DdpConfig {
        threads_per_rank: Some(1),
        shard_state: ShardState::Parameters,
        gather_units: true,
        ..DdpConfig::default()
    };
    let case = mlp_case(1, 8);
    let optim = AdamWConfig::new().init();
    let mut ddp = Ddp::new(&world, case.model.clone(), optim, case.source(), config).unwrap();
    let error = ddp.step(&[0, 1, 2, 3], LR).unwrap_err();
    let StrategyError::Failed { failures, .. } = &error else {
        panic!("expected a rank failure, got {error}");
    };
    assert_eq!(failures.len(), 2, "{error}");
    for failure in failures {
        assert!(
            matches!(&failure.error, RankError::Ungathered { param } if param.contains("weight") || param.contains("bias")),
            "{error}"
        );
    }
    assert!(error.to_string().contains("did not gather it"), "{error}");
}

/// A Ddp of two ranks splitting its state as `shard_state` says, whose rank 1 panics in its
/// optimizer step.
fn rank_1_panics_in_its_step(shard_state: ShardState, timeout: Duration) -> Ddp<B, Mlp<B>> {
    let world = World::local(vec![Default::default(); 2]).unwrap();
    let config = DdpConfig {
        collective_timeout_s: timeout.as_secs_f64(),
        threads_per_rank: Some(1),
        shard_state,
        ..DdpConfig::default()
    };
    let case = mlp_case(1, 8);
    let optim = OnRank1(AdamWConfig::new().init(), Rank1::Panics);
    Ddp::new(&world, case.model.clone(), optim, case.source(), config).unwrap()
}

fn owner_fails_before_its_broadcast(shard_state: ShardState) {
    let timeout = Duration::from_secs(20);
    let mut ddp = rank_1_panics_in_its_step(shard_state, timeout);
    let start = Instant::now();
    let error = ddp.step(&[0, 1, 2, 3], LR).unwrap_err();
    assert!(start.elapsed() < timeout / 2, "took {:?}", start.elapsed());
    let StrategyError::Failed { culprit, failures } = &error else {
        panic!("expected a rank failure, got {error}");
    };
    assert_eq!(*culprit, 1, "{error}");
    let waiting = failures
        .iter()
        .find(|f| f.rank == 0)
        .expect("rank 0 reports");
    assert!(
        matches!(
            &waiting.error,
            RankError::Collective(CollectiveError::PeerFailed {
                op: kiln::core::collective::CollectiveOp::Broadcast { .. },
                failed_rank: 1,
                ..
            })
        ),
        "{shard_state}: rank 0 waited in the owners' broadcast: {waiting}"
    );
}
