//! `kiln bench`: benchmarks that need a binary rather than `cargo bench` (GPU machines have no
//! cargo). The measuring lives in the kiln-bench crate; this is the command line.

mod kernels;
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
}

/// Runs a bench command.
pub fn run(command: BenchCommand) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        BenchCommand::Kernels(args) => kernels::run(args),
        BenchCommand::Strategies(args) => strategies::run(args),
    }
}
