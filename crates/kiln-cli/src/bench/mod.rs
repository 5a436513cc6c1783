//! `kiln bench`: benchmarks that need a binary rather than `cargo bench` (GPU machines have no
//! cargo). The measuring lives in the kiln-bench crate; this is the command line.

mod cubecl;
mod kernels;
mod llm;
mod matmul;
mod plan;
mod strategies;

use clap::Subcommand;

/// What to benchmark.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Time every CubeCL kernel next to the Burn composite it replaces (and the QLoRA matmul
    /// next to Burn's dense matmul), with achieved GB/s and GFLOP/s.
    Kernels(kernels::KernelArgs),
    /// Train every model through every strategy at several world sizes, side by side, and
    /// write JSON, a Markdown table and an SVG chart of throughput against world size.
    Strategies(strategies::StrategyArgs),
    /// Write a random LLaMA-shaped Hugging Face folder (tiny, 100m or 500m parameters),
    /// measure the host memory of loading it in f32 and in 4 bits, and time LoRA / QLoRA
    /// fine-tuning through strategies side by side, on the CPU.
    Llm(Box<llm::LlmArgs>),
    /// Time cubek's matmul strategies (the candidates of Burn's autotune) at Kiln's own
    /// products, next to Burn's default, on a CubeCL backend: what a rule by shape could gain.
    Matmul(matmul::MatmulArgs),
    /// Measure this machine as `auto` does, then train and time every candidate layout the
    /// planner estimates for the built-in models at several world sizes: predicted step time
    /// and memory next to measured, the rank correlation, and whether `auto`'s choice was the
    /// fastest.
    Plan(plan::PlanBenchArgs),
}

/// Runs a bench command.
pub fn run(command: BenchCommand) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        BenchCommand::Kernels(args) => kernels::run(args),
        BenchCommand::Strategies(args) => strategies::run(args),
        BenchCommand::Llm(args) => llm::run(*args),
        BenchCommand::Matmul(args) => matmul::run(args),
        BenchCommand::Plan(args) => plan::run(args),
    }
}
