//! Ddp overhead and scaling on the CPU, measured side by side in one run.
//!
//! Three variants train the same MLP on the same global batches, each rank on one thread:
//! a plain Burn loop (no Kiln), Ddp with world 1, and Ddp with world 2. Every variant starts
//! fresh threads each round and times only steady-state steps, after untimed warm-up steps
//! (fresh threads start with cold allocator arenas). They run in interleaved rounds, their
//! order rotating every round, so machine noise hits all alike, and the median round of each is
//! compared:
//! - overhead = Ddp world 1 / plain − 1 (target ≤ 3 %),
//! - scaling = Ddp world 2 samples/s ÷ Ddp world 1 samples/s (target ≥ 1.7× on 2 cores).
//!
//! `cargo bench --bench strategies [-- ROUNDS STEPS [plain|ddp1|ddp2]]`: naming a variant runs
//! only it, once, which is how to count its instructions under
//! `valgrind --tool=callgrind` (repeatable where wall time is noisy).

use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::optim::{AdamWConfig, Optimizer};
use burn::tensor::backend::Backend;
use burn::train::TrainStep;
use kiln::core::World;
use kiln::core::data::{DataSource, EpochSampler};
use kiln::core::strategy::{Ddp, DdpConfig, Strategy};
use kiln::nn::models::{Mlp, MlpConfig};
use kiln::nn::tasks::{ClassificationBatcher, TeacherTask};

type B = Autodiff<Flex>;

const BATCH: usize = 1024;
const LR: f64 = 1e-3;
/// Untimed steps at the start of every variant's round.
const WARMUP: usize = 3;

fn model() -> Mlp<B> {
    let device = Default::default();
    B::seed(&device, 1);
    MlpConfig::new()
        .with_hidden(512)
        .with_layers(3)
        .init(&device)
        .fork(&device)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rounds = args.first().copied().unwrap_or(7);
    let steps = args.get(1).copied().unwrap_or(20);

    let task = TeacherTask {
        samples: 16_384,
        features: 32,
        classes: 10,
        seed: 5,
    };
    let dataset = task.dataset();
    let batches: Vec<Vec<usize>> = EpochSampler::new(dataset.len(), BATCH, 9)
        .unwrap()
        .batches()
        .take(WARMUP + steps)
        .collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();

    let plain = |batches: &[Vec<usize>]| -> Duration {
        pool.install(|| {
            let device = Default::default();
            let mut optim = AdamWConfig::new().init::<B, Mlp<B>>();
            let mut model = model();
            let start = Instant::now();
            for batch in batches {
                let items = batch.iter().map(|&i| dataset.get(i).unwrap()).collect();
                let output = model.step(ClassificationBatcher.batch(items, &device));
                model = optim.step(LR, model, output.grads);
            }
            start.elapsed()
        })
    };
    let ddp = |world: usize, batches: &[Vec<usize>]| -> Duration {
        let world = World::local(vec![Default::default(); world]).unwrap();
        let config = DdpConfig {
            threads_per_rank: Some(1),
            ..DdpConfig::default()
        };
        let data = DataSource::new(task.dataset(), ClassificationBatcher);
        let mut ddp = Ddp::new(&world, model(), AdamWConfig::new().init(), data, config).unwrap();
        let mut start = Instant::now();
        for (step, batch) in batches.iter().enumerate() {
            if step == WARMUP {
                start = Instant::now();
            }
            ddp.step(batch, LR).unwrap();
        }
        let elapsed = start.elapsed();
        if std::env::var_os("KILN_BENCH_VERBOSE").is_some() {
            for s in ddp.stats() {
                eprintln!(
                    "  world {} rank {}: compute {:?}, communication {:?}",
                    world.world_size(),
                    s.rank,
                    s.compute,
                    s.communication
                );
            }
        }
        elapsed
    };

    if let Some(variant) = std::env::args()
        .skip(1)
        .find(|a| a.parse::<usize>().is_err() && !a.starts_with('-'))
    {
        let elapsed = match variant.as_str() {
            "plain" => plain(&batches),
            "ddp1" => ddp(1, &batches),
            "ddp2" => ddp(2, &batches),
            other => panic!("unknown variant {other}; use plain, ddp1 or ddp2"),
        };
        println!(
            "{variant}: {:.2} ms/step",
            elapsed.as_secs_f64() * 1e3 / steps as f64
        );
        return;
    }
    let (mut t_plain, mut t_ddp1, mut t_ddp2) = (Vec::new(), Vec::new(), Vec::new());
    // Rotate the order every round, so no variant always follows the same one (a variant that
    // runs right after another frees its memory pays for the kernel's reclaim).
    for round in 0..rounds {
        for variant in 0..3 {
            match (round + variant) % 3 {
                0 => t_plain.push(plain(&batches)),
                1 => t_ddp1.push(ddp(1, &batches)),
                _ => t_ddp2.push(ddp(2, &batches)),
            }
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (p, d1, d2) = (
        median(&mut t_plain),
        median(&mut t_ddp1),
        median(&mut t_ddp2),
    );
    let per_step = |d: Duration| d.as_secs_f64() * 1e3 / steps as f64;
    let throughput = |d: Duration| (steps * BATCH) as f64 / d.as_secs_f64();
    println!(
        "MLP 32-512-512-512-10, global batch {BATCH}, AdamW, {steps} steps, median of {rounds} interleaved rounds, 1 thread per rank"
    );
    println!(
        "plain Burn loop : {:8.2} ms/step {:9.0} samples/s",
        per_step(p),
        throughput(p)
    );
    println!(
        "Ddp world 1     : {:8.2} ms/step {:9.0} samples/s",
        per_step(d1),
        throughput(d1)
    );
    println!(
        "Ddp world 2     : {:8.2} ms/step {:9.0} samples/s",
        per_step(d2),
        throughput(d2)
    );
    println!(
        "Ddp world 1 overhead vs plain : {:+.2} %  (target <= 3 %)",
        (d1.as_secs_f64() / p.as_secs_f64() - 1.0) * 100.0
    );
    println!(
        "Ddp world 2 / world 1 speed-up: {:.2}x    (target >= 1.7x)",
        d1.as_secs_f64() / d2.as_secs_f64()
    );
}
