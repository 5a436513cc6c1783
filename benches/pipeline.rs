//! Pipeline on the CPU, measured side by side in one run: the bubble against the theory, and
//! throughput against Ddp on the same model.
//!
//! Every rank is one thread (one core each on a 2-core machine). Variants run in interleaved
//! rounds whose order rotates, each from fresh threads after untimed warm-up steps, and the
//! median round is reported:
//! - **bubble**: `Pipeline` with p = 2 and m ∈ {2, 4, 8}, both schedules. A rank's idle share
//!   is the part of the timed steps' wall time in which it was not computing (waiting for the
//!   other stage, mostly; the flush's start and end included). The theory
//!   `(p − 1)/(m + p − 1)` is for stages of equal cost; these are not quite equal (the last
//!   stage also computes the loss and its input's gradient, which the first stage, fed with
//!   data, does not need), and a faster stage also idles while it waits for the slower one in
//!   every steady-state step. That is load imbalance, not bubble: the pipeline's bubble is the
//!   idle share of its bottleneck, the stage that computed most, and that is the figure to
//!   compare with the theory;
//! - **throughput**: samples/s of every Pipeline variant against Ddp with world 2, and of
//!   1F1B m = 8 with recomputation (one more forward per micro-batch and stage; its first
//!   stage recomputes while it waits for the gradient, so part of that forward hides in the
//!   bubble and the figure drops below the theory).
//!
//! `cargo bench --bench pipeline [-- ROUNDS STEPS]`.

use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::optim::AdamWConfig;
use burn::tensor::backend::Backend;
use kiln::core::World;
use kiln::core::data::{DataSource, EpochSampler};
use kiln::core::strategy::{
    Ddp, DdpConfig, Pipeline, PipelineConfig, RankStats, Schedule, Strategy,
};
use kiln::nn::models::{Mlp, MlpConfig};
use kiln::nn::tasks::{ClassificationBatcher, TeacherTask};

type B = Autodiff<Flex>;
type Source =
    DataSource<B, kiln::nn::tasks::ClassificationItem, kiln::nn::tasks::ClassificationBatch<B>>;

const BATCH: usize = 512;
const LR: f64 = 1e-3;
const WARMUP: usize = 2;

/// Input and four hidden layers all 512 wide, so two stages of two layers cost the same
/// (the last stage's head, 512 → 10, is small).
const WIDTH: usize = 512;

fn model() -> Mlp<B> {
    let device = Default::default();
    B::seed(&device, 1);
    MlpConfig::new()
        .with_input(WIDTH)
        .with_hidden(WIDTH)
        .with_layers(4)
        .init(&device)
        .fork(&device)
}

#[derive(Clone, Copy, Debug)]
enum Variant {
    /// Schedule, micro-batches, recompute.
    Pipeline(Schedule, usize, bool),
    Ddp,
}

/// One round: wall time of the timed steps, and the ranks' stats over them.
fn run(variant: Variant, batches: &[Vec<usize>], data: &Source) -> (Duration, Vec<RankStats>) {
    let world = World::local(vec![Default::default(); 2]).unwrap();
    let mut strategy: Box<dyn Strategy<B, Mlp<B>>> = match variant {
        Variant::Pipeline(schedule, micro_batches, recompute) => Box::new(
            Pipeline::new(
                &world,
                model(),
                AdamWConfig::new().init(),
                data.clone(),
                PipelineConfig {
                    stages: 2,
                    micro_batches,
                    schedule,
                    threads_per_rank: Some(1),
                    recompute,
                    ..PipelineConfig::default()
                },
            )
            .unwrap(),
        ),
        Variant::Ddp => Box::new(
            Ddp::new(
                &world,
                model(),
                AdamWConfig::new().init(),
                data.clone(),
                DdpConfig {
                    threads_per_rank: Some(1),
                    ..DdpConfig::default()
                },
            )
            .unwrap(),
        ),
    };
    for batch in &batches[..WARMUP] {
        strategy.step(batch, LR).unwrap();
    }
    let before = strategy.stats();
    let start = Instant::now();
    for batch in &batches[WARMUP..] {
        strategy.step(batch, LR).unwrap();
    }
    let wall = start.elapsed();
    let after = strategy.stats();
    let delta = before
        .iter()
        .zip(after)
        .map(|(before, after)| after.since(before))
        .collect();
    (wall, delta)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rounds = args.first().copied().unwrap_or(5);
    let steps = args.get(1).copied().unwrap_or(10);

    let task = TeacherTask {
        samples: 8192,
        features: WIDTH,
        classes: 10,
        seed: 5,
    };
    let data = DataSource::new(task.dataset(), ClassificationBatcher);
    let batches: Vec<Vec<usize>> = EpochSampler::new(data.len(), BATCH, 9)
        .unwrap()
        .batches()
        .take(WARMUP + steps)
        .collect();

    let mut variants = vec![Variant::Ddp];
    for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
        for m in [2, 4, 8] {
            variants.push(Variant::Pipeline(schedule, m, false));
        }
    }
    variants.push(Variant::Pipeline(Schedule::OneFOneB, 8, true));
    // Per variant and round: samples/s, each rank's idle share, and the bottleneck's.
    let mut throughput = vec![Vec::new(); variants.len()];
    let mut idle = vec![[Vec::new(), Vec::new()]; variants.len()];
    let mut bubble = vec![Vec::new(); variants.len()];
    for round in 0..rounds {
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            let (wall, stats) = run(variants[i], &batches, &data);
            throughput[i].push((steps * BATCH) as f64 / wall.as_secs_f64());
            let share =
                |s: &RankStats| (1.0 - s.compute.as_secs_f64() / wall.as_secs_f64()).max(0.0);
            for (rank, s) in stats.iter().enumerate() {
                idle[i][rank].push(share(s));
            }
            if let Some(bottleneck) = stats.iter().max_by_key(|s| s.compute) {
                bubble[i].push(share(bottleneck));
            }
        }
    }

    println!(
        "MLP {WIDTH} → 4 × {WIDTH} → 10, global batch {BATCH}, {steps} steps × {rounds} rounds, 1 thread per rank"
    );
    println!(
        "| variant | samples/s | idle rank 0 | idle rank 1 | bubble (bottleneck) | theory (p−1)/(m+p−1) |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let ddp = median(throughput[0].clone());
    for (i, variant) in variants.iter().enumerate() {
        let rate = median(throughput[i].clone());
        match variant {
            Variant::Ddp => println!("| ddp world 2 | {rate:.0} | – | – | – | – |"),
            Variant::Pipeline(schedule, m, recompute) => {
                let rank = |r: usize| 100.0 * median(idle[i][r].clone());
                println!(
                    "| pipeline {schedule} p=2 m={m}{} | {rate:.0} ({:.2}× ddp) | {:.1} % | {:.1} % | {:.1} % | {:.1} % |",
                    if *recompute { " recompute" } else { "" },
                    rate / ddp,
                    rank(0),
                    rank(1),
                    100.0 * median(bubble[i].clone()),
                    100.0 / (m + 1) as f64,
                )
            }
        }
    }
}
