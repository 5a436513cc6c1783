//! Kiln on CUDA: strategies whose ranks share one GPU train exactly like single-device training
//! on it, and a model that runs the CubeCL kernels (the QLoRA transformer) trains on CUDA as it
//! does on Flex.
//!
//! Needs an NVIDIA GPU: `cargo test --release --features cuda --test cuda`, or the bundle that
//! `crates/kiln-kernels/GPU.md` describes for a GPU machine without cargo.
//!
//! Tolerances. Burn's f32 matmul on CUDA stages its inputs in TF32 on tensor cores (10 mantissa
//! bits), so two f32 runs that split a batch differently round differently at about 1e-3 of a
//! product instead of 1e-7. The CPU suite's 1e-5 therefore becomes [`CUDA_TOLERANCE`] here.

#![cfg(feature = "cuda")]

mod common;

use burn::backend::cuda::CudaDevice;
use burn::backend::{Autodiff, Cuda};
use burn::module::Module;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use common::*;
use kiln::core::strategy::{ShardState, Single, SingleConfig, Strategy};
use kiln::kernels::FusedAdamWConfig;

type G = Autodiff<Cuda>;

/// Relative tolerance of whole-model equivalence on CUDA (TF32 matmuls, see above).
const CUDA_TOLERANCE: f32 = 2e-3;

/// Two ranks on the one GPU: what `kiln train --devices 0,0` builds.
fn shared_gpu(on: OnOneDevice) {
    shared_device_matches_single::<G>(CudaDevice::default(), 2, on, CUDA_TOLERANCE);
}

#[test]
fn ddp_with_two_ranks_on_one_gpu_matches_single_device() {
    shared_gpu(OnOneDevice::Ddp(ShardState::None));
}

#[test]
fn zero3_with_two_ranks_on_one_gpu_matches_single_device() {
    shared_gpu(OnOneDevice::Ddp(ShardState::Parameters));
}

#[test]
fn data_parallel_with_two_ranks_on_one_gpu_matches_single_device() {
    shared_gpu(OnOneDevice::DataParallel);
}

/// The QLoRA transformer (the kernels' forward and backward, the fused AdamW) from the same
/// weights on Flex (the plain-Burn reference path) and on CUDA (the CubeCL kernels): the
/// loss curves of 20 steps agree.
#[test]
fn the_qlora_model_trains_on_cuda_as_on_flex() {
    const STEPS: usize = 20;
    let cpu = qlora_case();
    let device = CudaDevice::default();
    let gpu = qlora_case_on::<G>(&device);
    // The same starting weights on both: Flex's, through a record in memory.
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder
        .record(cpu.model.clone().into_record(), ())
        .unwrap();
    let gpu_model = gpu
        .model
        .clone()
        .load_record(recorder.load(bytes, &device).unwrap());
    let batches = batches(cpu.dataset.len(), 16, STEPS);

    let mut on_cpu = Single::new(
        cpu.model.clone(),
        FusedAdamWConfig::new().init(),
        cpu.source(),
        Default::default(),
        SingleConfig::default(),
    )
    .unwrap();
    let mut on_gpu = Single::new(
        gpu_model,
        FusedAdamWConfig::new().init(),
        gpu.source(),
        device,
        SingleConfig::default(),
    )
    .unwrap();
    let expected: Vec<f64> = batches
        .iter()
        .map(|b| on_cpu.step(b, LR).unwrap().loss)
        .collect();
    let got: Vec<f64> = batches
        .iter()
        .map(|b| on_gpu.step(b, LR).unwrap().loss)
        .collect();
    assert!(
        expected[STEPS - 1] < expected[0],
        "training lowered the loss: {expected:?}"
    );
    for (step, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert!(
            (g - e).abs() <= CUDA_TOLERANCE as f64 * e.abs(),
            "step {step}: loss {g} on CUDA, {e} on Flex\n{got:?}\n{expected:?}"
        );
    }
}

/// Ddp replicas that clip by the global norm compute that norm each on their own, from the
/// same summed gradients: they must get the same bits, or they clip by different factors and
/// drift apart. Two ranks on one GPU, clipping at every step, the replica check after every
/// step, against Single with the same guard.
#[test]
fn ddp_replicas_that_clip_stay_bit_identical_on_one_gpu() {
    use burn::optim::AdamWConfig;
    use kiln::core::World;
    use kiln::core::optim::{PerformanceConfig, PerformanceOptimizer};
    use kiln::core::strategy::{Ddp, DdpConfig};

    let device = CudaDevice::default();
    let case = mlp_case_on::<G>(2, 16, &device);
    let batches = batches(case.dataset.len(), 13, 5);
    let guard = PerformanceConfig::new().with_clip_norm(Some(1e-3));
    let optim = || PerformanceOptimizer::new(AdamWConfig::new().init(), guard.clone()).unwrap();
    let mut single = Single::new(
        case.model.clone(),
        optim(),
        case.source(),
        device.clone(),
        SingleConfig::default(),
    )
    .unwrap();
    let config = DdpConfig {
        check_replicas_every: Some(1),
        ..DdpConfig::default()
    };
    let mut ddp = Ddp::new(
        &World::local(vec![device.clone(); 2]).unwrap(),
        case.model.clone(),
        optim(),
        case.source(),
        config,
    )
    .unwrap();
    for batch in &batches {
        let expected = single.step(batch, LR).unwrap();
        let got = ddp.step(batch, LR).unwrap();
        let norm = got.guard.unwrap().grad_norm;
        assert!(norm > 1e-3, "the step clipped (norm {norm})");
        let reference = expected.guard.unwrap().grad_norm;
        assert!(
            (norm - reference).abs() <= 1e-3 * reference,
            "{norm} vs {reference}"
        );
    }
    assert_equivalent_within(
        &ddp.model().unwrap(),
        &single.model().unwrap(),
        &case.model,
        "ddp world 2 clipping on one GPU",
        CUDA_TOLERANCE,
    );
}

/// The fused CUDA backend (what `kiln --backend cuda` trains on) steps f16 from the fused
/// AdamW's copies of the parameters as from casts, bit for bit.
#[test]
fn fused_f16_steps_from_the_optimizer_s_copies_as_from_casts() {
    f16_copies_train_as_casts::<Autodiff<kiln::kernels::backends::Cuda>>(CudaDevice::default());
}
