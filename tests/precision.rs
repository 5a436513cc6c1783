//! Mixed precision: the built-in MLP and the Algorithm Distillation model trained in bf16 and
//! f16 (f32 master weights) through Single, Ddp and Tensor reach a final loss within 5 % of
//! f32 training, and their parameters stay f32.

mod common;

use burn::module::Module;
use burn::optim::AdamWConfig;
use burn::tensor::DType;
use common::*;
use kiln::core::World;
use kiln::core::optim::{
    LossScale, LossScaleConfig, MixedPrecision, PerformanceConfig, PerformanceOptimizer, Precision,
};
use kiln::core::strategy::{
    Ddp, DdpConfig, PipelineConfig, ShardState, Single, SingleConfig, Strategy, Tensor,
    TensorConfig,
};
use kiln::kernels::FusedAdamWConfig;
use kiln::nn::models::Mlp;

const STEPS: usize = 60;

/// The mean loss of the last 10 of `STEPS` steps of the MLP in `precision` on `world` ranks.
fn final_loss(precision: Precision, world: usize) -> (f64, MixedPrecision<B, Mlp<B>>) {
    let case = mlp_case(2, 32);
    let model = MixedPrecision::new(case.model.clone(), precision);
    let data = case.source();
    let optim = AdamWConfig::new().init();
    let mut strategy: Box<dyn Strategy<B, MixedPrecision<B, Mlp<B>>>> = if world == 1 {
        let config = SingleConfig {
            threads_per_rank: Some(1),
            ..SingleConfig::default()
        };
        Box::new(Single::new(model, optim, data, Default::default(), config).unwrap())
    } else {
        let world = World::local(vec![Default::default(); world]).unwrap();
        let config = DdpConfig {
            threads_per_rank: Some(1),
            check_replicas_every: Some(1),
            ..DdpConfig::default()
        };
        Box::new(Ddp::new(&world, model, optim, data, config).unwrap())
    };
    let losses: Vec<f64> = batches(case.dataset.len(), 32, STEPS)
        .iter()
        .map(|batch| strategy.step(batch, LR).unwrap().loss)
        .collect();
    let tail = &losses[STEPS - 10..];
    (tail.iter().sum::<f64>() / 10.0, strategy.model().unwrap())
}

#[test]
fn bf16_and_f16_reach_the_f32_loss_within_5_percent() {
    let (f32_loss, _) = final_loss(Precision::F32, 1);
    eprintln!("f32: final loss {f32_loss:.5}");
    for precision in [Precision::Bf16, Precision::F16] {
        for world in [1, 2] {
            let (loss, model) = final_loss(precision, world);
            eprintln!("{precision} world {world}: final loss {loss:.5}");
            assert!(
                (loss - f32_loss).abs() <= 0.05 * f32_loss,
                "{precision} world {world}: final loss {loss} against f32's {f32_loss}"
            );
            // The master weights the optimizer stepped are f32.
            let mut dtypes = Vec::new();
            model.model.visit(&mut DTypes(&mut dtypes));
            assert!(dtypes.iter().all(|d| *d == DType::F32), "{dtypes:?}");
        }
    }
}

/// The mean loss of the last 10 of `steps` steps of the AD model in `precision` on `world`
/// Ddp ranks.
fn ad_final_loss(precision: Precision, world: usize, steps: usize) -> f64 {
    let case = ad_case();
    let model = MixedPrecision::new(case.model.clone(), precision);
    let world = World::local(vec![Default::default(); world]).unwrap();
    let config = DdpConfig {
        threads_per_rank: Some(1),
        ..DdpConfig::default()
    };
    let optim = AdamWConfig::new().init();
    let mut ddp = Ddp::new(&world, model, optim, case.source(), config).unwrap();
    let losses: Vec<f64> = batches(case.dataset.len(), 16, steps)
        .iter()
        .map(|batch| ddp.step(batch, LR).unwrap().loss)
        .collect();
    losses[steps - 10..].iter().sum::<f64>() / 10.0
}

#[test]
fn the_ad_model_in_bf16_and_f16_reaches_the_f32_loss_within_5_percent() {
    let steps = 40;
    let f32_loss = ad_final_loss(Precision::F32, 2, steps);
    eprintln!("AD f32: final loss {f32_loss:.5}");
    for precision in [Precision::Bf16, Precision::F16] {
        let loss = ad_final_loss(precision, 2, steps);
        eprintln!("AD {precision}: final loss {loss:.5}");
        assert!(
            (loss - f32_loss).abs() <= 0.05 * f32_loss,
            "{precision}: final loss {loss} against f32's {f32_loss}"
        );
    }
}

/// The mean loss of the last 10 of `steps` steps of the AD model in `precision` under Tensor
/// (tp = 2) on `dp × 2` ranks, its replicas checked bit-identical every step; and the gathered
/// model's parameter dtypes.
fn ad_tensor_final_loss(precision: Precision, dp: usize, steps: usize) -> (f64, Vec<DType>) {
    let case = ad_case();
    let model = MixedPrecision::new(case.model.clone(), precision);
    let world = World::local(vec![Default::default(); 2 * dp]).unwrap();
    let config = TensorConfig {
        tp: 2,
        threads_per_rank: Some(1),
        check_replicas_every: Some(1),
        ..TensorConfig::default()
    };
    let mut tensor = Tensor::new(
        &world,
        model,
        &AdamWConfig::new(),
        case.source(),
        config,
        &PipelineConfig::default(),
    )
    .unwrap();
    let losses: Vec<f64> = batches(case.dataset.len(), 16, steps)
        .iter()
        .map(|batch| tensor.step(batch, LR).unwrap().loss)
        .collect();
    let mut dtypes = Vec::new();
    tensor
        .model()
        .unwrap()
        .model
        .visit(&mut DTypes(&mut dtypes));
    (losses[steps - 10..].iter().sum::<f64>() / 10.0, dtypes)
}

#[test]
fn the_ad_model_sharded_in_bf16_and_f16_reaches_the_f32_loss_within_5_percent() {
    let steps = 40;
    let f32_loss = ad_final_loss(Precision::F32, 2, steps);
    for precision in [Precision::Bf16, Precision::F16] {
        for dp in [1, 2] {
            let (loss, dtypes) = ad_tensor_final_loss(precision, dp, steps);
            eprintln!("AD {precision} tensor dp {dp} × tp 2: final loss {loss:.5}");
            assert!(
                (loss - f32_loss).abs() <= 0.05 * f32_loss,
                "{precision} dp {dp}: final loss {loss} against f32's {f32_loss}"
            );
            assert!(dtypes.iter().all(|d| *d == DType::F32), "{dtypes:?}");
        }
    }
    // The shards really compute in low precision: bf16 training ends elsewhere than f32's.
    let (f32_tensor, _) = ad_tensor_final_loss(Precision::F32, 1, steps);
    let (bf16_tensor, _) = ad_tensor_final_loss(Precision::Bf16, 1, steps);
    assert_ne!(f32_tensor, bf16_tensor);
}

#[test]
fn half_precision_changes_the_arithmetic() {
    // The low-precision path is taken: its parameters differ from f32 training's.
    let (_, f32_model) = final_loss(Precision::F32, 1);
    let (_, bf16_model) = final_loss(Precision::Bf16, 1);
    assert_ne!(parameters(&f32_model.model), parameters(&bf16_model.model));
}

struct DTypes<'a>(&'a mut Vec<DType>);

impl burn::module::ModuleVisitor<B> for DTypes<'_> {
    fn visit_float<const D: usize>(
        &mut self,
        param: &burn::module::Param<burn::tensor::Tensor<B, D>>,
    ) {
        self.0.push(param.val().dtype());
    }
}

#[test]
fn an_overflow_halves_the_loss_scale_and_skips_the_step_on_every_rank_and_clean_runs_double_it() {
    let case = mlp_case(2, 32);
    // At 2^40 the f16 backward overflows (f16's largest value is 65504): the first steps
    // overflow, each halving the scale, until it fits; every 3 clean steps then double it.
    let config = LossScaleConfig {
        initial: 2f64.powi(40),
        growth_interval: 3,
        ..LossScaleConfig::default()
    };
    let scale = LossScale::new(config).unwrap();
    let model =
        MixedPrecision::new(case.model.clone(), Precision::F16).with_loss_scale(scale.clone());
    // The NaN policy stays `halt`: overflows under a loss scale are skipped all the same.
    let optim = PerformanceOptimizer::new(AdamWConfig::new().init(), PerformanceConfig::new())
        .unwrap()
        .with_loss_scale(scale);
    let world = World::local(vec![Default::default(); 2]).unwrap();
    let ddp_config = DdpConfig {
        threads_per_rank: Some(1),
        check_replicas_every: Some(1),
        ..DdpConfig::default()
    };
    let mut ddp = Ddp::new(&world, model, optim, case.source(), ddp_config).unwrap();

    let mut reports = Vec::new();
    for batch in batches(case.dataset.len(), 32, 40) {
        let before = parameters(&ddp.model().unwrap());
        let report = ddp.step(&batch, LR).unwrap().guard.unwrap();
        let after = parameters(&ddp.model().unwrap());
        // Ddp checked after the step that both replicas equal rank 0's, bit for bit.
        assert_eq!(report.skipped, before == after, "{report:?}");
        reports.push(report);
    }
    // The scale each step saw follows the state machine: halve after an overflow, double
    // after 3 clean steps in a row, else stay.
    let (mut expected, mut clean) = (config.initial, 0);
    for (step, report) in reports.iter().enumerate() {
        assert_eq!(
            report.loss_scale,
            Some(expected),
            "step {step}: {reports:?}"
        );
        if report.skipped {
            expected *= 0.5;
            clean = 0;
        } else {
            clean += 1;
            if clean == 3 {
                expected *= 2.0;
                clean = 0;
            }
        }
    }
    let skipped = reports.iter().filter(|r| r.skipped).count();
    assert!(
        skipped >= 10,
        "2^40 overflows f16 for many halvings: {skipped} skipped"
    );
    assert!(
        skipped < reports.len() - 6,
        "the scale found its level: {reports:?}"
    );
    assert!(
        reports
            .iter()
            .all(|r| r.skipped || r.grad_norm.is_finite() && r.grad_norm < 1e3),
        "the reported norm is unscaled: {reports:?}"
    );
}

/// The fused AdamW under a clipping guard, and `model` in `precision` (f16 with a loss scale
/// both share).
fn fused_in(precision: Precision, model: Ad) -> (FusedOptim, MixedPrecision<B, Ad>) {
    let guards = PerformanceConfig::new()
        .with_clip_norm(Some(0.5))
        .with_precision(precision);
    let optim = PerformanceOptimizer::new(FusedAdamWConfig::new().init(), guards).unwrap();
    let model = MixedPrecision::new(model, precision);
    if precision != Precision::F16 {
        return (optim, model);
    }
    let scale = LossScale::new(LossScaleConfig {
        initial: 1024.0,
        ..LossScaleConfig::default()
    })
    .unwrap();
    (
        optim.with_loss_scale(scale.clone()),
        model.with_loss_scale(scale),
    )
}

/// The AD model.
type Ad = kiln::ad::model::AdTransformer<B>;
/// The fused AdamW of [`fused_in`].
type FusedOptim = PerformanceOptimizer<kiln::kernels::FusedAdamW<MixedPrecision<B, Ad>, B>>;

/// The parameters after `steps` steps of the AD model in `precision` on one rank with the
/// fused AdamW under a clipping guard (f16 with a loss scale), its gradients cast to f32 by
/// mixed precision or handed over uncast (`uncast`).
fn ad_fused_params(precision: Precision, uncast: bool, steps: usize) -> Vec<Vec<f32>> {
    let case = ad_case();
    let (optim, mut model) = fused_in(precision, case.model.clone());
    if uncast {
        model = model.with_low_precision_grads();
    }
    let config = SingleConfig {
        threads_per_rank: Some(1),
        ..SingleConfig::default()
    };
    let mut single = Single::new(model, optim, case.source(), Default::default(), config).unwrap();
    for batch in batches(case.dataset.len(), 16, steps) {
        single.step(&batch, LR).unwrap();
    }
    let mut values = Vec::new();
    single
        .model()
        .unwrap()
        .model
        .visit(&mut Values(&mut values));
    values
}

#[test]
fn uncast_half_precision_gradients_train_exactly_as_cast_ones() {
    for precision in [Precision::Bf16, Precision::F16] {
        let cast = ad_fused_params(precision, false, 4);
        let uncast = ad_fused_params(precision, true, 4);
        assert_eq!(cast.len(), uncast.len());
        for (i, (a, b)) in cast.iter().zip(&uncast).enumerate() {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{precision}: parameter {i} differs"
            );
        }
    }
}

/// Every float parameter's values, in visiting order.
struct Values<'a>(&'a mut Vec<Vec<f32>>);

impl burn::module::ModuleVisitor<B> for Values<'_> {
    fn visit_float<const D: usize>(
        &mut self,
        param: &burn::module::Param<burn::tensor::Tensor<B, D>>,
    ) {
        self.0.push(param.val().into_data().to_vec().unwrap());
    }
}

/// On the CPU too (Flex tells its tensors apart), f16 training from the copies (the fused
/// AdamW's of the trained parameters, mixed precision's own of a frozen one) equals training
/// that casts every parameter in every step.
#[test]
fn f16_from_copies_trains_as_from_casts_on_the_cpu() {
    f16_copies_train_as_casts::<B>(Default::default());
}

/// The parameters after `steps` steps of the AD model in `precision` over 3 Ddp replicas with
/// the fused AdamW under a clipping guard (f16 with a loss scale), the optimizer state whole
/// on every replica or split among them, the replicas holding the others' parameters in the
/// compute dtype where `low_others` (as `fit` sets it); and the most parameter bytes a replica
/// holds between steps.
fn ad_ddp_params(
    precision: Precision,
    shard_state: ShardState,
    low_others: bool,
    steps: usize,
) -> (Vec<Vec<f32>>, u64) {
    let case = ad_case();
    let (optim, model) = fused_in(precision, case.model.clone());
    let world = World::local(vec![Default::default(); 3]).unwrap();
    let config = DdpConfig {
        threads_per_rank: Some(1),
        check_replicas_every: Some(1),
        shard_state,
        compute_dtype: low_others.then(|| precision.dtype()),
        ..DdpConfig::default()
    };
    let mut ddp = Ddp::new(&world, model, optim, case.source(), config).unwrap();
    for batch in batches(case.dataset.len(), 13, steps) {
        ddp.step(&batch, LR).unwrap();
    }
    let held = ddp.stats().iter().map(|s| s.param_bytes).max().unwrap();
    (parameters(&ddp.model().unwrap().model), held)
}

#[test]
fn split_state_trains_bf16_and_f16_as_whole_state() {
    for precision in [Precision::Bf16, Precision::F16] {
        let (whole, whole_bytes) = ad_ddp_params(precision, ShardState::None, false, 4);
        // ZeRO-1, the masters whole or split (the others' parameters held in the compute
        // dtype, as their owners cast them): plain ddp's bits.
        for low_others in [false, true] {
            let (split, bytes) = ad_ddp_params(precision, ShardState::Optimizer, low_others, 4);
            assert_eq!(whole.len(), split.len());
            for (i, (a, b)) in whole.iter().zip(&split).enumerate() {
                assert!(
                    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{precision} (others low: {low_others}): parameter {i} differs"
                );
            }
            // Every parameter of the AD model trains: with the masters split a replica holds
            // its own third in f32 and the rest in 2 bytes, about 2/3 of the f32 model's.
            let expected = if low_others { 2.0 / 3.0 } else { 1.0 };
            let ratio = bytes as f64 / whole_bytes as f64;
            assert!(
                (ratio - expected).abs() < 0.05,
                "{precision} (others low: {low_others}): {bytes} of {whole_bytes} bytes"
            );
        }
        // ZeRO-2's and ZeRO-3's clipping norm adds the owners' parts (in f32): the same
        // training to that sum's rounding, not bits. The f32 master weights are compared.
        for (stage, low_others) in [
            (ShardState::Gradients, false),
            (ShardState::Gradients, true),
            (ShardState::Parameters, false),
            (ShardState::Parameters, true),
        ] {
            let (split, _) = ad_ddp_params(precision, stage, low_others, 4);
            for (i, (a, b)) in whole.iter().zip(&split).enumerate() {
                let scale = a.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
                let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    worst <= 1e-5 * scale,
                    "{precision} {stage} (others low: {low_others}): parameter {i} off by \
                     {worst} of {scale}"
                );
            }
        }
    }
}
