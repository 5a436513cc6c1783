//! Time per training step of the Algorithm Distillation transformer on one CPU core: batch 32,
//! context 60, d_model 64, 2 layers, 4 heads, feed-forward 256, AdamW.
//!
//! ```text
//! cargo bench --bench ad_step [-- STEPS ROUNDS [FILTER]]
//! ```
//! `FILTER` keeps the runners whose name contains it (e.g. `flex`); `--batch N` (anywhere among
//! the arguments) trains at batch `N` instead of the config's 32.
//! Each round times `STEPS` steps (after 3 untimed warm-up steps) of a plain Burn loop, of
//! Kiln's `Single` strategy, and of `Single` with the PerformanceOptimizer's guards (global-norm
//! clipping and the NaN guard), in rotating order, each inside a one-thread pool; it prints the
//! median ms/step of each over the rounds, and their ratios (ratios from one run are what to
//! compare on a shared machine). The AD model also runs in bf16 and f16 through
//! `MixedPrecision` (f32 master weights), against f32.
//!
//! ```text
//! cargo bench --bench ad_step --features wgpu -- launches [STEPS]
//! ```
//! counts instead of timing: the kernel launches and host synchronisations of each training
//! step of `Single` on wgpu (lavapipe on a machine without a GPU), which are the same on every
//! CubeCL runtime, CUDA included (`kiln_bench::launches`).
//!
//! ```text
//! cargo bench --bench ad_step --features wgpu -- launches --llm [--batch N]
//! ```
//! counts the users' LoRA and QLoRA fine-tuning step instead (`kiln_bench::llm_step`: a small
//! LLaMA, rank 8 on all seven projections, `N` sequences of 16 tokens, default 2): launches per
//! decoder layer and per step, and host synchronisations, in f32 and f16, plain and fused.
//!
//! With `--features cuda` the same runners also run on `CudaDevice::default()` (names ending in
//! `cuda`): the step in f32, bf16 and f16, each timed between two device synchronisations. This is
//! the bench `benches/peer/ad_step.py --device cuda` stands beside.

use std::time::Instant;

#[cfg(feature = "cuda")]
use burn::backend::Cuda;
use burn::backend::{Autodiff, Flex, NdArray};
use burn::data::dataloader::batcher::Batcher;
use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use kiln::ad::config::AdConfig;
use kiln::ad::dataset::{WindowBatcher, WindowDataset};
use kiln::core::optim::Precision;
use kiln::core::strategy::Strategy;
use kiln::kernels::KernelBackend;

use kiln_bench::ad_step::{LR, Variant, batches, histories, strategy};

/// The `kiln` binary's allocator, so that the bench times what the binary runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn one_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool")
        .install(f)
}

fn plain<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
    batches: &[Vec<usize>],
    steps: usize,
) -> f64 {
    let data = histories(config);
    let context = config.model.context;
    let windows = WindowDataset::new(data.histories.clone(), context).expect("default context");
    let batcher = WindowBatcher::new(data.histories.clone(), context);
    let device = B::Device::default();
    one_thread(|| {
        B::seed(&device, 1);
        let mut model = config.model.init::<B>(&config.env, &device).fork(&device);
        let mut optim = AdamWConfig::new().init::<B, _>();
        let mut timed = Instant::now();
        for (i, indices) in batches.iter().take(steps + 3).enumerate() {
            if i == 3 {
                B::sync(&device).expect("sync");
                timed = Instant::now();
            }
            let items = indices
                .iter()
                .map(|&i| burn::data::dataset::Dataset::get(&windows, i).unwrap())
                .collect();
            let batch = batcher.batch(items, &device);
            let loss = model.forward_loss(batch).loss;
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(LR, model, grads);
        }
        B::sync(&device).expect("sync");
        1e3 * timed.elapsed().as_secs_f64() / steps as f64
    })
}

/// Kiln's `Single` on `variant`, built as the launch counts build it
/// ([`kiln_bench::ad_step::strategy`]).
fn kiln<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
    batches: &[Vec<usize>],
    steps: usize,
    variant: Variant,
) -> f64 {
    let device = B::Device::default();
    let mut strategy = strategy::<B>(config, variant, &device);
    time_steps(strategy.as_mut(), &device, batches, steps)
}

fn kiln_single<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
    batches: &[Vec<usize>],
    steps: usize,
) -> f64 {
    kiln::<B>(config, batches, steps, Variant::Single)
}

/// With global-norm clipping at 1.0 and the NaN guard (`nan_policy` halt, the default).
fn kiln_guarded<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
    batches: &[Vec<usize>],
    steps: usize,
) -> f64 {
    kiln::<B>(config, batches, steps, Variant::Guarded)
}

fn kiln_bf16<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
    batches: &[Vec<usize>],
    steps: usize,
) -> f64 {
    kiln::<B>(config, batches, steps, Variant::Precision(Precision::Bf16))
}

fn kiln_f16<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
    batches: &[Vec<usize>],
    steps: usize,
) -> f64 {
    kiln::<B>(config, batches, steps, Variant::Precision(Precision::F16))
}

/// Milliseconds per step of `steps` steps after 3 untimed ones; the device is synchronised
/// before the clock starts and before it stops, so that a GPU's queued work is counted.
fn time_steps<B: AutodiffBackend, M: kiln::core::model::TrainModel<B>>(
    strategy: &mut dyn Strategy<B, M>,
    device: &B::Device,
    batches: &[Vec<usize>],
    steps: usize,
) -> f64 {
    let mut timed = Instant::now();
    for (i, batch) in batches.iter().take(steps + 3).enumerate() {
        if i == 3 {
            B::sync(device).expect("sync");
            timed = Instant::now();
        }
        strategy.step(batch, LR).expect("step");
    }
    B::sync(device).expect("sync");
    1e3 * timed.elapsed().as_secs_f64() / steps as f64
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// wgpu's plain CubeCL backend (lavapipe on a machine without a GPU), under autodiff.
#[cfg(feature = "wgpu")]
type Plain =
    Autodiff<burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>>;
/// The same under Burn's fusion: what `kiln --backend wgpu` trains on.
#[cfg(feature = "wgpu")]
type Fused = Autodiff<
    burn_fusion::Fusion<
        burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>,
    >,
>;

/// Launches and host synchronisations of each of `steps` steps (after 2 warm-up steps) of
/// `Single` on wgpu (the plain CubeCL backend, then under Burn's fusion), plain, with the guards,
/// and in f16 (lavapipe has no bf16; its casts and launches are f16's): the fewest and most per
/// step, then the last step's launches by kernel, with their cube counts
/// (`KILN_LAUNCH_SEQUENCE=1` lists them in order).
#[cfg(feature = "wgpu")]
fn count_launches(config: &AdConfig, steps: usize) {
    use kiln_bench::ad_step::{Variant, count};
    let variants = [
        Variant::Single,
        Variant::Guarded,
        Variant::Precision(Precision::F16),
    ];
    for (backend, fused) in [("wgpu", false), ("wgpu, fused", true)] {
        for variant in variants {
            let device = Default::default();
            let counts = if fused {
                count::<Fused>(config, variant, steps, &device)
            } else {
                count::<Plain>(config, variant, steps, &device)
            };
            let (launched, syncs) = (counts.range(|c| c.launches), counts.range(|c| c.host_syncs));
            println!(
                "kiln {variant}, {backend}: {}–{} kernel launches and {}–{} host \
                 synchronisations per step ({steps} steps)",
                launched.0, launched.1, syncs.0, syncs.1
            );
            if std::env::var_os("KILN_LAUNCH_SEQUENCE").is_some() {
                for launch in &counts.last {
                    println!("    {} {:?}", launch.short_name(), launch.cubes);
                }
            }
            print_by_kernel(&counts.last);
        }
    }
}

/// Launches per decoder layer and per step, and host synchronisations per step, of the LoRA and
/// QLoRA fine-tuning step at `batch` sequences, in f32 and f16 (lavapipe has no bf16), on the
/// plain CubeCL backend and under Burn's fusion.
#[cfg(feature = "wgpu")]
fn count_llm_launches(batch: usize) {
    use kiln_bench::llm_step::{LlmStep, SEQ_LEN, per_layer};
    println!(
        "LLM step: batch {batch} x {SEQ_LEN} tokens, rank-8 adapters on all seven projections"
    );
    for four_bit in [false, true] {
        for precision in [Precision::F32, Precision::F16] {
            for (backend, fused) in [("wgpu", false), ("wgpu, fused", true)] {
                let step = LlmStep {
                    four_bit,
                    precision,
                    batch,
                };
                let device = Default::default();
                let counts = if fused {
                    per_layer::<Fused>(step, &device)
                } else {
                    per_layer::<Plain>(step, &device)
                }
                .expect("the counted model writes and loads");
                println!(
                    "kiln {} {precision:?}, {backend}: {} launches per decoder layer; a two-layer \
                     step {} launches and {} host synchronisations",
                    if four_bit { "QLoRA" } else { "LoRA" },
                    counts.per_layer,
                    counts.step.launches,
                    counts.step.host_syncs
                );
            }
        }
    }
}

/// The launches of one step grouped by kernel: how many, and the fewest and most cubes.
#[cfg(feature = "wgpu")]
fn print_by_kernel(log: &[kiln_bench::launches::Launch]) {
    let mut kernels: Vec<(&str, usize, u64, u64)> = Vec::new();
    for launch in log {
        let cubes = launch.cubes.unwrap_or(0);
        match kernels.iter_mut().find(|k| k.0 == launch.short_name()) {
            Some(k) => {
                k.1 += 1;
                k.2 = k.2.min(cubes);
                k.3 = k.3.max(cubes);
            }
            None => kernels.push((launch.short_name(), 1, cubes, cubes)),
        }
    }
    kernels.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (name, n, fewest, most) in kernels {
        println!("  {n:4} × {name:<44} cubes {fewest}–{most}");
    }
}

fn main() {
    let mut raw: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let batch = raw.iter().position(|a| a == "--batch").map(|at| {
        let n = raw
            .get(at + 1)
            .and_then(|n| n.parse::<usize>().ok())
            .expect("--batch takes a number of samples");
        raw.drain(at..at + 2);
        n
    });
    let llm = raw
        .iter()
        .position(|a| a == "--llm")
        .map(|at| raw.remove(at))
        .is_some();
    let mut args = raw.into_iter().peekable();
    let counting = args.peek().is_some_and(|a| a == "launches");
    if counting {
        args.next();
        kiln_bench::launches::install().expect("the bench installs the only subscriber");
    }
    if counting && llm {
        #[cfg(feature = "wgpu")]
        count_llm_launches(batch.unwrap_or(kiln_bench::llm_step::BATCH));
        #[cfg(not(feature = "wgpu"))]
        println!("counting launches needs wgpu: cargo bench --bench ad_step --features wgpu");
        return;
    }
    let steps: usize = args.next().map_or(20, |s| s.parse().expect("STEPS"));
    let rounds: usize = args.next().map_or(5, |s| s.parse().expect("ROUNDS"));
    let filter = args.next().unwrap_or_default();
    let mut config = AdConfig::default();
    if let Some(batch) = batch {
        config.train.batch = batch;
    }
    let batches = batches(&config, steps + 3);
    println!(
        "AD step: batch {}, context {}, d_model {}, {} layers, {} heads, d_ff {}; one thread; \
         {steps} steps x {rounds} rounds",
        config.train.batch,
        config.model.context,
        config.model.d_model,
        config.model.layers,
        config.model.heads,
        config.model.d_ff
    );
    if counting {
        #[cfg(feature = "wgpu")]
        count_launches(&config, steps);
        #[cfg(not(feature = "wgpu"))]
        println!(
            "counting launches needs wgpu: cargo bench --bench ad_step --features wgpu -- launches"
        );
        return;
    }
    type Runner = fn(&AdConfig, &[Vec<usize>], usize) -> f64;
    let runners: Vec<(&str, Runner)> = [
        ("burn loop, flex", plain::<Autodiff<Flex>> as Runner),
        ("kiln single, flex", kiln_single::<Autodiff<Flex>>),
        ("kiln guarded, flex", kiln_guarded::<Autodiff<Flex>>),
        ("kiln bf16, flex", kiln_bf16::<Autodiff<Flex>>),
        ("kiln f16, flex", kiln_f16::<Autodiff<Flex>>),
        ("burn loop, ndarray", plain::<Autodiff<NdArray>>),
        #[cfg(feature = "cuda")]
        ("burn loop, cuda", plain::<Autodiff<Cuda>>),
        #[cfg(feature = "cuda")]
        ("kiln single, cuda", kiln_single::<Autodiff<Cuda>>),
        #[cfg(feature = "cuda")]
        ("kiln bf16, cuda", kiln_bf16::<Autodiff<Cuda>>),
        #[cfg(feature = "cuda")]
        ("kiln f16, cuda", kiln_f16::<Autodiff<Cuda>>),
    ]
    .into_iter()
    .filter(|(name, _)| name.contains(filter.as_str()))
    .collect();
    let mut times = vec![Vec::new(); runners.len()];
    for round in 0..rounds {
        for k in 0..runners.len() {
            let i = (k + round) % runners.len();
            times[i].push((runners[i].1)(&config, &batches, steps));
        }
    }
    let medians: Vec<f64> = times.into_iter().map(median).collect();
    for ((name, _), ms) in runners.iter().zip(&medians) {
        println!("{name:<20} {ms:8.2} ms/step");
    }
    let ms = |name: &str| {
        runners
            .iter()
            .position(|(n, _)| *n == name)
            .map(|i| medians[i])
    };
    if let (Some(kiln), Some(burn)) = (ms("kiln single, flex"), ms("burn loop, flex")) {
        println!("kiln single / burn loop (flex): {:.3}", kiln / burn);
    }
    for half in ["kiln bf16, flex", "kiln f16, flex"] {
        if let (Some(h), Some(kiln)) = (ms(half), ms("kiln single, flex")) {
            println!("{half} / kiln single (flex, f32): {:.3}", h / kiln);
        }
    }
    for half in ["kiln bf16, cuda", "kiln f16, cuda"] {
        if let (Some(h), Some(kiln)) = (ms(half), ms("kiln single, cuda")) {
            println!("{half} / kiln single (cuda, f32): {:.3}", h / kiln);
        }
    }
    if let (Some(guarded), Some(kiln)) = (ms("kiln guarded, flex"), ms("kiln single, flex")) {
        println!(
            "kiln guarded / kiln single (flex): {:.3} (clip_norm 1.0 + nan_policy halt)",
            guarded / kiln
        );
    }
}
