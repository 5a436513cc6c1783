//! Criterion micro-benches of the kernels on wgpu (lavapipe on a machine without a GPU):
//! each kernel and the Burn composite it replaces, in one group, with byte throughput.
//! `cargo bench -p kiln-kernels --bench kernels`. For GPU sizes and FLOP rates use
//! `kiln bench kernels --full`.

use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kiln_kernels::quant::QuantizedWeight;
use kiln_kernels::{QuantFormat, ScaleDtype, ops, reference};

type G = CubeBackend<WgpuRuntime, f32, i32, u32>;

fn random<const D: usize>(shape: [usize; D], device: &WgpuDevice) -> Tensor<G, D> {
    Tensor::random(shape, Distribution::Uniform(-1.0, 1.0), device)
}

fn sync(device: &WgpuDevice) {
    G::sync(device).unwrap();
}

fn qlora(c: &mut Criterion) {
    let device = WgpuDevice::Cpu;
    let (m, kn, r) = (64, 512, 16);
    let w = QuantizedWeight::quantize(
        &random([kn, kn], &device),
        QuantFormat::Nf4,
        ScaleDtype::F32,
    );
    let (x, a, b) = (
        random([m, kn], &device),
        random([kn, r], &device),
        random([r, kn], &device),
    );
    let mut group = c.benchmark_group(format!("qlora_forward M={m} K=N={kn}"));
    group.throughput(Throughput::Bytes(
        (w.storage_bytes() + 4 * 2 * m * kn) as u64,
    ));
    group.bench_function("fused", |bench| {
        bench.iter(|| {
            let t = x.clone().matmul(a.clone());
            let _ = ops::qlora_matmul(x.clone(), &w, t, b.clone(), 2.0).unwrap();
            sync(&device);
        })
    });
    group.bench_function("burn dequantize + matmul", |bench| {
        bench.iter(|| {
            let t = x.clone().matmul(a.clone());
            let _ = reference::qlora::forward(x.clone(), &w.primitive(), t, b.clone(), 2.0);
            sync(&device);
        })
    });
    group.finish();
}

fn fused(c: &mut Criterion) {
    let device = WgpuDevice::Cpu;
    let (rows, d) = (128, 1024);
    let (x, up, gamma) = (
        random([rows, d], &device),
        random([rows, d], &device),
        random([d], &device),
    );
    let bytes = (4 * rows * d) as u64;

    let mut group = c.benchmark_group(format!("rms_norm {rows}x{d}"));
    group.throughput(Throughput::Bytes(2 * bytes));
    group.bench_function("fused", |bench| {
        bench.iter(|| {
            let _ = ops::rms_norm(x.clone(), gamma.clone(), 1e-5).unwrap();
            sync(&device);
        })
    });
    group.bench_function("burn composite", |bench| {
        bench.iter(|| {
            let _ = reference::rms_norm::forward(x.clone(), gamma.clone(), 1e-5);
            sync(&device);
        })
    });
    group.finish();

    let mut group = c.benchmark_group(format!("swiglu {rows}x{d}"));
    group.throughput(Throughput::Bytes(3 * bytes));
    group.bench_function("fused", |bench| {
        bench.iter(|| {
            let _ = ops::swiglu(x.clone(), up.clone()).unwrap();
            sync(&device);
        })
    });
    group.bench_function("burn composite", |bench| {
        bench.iter(|| {
            let _ = reference::swiglu::forward(x.clone(), up.clone());
            sync(&device);
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(500));
    targets = qlora, fused
}
criterion_main!(benches);
