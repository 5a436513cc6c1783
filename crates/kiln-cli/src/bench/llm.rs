//! `kiln bench llm`: a random LLaMA-shaped Hugging Face folder of a chosen size, the host
//! memory of loading it in f32 and in 4 bits (each in a fresh `kiln` process), and LoRA or
//! QLoRA fine-tuning throughput through strategies side by side, on the CPU or a GPU
//! (`--backend cuda`, where `benches/peer/finetune.py` is the transformers + PEFT peer).

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::tensor::backend::AutodiffBackend;
use kiln_bench::llm::{
    FinetuneCase, FinetuneResult, FinetuneSetup, LlmSize, LoadMemory, finetune_throughput,
    measure_load, write_checkpoint,
};
use kiln_core::strategy::StrategyKind;
use kiln_nn::tensor_parallel::ShardedBackend;

use crate::backend::{BackendKind, Job, Placement, dispatch};

/// Options of `kiln bench llm`.
#[derive(clap::Args, Debug)]
pub struct LlmArgs {
    /// The model: tiny (0.1 M parameters), 100m (125 M) or 500m (501 M).
    #[arg(long, default_value = "100m")]
    size: LlmSize,
    /// The model folder; a random model of --size is written there first when it has no
    /// config.json [default: runs/bench/llm-SIZE].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Skip the loading measurements.
    #[arg(long)]
    no_load: bool,
    /// Fine-tuning runs as strategy:ranks, comma-separated; none to skip fine-tuning.
    #[arg(long, value_delimiter = ',', default_value = "single:1,ddp:2")]
    finetune: Vec<String>,
    /// Fine-tune on a 4-bit base (QLoRA).
    #[arg(long)]
    load_in_4bit: bool,
    /// Backend of the fine-tuning runs (loading is measured on the CPU) [default: flex].
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 128)]
    seq_len: usize,
    /// LoRA rank (all seven projections, alpha = rank).
    #[arg(long, default_value_t = 16)]
    lora_rank: usize,
    /// Untimed steps first (at least 1: the first step also starts the ranks).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 4)]
    steps: usize,
    /// Recompute each decoder layer's activations in the backward (activation
    /// checkpointing).
    #[arg(long)]
    gradient_checkpointing: bool,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Measure the loading of --dir in this process ("f32" or "4bit") and print it as JSON:
    /// what this command runs in a fresh process per mode.
    #[arg(long, hide = true)]
    measure_load: Option<String>,
}

/// Everything one run measured.
#[derive(Debug, serde::Serialize)]
struct LlmReport {
    size: String,
    dir: String,
    backend: String,
    load: Vec<LoadMemory>,
    finetune: Vec<FinetuneResult>,
    setup: FinetuneSetup,
}

/// Flags of `kiln bench llm` that cannot work.
#[derive(Debug, thiserror::Error)]
enum LlmBenchError {
    /// A fine-tuning case that does not parse.
    #[error("--finetune: '{0}' is not strategy:ranks (e.g. single:1, ddp:2, pipeline:2)")]
    BadCase(String),
    /// A size of zero.
    #[error("--{0} must be at least 1")]
    Zero(&'static str),
    /// A loading mode other than the two.
    #[error("--measure-load must be f32 or 4bit, got '{0}'")]
    Mode(String),
}

fn parse_case(text: &str) -> Result<FinetuneCase, LlmBenchError> {
    let text = text.trim();
    let bad = || LlmBenchError::BadCase(text.to_string());
    let (strategy, world) = text.split_once(':').ok_or_else(bad)?;
    let strategy: StrategyKind = strategy.parse().map_err(|_| bad())?;
    let world: usize = world.parse().ok().filter(|&w| w > 0).ok_or_else(bad)?;
    Ok(FinetuneCase { strategy, world })
}

const MIB: f64 = 1048576.0;

/// Runs `kiln bench llm`.
///
/// # Errors
/// A folder that cannot be written or loaded, a bad case, or a run that fails.
pub fn run(args: LlmArgs) -> Result<(), Box<dyn std::error::Error>> {
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("runs/bench/llm-{}", args.size)));
    if let Some(mode) = &args.measure_load {
        let four_bit = match mode.as_str() {
            "f32" => false,
            "4bit" => true,
            other => return Err(LlmBenchError::Mode(other.to_string()).into()),
        };
        let memory = measure_load(&dir, four_bit)?;
        println!("{}", serde_json::to_string(&memory)?);
        return Ok(());
    }
    // Warm-up steps take the threads' start and the model's split off the timed steps.
    for (flag, value) in [
        ("batch", args.batch),
        ("seq-len", args.seq_len),
        ("lora-rank", args.lora_rank),
        ("warmup", args.warmup),
        ("steps", args.steps),
    ] {
        if value == 0 {
            return Err(LlmBenchError::Zero(flag).into());
        }
    }
    let cases = args
        .finetune
        .iter()
        .filter(|c| c.trim() != "none")
        .map(|c| parse_case(c))
        .collect::<Result<Vec<_>, _>>()?;
    let _claim = crate::outputs::check_files(&[("--json", args.json.as_deref())])?;
    // The folder is read by every run below: another bench writing it meanwhile is refused.
    let _claim = crate::outputs::check_folder("--dir", &dir)?;
    if !dir.join("config.json").is_file() {
        eprintln!(
            "writing a random {} model into {}",
            args.size,
            dir.display()
        );
        write_checkpoint(args.size, &dir)?;
    }
    let mut load = Vec::new();
    if !args.no_load {
        for mode in ["f32", "4bit"] {
            let memory = load_in_child(&dir, mode)?;
            println!(
                "load {mode:>4}: {} parameters, files {:.0} MiB, {:.1} s; peak anonymous {:.0} \
                 MiB, held {:.0} MiB ({:.3} bytes/parameter), peak resident (mapped file \
                 included) {:.0} MiB",
                memory.parameters,
                memory.file_bytes as f64 / MIB,
                memory.seconds,
                memory.peak_anon_bytes as f64 / MIB,
                memory.held_bytes as f64 / MIB,
                memory.bytes_per_parameter(),
                memory.peak_rss_bytes as f64 / MIB,
            );
            load.push(memory);
        }
    }
    let setup = FinetuneSetup {
        four_bit: args.load_in_4bit,
        batch: args.batch,
        seq_len: args.seq_len,
        lora_rank: args.lora_rank,
        warmup: args.warmup,
        steps: args.steps,
        gradient_checkpointing: args.gradient_checkpointing,
    };
    let finetune = if cases.is_empty() {
        Vec::new()
    } else {
        let ranks = cases.iter().map(|c| c.world).max().unwrap_or(1);
        let job = Finetune {
            dir: &dir,
            cases: &cases,
            setup: &setup,
        };
        dispatch(
            args.backend.unwrap_or(BackendKind::Flex),
            &Placement::Ranks(ranks),
            job,
        )?
    };
    for r in &finetune {
        println!(
            "{}fine-tune {}{}: {:.0} ms/step (min {:.0}, max {:.0}), {:.0} tokens/s, loss {:.4}{}",
            if setup.four_bit { "QLoRA " } else { "LoRA " },
            r.case,
            if setup.gradient_checkpointing {
                " (recomputed)"
            } else {
                ""
            },
            r.step_ms.median,
            r.step_ms.min,
            r.step_ms.max,
            r.tokens_per_s,
            r.final_loss,
            r.peak_rank_bytes
                .map(|b| format!(", rank peak {:.0} MiB", b as f64 / MIB))
                .unwrap_or_default()
        );
    }
    if let Some(path) = &args.json {
        let report = LlmReport {
            size: args.size.to_string(),
            dir: dir.display().to_string(),
            backend: args.backend.unwrap_or(BackendKind::Flex).to_string(),
            load,
            finetune,
            setup,
        };
        crate::outputs::write(
            "--json",
            path,
            serde_json::to_string_pretty(&report)?.as_bytes(),
        )?;
    }
    Ok(())
}

/// The fine-tuning cases on the backend the user chose.
struct Finetune<'a> {
    dir: &'a Path,
    cases: &'a [FinetuneCase],
    setup: &'a FinetuneSetup,
}

impl Job for Finetune<'_> {
    type Output = Vec<FinetuneResult>;

    fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<Self::Output, Box<dyn std::error::Error>> {
        finetune_throughput::<B>(self.dir, self.cases, self.setup, &devices)
    }
}

/// The loading of `dir` in `mode`, measured by a fresh `kiln` process.
fn load_in_child(dir: &Path, mode: &str) -> Result<LoadMemory, Box<dyn std::error::Error>> {
    let output = Command::new(std::env::current_exe()?)
        .args(["bench", "llm", "--measure-load", mode, "--dir"])
        .arg(dir)
        // mimalloc (kiln's allocator) keeps freed pages a while before it returns them; at 0
        // it returns them at once, so the figures are what the loader holds, not what the
        // allocator has cached.
        .env("MIMALLOC_PURGE_DELAY", "0")
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "loading {} ({mode}) failed: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    let text = String::from_utf8(output.stdout)?;
    let line = text
        .lines()
        .last()
        .ok_or("the loading process printed nothing")?;
    Ok(serde_json::from_str(line)?)
}
