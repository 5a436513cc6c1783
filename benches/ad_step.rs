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
//! With `--features cuda` the same runners also run on `CudaDevice::default()` (names ending in
//! `cuda`): the step in f32, bf16 and f16, each timed between two device synchronisations. This is
//! the bench `benches/peer/ad_step.py --device cuda` stands beside.

use std::sync::OnceLock;
use std::time::Instant;

#[cfg(feature = "cuda")]
use burn::backend::Cuda;
use burn::backend::{Autodiff, Flex, NdArray};
use burn::data::dataloader::batcher::Batcher;
use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use kiln::ad::config::AdConfig;
use kiln::ad::dataset::{AdBatch, WindowBatcher, WindowDataset, WindowRef};
use kiln::ad::train::{Data, generate};
use kiln::core::data::{DataSource, EpochSampler};
use kiln::core::optim::{
    MixedPrecision, NanPolicy, PerformanceConfig, PerformanceOptimizer, Precision,
};
use kiln::core::strategy::{Single, SingleConfig, Strategy};
use kiln::kernels::{FusedAdamWConfig, KernelBackend};

const LR: f64 = 1e-3;

/// The `kiln` binary's allocator, so that the bench times what the binary runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The source's learning histories, generated once per process: every runner and round trains
/// on the same data, and generating it is not what is timed.
fn histories(config: &AdConfig) -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| generate(config).expect("default config"))
}

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

/// The AD data set as Kiln reads it.
fn ad_source<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
) -> DataSource<B, WindowRef, AdBatch<B>> {
    let data = histories(config);
    let context = config.model.context;
    DataSource::new(
        WindowDataset::new(data.histories.clone(), context).expect("default context"),
        WindowBatcher::new(data.histories.clone(), context),
    )
}

fn kiln_single<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
    batches: &[Vec<usize>],
    steps: usize,
) -> f64 {
    kiln_single_with::<B>(config, batches, steps, None)
}

fn kiln_guarded<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
    batches: &[Vec<usize>],
    steps: usize,
) -> f64 {
    let guards = PerformanceConfig::new()
        .with_clip_norm(Some(1.0))
        .with_nan_policy(NanPolicy::Halt);
    kiln_single_with::<B>(config, batches, steps, Some(guards))
}

fn kiln_bf16<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
    batches: &[Vec<usize>],
    steps: usize,
) -> f64 {
    kiln_in::<B>(config, batches, steps, Precision::Bf16)
}

fn kiln_f16<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
    batches: &[Vec<usize>],
    steps: usize,
) -> f64 {
    kiln_in::<B>(config, batches, steps, Precision::F16)
}

/// `Single` over the AD model wrapped in [`MixedPrecision`].
fn kiln_in<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
    batches: &[Vec<usize>],
    steps: usize,
    precision: Precision,
) -> f64 {
    let source = ad_source(config);
    let device = B::Device::default();
    B::seed(&device, 1);
    let model = MixedPrecision::new(config.model.init::<B>(&config.env, &device), precision);
    let single = SingleConfig {
        grad_accumulation: 1,
        threads_per_rank: Some(1),
    };
    let optim = FusedAdamWConfig::new().init::<B, _>();
    let mut strategy = Single::new(model, optim, source, device.clone(), single).expect("single");
    time_steps(&mut strategy, &device, batches, steps)
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

fn kiln_single_with<B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend>(
    config: &AdConfig,
    batches: &[Vec<usize>],
    steps: usize,
    guards: Option<PerformanceConfig>,
) -> f64 {
    let source = ad_source(config);
    let device = B::Device::default();
    B::seed(&device, 1);
    let model = config.model.init::<B>(&config.env, &device);
    let optim = FusedAdamWConfig::new().init::<B, _>();
    let single = SingleConfig {
        grad_accumulation: 1,
        threads_per_rank: Some(1),
    };
    let on = device.clone();
    let mut strategy: Box<dyn Strategy<B, _>> = match guards {
        None => Box::new(Single::new(model, optim, source, on, single).expect("single")),
        Some(guards) => {
            let optim = PerformanceOptimizer::new(optim, guards).expect("valid guards");
            Box::new(Single::new(model, optim, source, on, single).expect("single"))
        }
    };
    time_steps(strategy.as_mut(), &device, batches, steps)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Launches and host synchronisations of each of `steps` steps (after 2 warm-up steps) of
/// `Single` on wgpu, plain, with the guards, and in f16 (lavapipe has no bf16; the casts and launches are the same): the minimum and maximum over the
/// steps, then the last step's launches by kernel, with their cube counts.
#[cfg(feature = "wgpu")]
fn count_launches(config: &AdConfig, batches: &[Vec<usize>], steps: usize) {
    use burn::backend::Wgpu;
    use kiln_bench::launches::{self, Counts};
    type G = Autodiff<Wgpu>;
    for variant in ["single", "guarded (clip_norm 1.0)", "f16"] {
        let source = ad_source::<G>(config);
        let device = Default::default();
        <G as burn::tensor::backend::Backend>::seed(&device, 1);
        let model = config.model.init::<G>(&config.env, &device);
        let single = SingleConfig {
            grad_accumulation: 1,
            threads_per_rank: Some(1),
        };
        let optim = FusedAdamWConfig::new().init::<G, _>();
        let mut strategy: Box<dyn Strategy<G, _>> = match variant {
            "single" => Box::new(
                Single::new(
                    MixedPrecision::new(model, Precision::F32),
                    optim,
                    source,
                    device,
                    single,
                )
                .expect("single"),
            ),
            "f16" => Box::new(
                Single::new(
                    MixedPrecision::new(model, Precision::F16),
                    optim,
                    source,
                    device,
                    single,
                )
                .expect("single"),
            ),
            _ => {
                let guards = PerformanceConfig::new().with_clip_norm(Some(1.0));
                let optim = PerformanceOptimizer::new(optim, guards).expect("valid guards");
                Box::new(
                    Single::new(
                        MixedPrecision::new(model, Precision::F32),
                        optim,
                        source,
                        device,
                        single,
                    )
                    .expect("single"),
                )
            }
        };
        let mut per_step = Vec::new();
        let taken = steps + 2;
        for (i, batch) in batches.iter().take(taken).enumerate() {
            let before = Counts::now();
            launches::record(i + 1 == taken);
            strategy.step(batch, LR).expect("step");
            launches::record(false);
            if i >= 2 {
                per_step.push(Counts::now().since(before));
            }
        }
        let range = |f: fn(&Counts) -> u64| {
            let values: Vec<u64> = per_step.iter().map(f).collect();
            (
                values.iter().min().copied().unwrap_or(0),
                values.iter().max().copied().unwrap_or(0),
            )
        };
        let (launched, syncs) = (range(|c| c.launches), range(|c| c.host_syncs));
        println!(
            "kiln {variant}, wgpu: {}–{} kernel launches and {}–{} host synchronisations per \
             step ({steps} steps)",
            launched.0, launched.1, syncs.0, syncs.1
        );
        let log = launches::take_log();
        if std::env::var_os("KILN_LAUNCH_SEQUENCE").is_some() {
            for launch in &log {
                println!("    {} {:?}", launch.short_name(), launch.cubes);
            }
        }
        print_by_kernel(&log);
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
    let mut args = raw.into_iter().peekable();
    let counting = args.peek().is_some_and(|a| a == "launches");
    if counting {
        args.next();
        kiln_bench::launches::install().expect("the bench installs the only subscriber");
    }
    let steps: usize = args.next().map_or(20, |s| s.parse().expect("STEPS"));
    let rounds: usize = args.next().map_or(5, |s| s.parse().expect("ROUNDS"));
    let filter = args.next().unwrap_or_default();
    let mut config = AdConfig::default();
    if let Some(batch) = batch {
        config.train.batch = batch;
    }
    let data = histories(&config);
    let windows = data.histories.count() * (data.histories.len() - config.model.context + 1);
    let batches: Vec<Vec<usize>> = EpochSampler::new(windows, config.train.batch, 7)
        .expect("sampler")
        .batches()
        .take(steps + 3)
        .collect();
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
        count_launches(&config, &batches, steps);
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
