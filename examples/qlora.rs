//! QLoRA fine-tuning through a Kiln strategy: a small causal transformer whose seven
//! projections per block are frozen NF4 weights with trainable rank-8 adapters, trained with
//! the fused AdamW on the Fibonacci task, then its adapters saved alone.
//!
//! ```text
//! cargo run --release --example qlora            # one rank
//! cargo run --release --example qlora -- 2       # Ddp over two ranks
//! ```
//! On Flex (here) the fused ops run their plain-Burn reference; on wgpu or CUDA the same model
//! runs the CubeCL kernels.

use burn::backend::{Autodiff, Flex};
use burn::data::dataset::Dataset;
use burn::module::Module;
use kiln::core::data::{DataSource, EpochSampler};
use kiln::core::plan::{Plan, PlanRequest};
use kiln::core::strategy::{StrategyKind, build};
use kiln::kernels::FusedAdamWConfig;
use kiln::nn::lora::{LoraConfig, LoraKind, QuantConfig};
use kiln::nn::models::LoraTransformerConfig;
use kiln::nn::tasks::{FibonacciTask, SequenceBatcher};

type B = Autodiff<Flex>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_target(false).init();
    let world = std::env::args()
        .nth(1)
        .map(|w| w.parse::<usize>())
        .transpose()
        .map_err(|e| format!("the argument is the number of ranks: {e}"))?
        .unwrap_or(1);
    let device = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, 42);
    // ANCHOR: model
    let model = LoraTransformerConfig::new()
        .with_d_model(64)
        .with_d_ff(128)
        .with_lora(LoraConfig::new().with_rank(8))
        .with_kind(LoraKind::QLora(QuantConfig::new()))
        .init::<B>(&device)
        .fork(&device);
    // ANCHOR_END: model
    let adapters: usize = model
        .blocks
        .iter()
        .flat_map(|b| b.adapters().adapters)
        .map(|a| a.num_params())
        .sum();
    let (base, base_bytes) = model
        .blocks
        .iter()
        .map(|b| b.base_storage())
        .fold((0, 0), |(p, b), (p1, b1)| (p + p1, b + b1));
    println!(
        "frozen NF4 bases: {base} parameters in {base_bytes} bytes ({:.4} B/parameter); \
         adapters: {adapters} trainable parameters",
        base_bytes as f64 / base as f64
    );

    // ANCHOR: strategy
    let dataset = FibonacciTask {
        samples: 1024,
        len: 16,
        vocab: 16,
        seed: 1,
    }
    .dataset();
    let sampler = EpochSampler::new(dataset.len(), 32, 7)?;
    let data = DataSource::new(dataset, SequenceBatcher);
    // `auto` on `world` ranks: Single for one, Ddp for more; the plan says which and why.
    let plan = Plan::resolve(PlanRequest::new(StrategyKind::Auto, 32).with_world(world))?;
    println!("{plan}");
    let mut strategy = build(
        &plan,
        vec![device; world],
        model,
        &FusedAdamWConfig::new(),
        data,
    )?;
    // ANCHOR_END: strategy

    // ANCHOR: train
    let steps = 300;
    let mut losses = Vec::with_capacity(steps);
    for (step, batch) in sampler.batches().take(steps).enumerate() {
        let out = strategy.step(&batch, 3e-3)?;
        losses.push(out.loss);
        if step % 50 == 0 || step + 1 == steps {
            println!("step {step:>3}: loss {:.4}", out.loss);
        }
    }
    let model = strategy.model()?;
    // ANCHOR_END: train

    let dir = std::path::Path::new("runs/qlora");
    std::fs::create_dir_all(dir)?;
    // ANCHOR: adapters
    for (i, block) in model.blocks.iter().enumerate() {
        block.save_adapters(dir.join(format!("block{i}-adapters")))?;
    }
    // ANCHOR_END: adapters
    println!(
        "loss {:.4} → {:.4}; adapters saved alone in {}",
        losses[0],
        losses[steps - 1],
        dir.display()
    );
    Ok(())
}
