//! The kernel benchmark: each kernel next to the Burn composite it replaces, on one device,
//! timed side by side in one run, with the bytes and FLOPs each must move or compute so that
//! the times read as achieved bandwidth and throughput. Used by `kiln bench kernels`.

use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use serde::Serialize;

use kiln_kernels::quant::QuantizedWeight;
use kiln_kernels::{AdamWStep, KernelBackend, QuantFormat, ScaleDtype, ops, reference};

/// Problem sizes.
#[derive(Clone, Debug, Serialize)]
pub struct Sizes {
    /// Rows `M` of the QLoRA matmul.
    pub qlora_m: Vec<usize>,
    /// `K = N` of the QLoRA matmul.
    pub qlora_kn: usize,
    /// Adapter rank.
    pub rank: usize,
    /// `[rows, d]` of RMSNorm, SwiGLU (`rows·d` elements) and the optimizer tensors.
    pub rows: usize,
    /// See `rows`.
    pub d: usize,
    /// Classes of the cross-entropy (over `rows` rows).
    pub classes: usize,
}

impl Sizes {
    /// Sizes a CPU Vulkan driver (lavapipe) gets through in seconds.
    pub fn quick() -> Self {
        Self {
            qlora_m: vec![1, 16, 256],
            qlora_kn: 512,
            rank: 16,
            rows: 256,
            d: 1024,
            classes: 4096,
        }
    }

    /// The GPU sizes: QLoRA at M = 1, 16 (the matrix-vector kernels), 32 (the tiled kernel),
    /// 256 and 4096 (decoded to dense) with K = N = 4096; fused ops over
    /// 4096 × 4096 values.
    pub fn full() -> Self {
        Self {
            qlora_m: vec![1, 16, 32, 256, 4096],
            qlora_kn: 4096,
            rank: 16,
            rows: 4096,
            d: 4096,
            classes: 32_000,
        }
    }
}

/// One timed variant of one kernel.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    /// The operation.
    pub op: String,
    /// Its shape.
    pub shape: String,
    /// `fused` (Kiln's kernel) or which Burn composite.
    pub variant: String,
    /// Median seconds per call.
    pub seconds: f64,
    /// Bytes the operation must read and write at least.
    pub bytes: f64,
    /// Floating-point operations.
    pub flops: f64,
}

impl Measurement {
    /// Achieved bytes per second.
    pub fn bytes_per_second(&self) -> f64 {
        self.bytes / self.seconds
    }

    /// Achieved FLOP per second.
    pub fn flops_per_second(&self) -> f64 {
        self.flops / self.seconds
    }
}

/// How long to time each variant.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Untimed calls first (kernel compilation, autotuning, allocation).
    pub warmup: usize,
    /// At least this many timed calls…
    pub min_iters: usize,
    /// …and at least this long.
    pub min_time: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            warmup: 2,
            min_iters: 5,
            min_time: Duration::from_millis(300),
        }
    }
}

/// Median seconds of `f` on `device`, synchronised around every call.
pub fn time<B: Backend>(device: &B::Device, timing: Timing, mut f: impl FnMut()) -> f64 {
    let sync = || B::sync(device).expect("device synchronisation");
    for _ in 0..timing.warmup {
        f();
        sync();
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < timing.min_iters || start.elapsed() < timing.min_time {
        let t = Instant::now();
        f();
        sync();
        samples.push(t.elapsed().as_secs_f64());
    }
    kiln_core::stats::median(&samples)
}

struct Bench<'a, B: Backend> {
    device: &'a B::Device,
    timing: Timing,
    out: Vec<Measurement>,
    elem: f64,
}

impl<B: Backend> Bench<'_, B> {
    fn add(
        &mut self,
        op: &str,
        shape: String,
        variant: &str,
        bytes: f64,
        flops: f64,
        f: impl FnMut(),
    ) {
        let seconds = time::<B>(self.device, self.timing, f);
        tracing::info!(op, %shape, variant, seconds, "measured");
        self.out.push(Measurement {
            op: op.into(),
            shape,
            variant: variant.into(),
            seconds,
            bytes,
            flops,
        });
    }
}

fn random<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Uniform(-1.0, 1.0), device)
}

/// Runs every kernel and its Burn composite at `sizes` on `device`, in the backend's float type.
pub fn run<B: KernelBackend>(
    device: &B::Device,
    sizes: &Sizes,
    timing: Timing,
) -> Vec<Measurement> {
    let elem = random::<B, 1>([1], device).dtype().size() as f64;
    let mut bench = Bench::<B> {
        device,
        timing,
        out: Vec::new(),
        elem,
    };
    qlora(&mut bench, sizes);
    fused(&mut bench, sizes);
    bench.out
}

fn qlora<B: KernelBackend>(bench: &mut Bench<'_, B>, s: &Sizes) {
    let (kn, r, e) = (s.qlora_kn, s.rank, bench.elem);
    let device = bench.device;
    let dense = random::<B, 2>([kn, kn], device).mul_scalar(0.05);
    for (format, name) in [(QuantFormat::Nf4, "nf4"), (QuantFormat::Int4, "int4")] {
        let w = QuantizedWeight::quantize(&dense, format, ScaleDtype::F32);
        let wbytes = w.storage_bytes() as f64;
        for &m in &s.qlora_m {
            let x = random::<B, 2>([m, kn], device);
            let a = random::<B, 2>([kn, r], device);
            let b = random::<B, 2>([r, kn], device);
            let shape = format!("M={m} K=N={kn} r={r} {name}");
            let flops = 2.0 * (m * kn * kn + m * kn * r + m * r * kn) as f64;
            let bytes = wbytes + ((m * kn * 2 + 2 * kn * r) as f64) * e;
            bench.add(
                "qlora_forward",
                shape.clone(),
                "fused",
                bytes,
                flops,
                || {
                    let t = x.clone().matmul(a.clone());
                    let _ = ops::qlora_matmul(x.clone(), &w, t, b.clone(), 2.0).unwrap();
                },
            );
            bench.add(
                "qlora_forward",
                shape.clone(),
                "burn dequantize + matmul",
                bytes,
                flops,
                || {
                    let t = x.clone().matmul(a.clone());
                    let _ = reference::qlora::forward(x.clone(), &w.primitive(), t, b.clone(), 2.0);
                },
            );
            if format == QuantFormat::Nf4 {
                // The yardstick of the GPU target: Burn's dense matmul of the same shape in the
                // backend's float type (no adapter), reading a full-size weight.
                let dense_bytes = ((m * kn * 2 + kn * kn) as f64) * e;
                bench.add(
                    "qlora_forward",
                    shape.clone(),
                    "burn dense matmul",
                    dense_bytes,
                    2.0 * (m * kn * kn) as f64,
                    || {
                        let _ = x.clone().matmul(dense.clone());
                    },
                );
                let dy = random::<B, 2>([m, kn], device);
                let grad_flops = 2.0 * (m * kn * kn) as f64;
                let grad_bytes = wbytes + ((m * kn * 2) as f64) * e;
                bench.add(
                    "qlora_input_grad",
                    shape.clone(),
                    "fused",
                    grad_bytes,
                    grad_flops,
                    || {
                        let _ = B::qlora_input_grad(
                            dy.clone().into_primitive().tensor(),
                            w.primitive(),
                        );
                    },
                );
                bench.add(
                    "qlora_input_grad",
                    shape,
                    "burn dequantize + matmul",
                    grad_bytes,
                    grad_flops,
                    || {
                        let _ = reference::qlora::input_grad(dy.clone(), &w.primitive());
                    },
                );
            }
        }
    }
}

fn fused<B: KernelBackend>(bench: &mut Bench<'_, B>, s: &Sizes) {
    let (rows, d, e) = (s.rows, s.d, bench.elem);
    let device = bench.device;
    let n = (rows * d) as f64;
    let shape = format!("{rows}x{d}");

    let x = random::<B, 2>([rows, d], device);
    let dy = random::<B, 2>([rows, d], device);
    let gamma = random::<B, 1>([d], device);
    let (_, rstd) = reference::rms_norm::forward(x.clone(), gamma.clone(), 1e-5);
    bench.add(
        "rms_norm_forward",
        shape.clone(),
        "fused",
        2.0 * n * e,
        4.0 * n,
        || {
            let _ = ops::rms_norm(x.clone(), gamma.clone(), 1e-5).unwrap();
        },
    );
    bench.add(
        "rms_norm_forward",
        shape.clone(),
        "burn composite",
        2.0 * n * e,
        4.0 * n,
        || {
            let _ = reference::rms_norm::forward(x.clone(), gamma.clone(), 1e-5);
        },
    );
    let prim = |t: &Tensor<B, 2>| t.clone().into_primitive().tensor();
    bench.add(
        "rms_norm_backward",
        shape.clone(),
        "fused",
        4.0 * n * e,
        10.0 * n,
        || {
            let _ = B::rms_norm_backward(
                prim(&dy),
                prim(&x),
                gamma.clone().into_primitive().tensor(),
                rstd.clone().into_primitive().tensor(),
            );
        },
    );
    bench.add(
        "rms_norm_backward",
        shape.clone(),
        "burn composite",
        4.0 * n * e,
        10.0 * n,
        || {
            let _ =
                reference::rms_norm::backward(dy.clone(), x.clone(), gamma.clone(), rstd.clone());
        },
    );

    let up = random::<B, 2>([rows, d], device);
    bench.add(
        "swiglu_forward",
        shape.clone(),
        "fused",
        3.0 * n * e,
        6.0 * n,
        || {
            let _ = ops::swiglu(x.clone(), up.clone()).unwrap();
        },
    );
    bench.add(
        "swiglu_forward",
        shape.clone(),
        "burn composite",
        3.0 * n * e,
        6.0 * n,
        || {
            let _ = reference::swiglu::forward(x.clone(), up.clone());
        },
    );
    bench.add(
        "swiglu_backward",
        shape.clone(),
        "fused",
        5.0 * n * e,
        12.0 * n,
        || {
            let _ = B::swiglu_backward(prim(&dy), prim(&x), prim(&up));
        },
    );
    bench.add(
        "swiglu_backward",
        shape.clone(),
        "burn composite",
        5.0 * n * e,
        12.0 * n,
        || {
            let _ = reference::swiglu::backward(dy.clone(), x.clone(), up.clone());
        },
    );

    let c = s.classes;
    let ce_rows = (rows / 4).max(1);
    let logits = random::<B, 2>([ce_rows, c], device).mul_scalar(4.0);
    let targets = Tensor::<B, 1, Int>::from_data(
        TensorData::new(
            (0..ce_rows).map(|r| ((r * 7919) % c) as i64).collect(),
            [ce_rows],
        ),
        device,
    );
    let (_, lse) = reference::cross_entropy::forward(logits.clone(), targets.clone());
    let dloss = random::<B, 1>([ce_rows], device);
    let ce_shape = format!("{ce_rows}x{c}");
    let nc = (ce_rows * c) as f64;
    bench.add(
        "cross_entropy_forward",
        ce_shape.clone(),
        "fused",
        nc * e,
        4.0 * nc,
        || {
            let _ = ops::cross_entropy(logits.clone(), targets.clone()).unwrap();
        },
    );
    bench.add(
        "cross_entropy_forward",
        ce_shape.clone(),
        "burn composite",
        nc * e,
        4.0 * nc,
        || {
            let _ = reference::cross_entropy::forward(logits.clone(), targets.clone());
        },
    );
    bench.add(
        "cross_entropy_backward",
        ce_shape.clone(),
        "fused",
        2.0 * nc * e,
        4.0 * nc,
        || {
            let _ = B::cross_entropy_backward(
                dloss.clone().into_primitive().tensor(),
                prim(&logits),
                targets.clone().into_primitive(),
                lse.clone().into_primitive().tensor(),
            );
        },
    );
    bench.add(
        "cross_entropy_backward",
        ce_shape,
        "burn composite",
        2.0 * nc * e,
        4.0 * nc,
        || {
            let _ = reference::cross_entropy::backward(
                dloss.clone(),
                logits.clone(),
                targets.clone(),
                lse.clone(),
            );
        },
    );

    let flat = |t: &Tensor<B, 2>| t.clone().reshape([rows * d]);
    let (p, g, m, v) = (flat(&x), flat(&dy), flat(&up), flat(&up).abs());
    let step = AdamWStep {
        lr: 1e-3,
        beta_1: 0.9,
        beta_2: 0.999,
        epsilon: 1e-8,
        weight_decay: 0.01,
        time: 3,
    };
    bench.add(
        "adamw_step",
        format!("{}", rows * d),
        "fused",
        7.0 * n * e,
        14.0 * n,
        || {
            let _ = ops::adamw_step(p.clone(), g.clone(), m.clone(), v.clone(), &step).unwrap();
        },
    );
    bench.add(
        "adamw_step",
        format!("{}", rows * d),
        "burn composite",
        7.0 * n * e,
        14.0 * n,
        || {
            let _ = reference::adamw::step(p.clone(), g.clone(), m.clone(), v.clone(), &step);
        },
    );

    // The gradient set of a model: the same elements cut into 8 tensors.
    let parts: Vec<Tensor<B, 1>> = g.clone().chunk(8, 0);
    bench.add(
        "grad_sq_norm",
        format!("8 tensors, {} values", rows * d),
        "fused",
        n * e,
        3.0 * n,
        || {
            let _ = B::grad_sq_norm(
                parts
                    .iter()
                    .map(|t| t.clone().into_primitive().tensor())
                    .collect(),
                device,
            );
        },
    );
    bench.add(
        "grad_sq_norm",
        format!("8 tensors, {} values", rows * d),
        "burn composite",
        n * e,
        3.0 * n,
        || {
            let _ = reference::grad_norm::sq_norm(parts.clone(), device);
        },
    );
}

/// A plain-text table: time, GB/s and GFLOP/s per variant, and each composite's time over the
/// fused kernel's (> 1: the kernel is faster).
pub fn table(results: &[Measurement]) -> String {
    let mut s = format!(
        "{:<24} {:<28} {:<26} {:>11} {:>9} {:>10} {:>9}\n",
        "op", "shape", "variant", "time", "GB/s", "GFLOP/s", "vs fused"
    );
    for r in results {
        let fused = results
            .iter()
            .find(|f| f.op == r.op && f.shape == r.shape && f.variant == "fused")
            .map(|f| r.seconds / f.seconds);
        s += &format!(
            "{:<24} {:<28} {:<26} {:>9.3}ms {:>9.2} {:>10.2} {:>9}\n",
            r.op,
            r.shape,
            r.variant,
            r.seconds * 1e3,
            r.bytes_per_second() / 1e9,
            r.flops_per_second() / 1e9,
            fused.map_or(String::new(), |x| format!("{x:.2}×")),
        );
    }
    s
}
