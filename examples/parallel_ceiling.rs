//! How much two independent plain Burn training loops speed up when run on two threads at
//! once, with no Kiln code: the ceiling any data-parallel strategy can reach on this machine.
//!
//! `cargo run --release --example parallel_ceiling`

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::optim::{AdamWConfig, Optimizer};
use burn::train::TrainStep;
use kiln::nn::models::{Mlp, MlpConfig};
use kiln::nn::tasks::{ClassificationBatcher, TeacherTask};

type B = Autodiff<Flex>;

fn run(batch: usize, steps: usize) -> f64 {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        let device = Default::default();
        let dataset = TeacherTask {
            samples: 4096,
            features: 32,
            classes: 10,
            seed: 5,
        }
        .dataset();
        let mut model: Mlp<B> = MlpConfig::new()
            .with_hidden(512)
            .with_layers(3)
            .init(&device)
            .fork(&device);
        let mut optim = AdamWConfig::new().init::<B, Mlp<B>>();
        let start = Instant::now();
        for step in 0..steps {
            let items = (0..batch)
                .map(|i| dataset.get((step * batch + i) % 4096).unwrap())
                .collect();
            let output = model.step(ClassificationBatcher.batch(items, &device));
            model = optim.step(1e-3, model, output.grads);
        }
        start.elapsed().as_secs_f64()
    })
}

fn main() {
    let (batch, steps) = (128, 40);
    run(batch, 5);
    let alone = run(batch, steps);
    let start = Instant::now();
    std::thread::scope(|s| {
        let a = s.spawn(|| run(batch, steps));
        let b = s.spawn(|| run(batch, steps));
        (a.join().unwrap(), b.join().unwrap())
    });
    let together = start.elapsed().as_secs_f64();
    println!(
        "one loop alone: {:.1} ms/step; two loops at once: {:.1} ms/step each",
        alone * 1e3 / steps as f64,
        together * 1e3 / steps as f64
    );
    println!(
        "throughput gain from the second core: {:.2}x",
        2.0 * alone / together
    );
}
