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
use kiln::core::strategy::{Single, SingleConfig, Strategy};
use kiln::kernels::FusedAdamWConfig;

type G = Autodiff<Cuda>;

/// Relative tolerance of whole-model equivalence on CUDA (TF32 matmuls, see above).
const CUDA_TOLERANCE: f32 = 2e-3;

/// Two ranks on the one GPU: what `kiln train --devices 0,0` builds.
fn shared_gpu(data_parallel: bool) {
    shared_device_matches_single::<G>(CudaDevice::default(), 2, data_parallel, CUDA_TOLERANCE);
}

#[test]
fn ddp_with_two_ranks_on_one_gpu_matches_single_device() {
    shared_gpu(false);
}

#[test]
fn data_parallel_with_two_ranks_on_one_gpu_matches_single_device() {
    shared_gpu(true);
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
