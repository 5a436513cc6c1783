//! `kiln`: train Burn models on many devices.

mod ad;
mod allocator;
mod backend;
mod bench;
mod checkpoint_args;
mod config_file;
mod export;
mod finetune;
mod generate;
mod hub;
mod launch;
mod launched;
mod names;
mod optimizer_args;
mod outputs;
mod parallel_args;
mod plan;
mod planning;
mod run_config;
mod signals;
mod train;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Train one Burn model on many devices through pluggable parallelism strategies.
#[derive(Parser, Debug)]
#[command(name = "kiln", version, about)]
struct Cli {
    /// Download a `--model org/name` the Hugging Face cache lacks, from `$HF_ENDPOINT`
    /// (huggingface.co by default) into the cache; without it Kiln reads the cache only.
    #[arg(long, global = true)]
    download: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train a built-in model on built-in synthetic data.
    Train(Box<train::TrainArgs>),
    /// Fine-tune a Hugging Face model folder with LoRA adapters (QLoRA with --load-in-4bit)
    /// on text, prompt-completion or chat data (JSON Lines, JSON or Parquet); the adapters
    /// are written in PEFT's layout.
    Finetune(Box<finetune::FinetuneArgs>),
    /// Generate text from a Hugging Face model folder, with fine-tuned adapters when given.
    Generate(Box<generate::GenerateArgs>),
    /// A model out for the rest of the ecosystem: `kiln export gguf` for llama.cpp, Ollama and
    /// LM Studio, `kiln export merged` a Hugging Face folder with the adapters merged in.
    #[command(subcommand)]
    Export(export::ExportCommand),
    /// Algorithm Distillation on Dark Room: train and evaluate in-context RL.
    #[command(subcommand)]
    Ad(ad::AdCommand),
    /// Benchmarks: `kiln bench strategies` trains every strategy side by side; `kiln bench
    /// kernels` times the CubeCL kernels against Burn's composites (a build with the `wgpu`
    /// or `cuda` feature).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// How a model should train on a cluster, and how fast: every layout dp × pp × tp with
    /// its memory per device and step time, from a description of the model (a Hugging Face
    /// config.json, a transformer's shape, or totals) and of the devices (`--device h100-sxm
    /// --devices 64`). Nothing needs to be here.
    Plan(Box<plan::PlanArgs>),
    /// Start a job of several processes through Open MPI's mpirun, one or more per machine:
    /// `kiln launch --nproc-per-node 2 -- kiln train --strategy ddp`. Each output line is
    /// prefixed with its rank; a failed rank is named. The processes need a build with the
    /// `mpi` feature.
    Launch(launch::LaunchArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
        Err(e) => {
            // One line: the reason (with the flags clap lists below it, such as the required
            // ones missing), without its usage block.
            let reason = e.to_string();
            let parts: Vec<&str> = reason
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let line = match parts.as_slice() {
                [] => "error: invalid arguments".to_string(),
                [first, rest @ ..] => {
                    let rest = rest.join(", ");
                    match rest.is_empty() {
                        true => first.to_string(),
                        false => format!("{}: {rest}", first.trim_end_matches(':')),
                    }
                }
            };
            eprintln!("{line} (see `kiln --help`)");
            return ExitCode::from(2);
        }
    };
    if let Command::Launch(args) = cli.command {
        return launch::run(args).unwrap_or_else(|e| {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        });
    }
    // The run's other processes log warnings only, so that its story is told once.
    let level = match launched::Launched::from_env() {
        Ok(l) if !l.is_main() => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into()))
        .with_writer(std::io::stderr)
        .with_target(false)
        // Colour only for a person at a terminal who has not asked for none (no-color.org).
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .init();
    allocator::keep_freed_pages();
    hub::allow_downloads(cli.download);
    // The matmul tuner reads its settings from the environment: a bad one stops the run here,
    // before any work, rather than at its first product on a GPU.
    match kiln_kernels::cube::tune::Settings::from_env() {
        Ok(settings) => kiln_kernels::cube::tune::configure(settings),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }

    let run = std::panic::AssertUnwindSafe(|| match cli.command {
        Command::Train(args) => train::run(*args),
        Command::Finetune(args) => finetune::run(*args),
        Command::Generate(args) => generate::run(*args),
        Command::Export(command) => export::run(command),
        Command::Ad(command) => ad::run(command),
        Command::Bench(command) => bench::run(command),
        Command::Plan(args) => plan::run(*args),
        Command::Launch(_) => unreachable!("handled above"),
    });
    let result = match std::panic::catch_unwind(run) {
        Ok(result) => result,
        // The panic's message is already on stderr. Exiting the usual way runs the exit-time
        // destructors of the backends' thread pools, which can spin forever once a panic has
        // left one of them mid-task: the process ends now instead, without them.
        Err(_) => {
            let line = "error: Kiln stopped on an internal error (above); please report it\n";
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            // SAFETY: `_exit` ends the process at once; nothing after it runs.
            unsafe { libc::_exit(101) }
        }
    };
    match result {
        Ok(()) => {
            launched::finish();
            ExitCode::SUCCESS
        }
        // A run the user stopped is not an error: it says where it saved, and exits as a
        // process ended by the signal does (130, 143), so that scripts see the interruption.
        Err(e) => match e.downcast_ref::<signals::Interrupted>() {
            Some(interrupted) => {
                // One write, as below: under `kiln launch` another process's line would
                // otherwise land inside this one (seen once under load).
                let line = format!("{interrupted}\n");
                let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
                // Every process stopped after the same step; finalising waits for the others,
                // so that no process exits (which ends the job) while the first still saves.
                launched::finish();
                ExitCode::from(interrupted.exit_code())
            }
            None => {
                // One write, so that a launcher tagging each write keeps the line whole.
                let line = format!("error: {e}\n");
                let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
                ExitCode::FAILURE
            }
        },
    }
}
