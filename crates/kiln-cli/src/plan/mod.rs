//! `kiln plan`: how a model should train on a cluster, and how fast, from its description and
//! the cluster's, without either being here, or for a built-in model measured on this
//! machine's cores (`--model`, as `auto` plans). Prints every layout `dp × pp × tp` the cost
//! model ([`kiln_core::plan::cost`]) estimates, best first, and why the first was chosen.

mod describe;
mod table;

use std::path::PathBuf;

use kiln_core::optim::Precision;
use kiln_core::plan::cost::{Cluster, Workload, search};

use crate::run_config::{ModelKind, TrainConfig};

/// `kiln plan`'s flags.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// A built-in model (`kiln train --model`), measured on this machine's CPU cores: its
    /// step timed on one core, the collective probed between two ranks.
    #[arg(long, value_enum)]
    model: Option<ModelKind>,
    /// A Hugging Face model (LLaMA family): its folder, its `config.json`, or a Hub name
    /// (org/name[@revision]) in the Hugging Face cache.
    #[arg(long, value_name = "PATH")]
    model_config: Option<PathBuf>,
    /// Blocks (a transformer described by its shape).
    #[arg(long)]
    layers: Option<usize>,
    /// Model width.
    #[arg(long)]
    hidden: Option<usize>,
    /// Attention heads.
    #[arg(long)]
    heads: Option<usize>,
    /// Key-value heads (grouped-query attention) [default: --heads].
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Feed-forward width [default: 4 × --hidden].
    #[arg(long)]
    ffn: Option<usize>,
    /// Tokens per sample [default with --model-config: its max_position_embeddings].
    #[arg(long)]
    seq: Option<usize>,
    /// Vocabulary.
    #[arg(long)]
    vocab: Option<usize>,
    /// A gated (SwiGLU) feed-forward, three matrices instead of two.
    #[arg(long)]
    gated: bool,
    /// The output head shares the embedding.
    #[arg(long)]
    tied: bool,
    /// Parameters (a model described by its totals, with --flops-per-sample and
    /// --activation-bytes-per-sample; it cannot be tensor-parallel).
    #[arg(long)]
    params: Option<u64>,
    /// Forward FLOPs per sample.
    #[arg(long)]
    flops_per_sample: Option<f64>,
    /// Activation bytes one sample keeps for the backward, all blocks together.
    #[arg(long)]
    activation_bytes_per_sample: Option<f64>,
    /// Fine-tune LoRA adapters of this rank on every projection, the base frozen (as `kiln
    /// finetune`), instead of training every weight.
    #[arg(long)]
    lora_rank: Option<usize>,
    /// The frozen base in 4 bits (QLoRA, as `kiln finetune --load-in-4bit`); needs
    /// --lora-rank.
    #[arg(long)]
    load_in_4bit: bool,
    /// Samples per optimizer step.
    #[arg(long)]
    global_batch: usize,
    /// Training precision: bf16 (with f32 master weights and moments) or f32.
    #[arg(long, value_enum, default_value = "bf16")]
    precision: PrecisionArg,
    /// The devices' kind: h100-sxm, h200, a100-80g or a100-40g (the flags below override
    /// its figures).
    #[arg(long, default_value = "h100-sxm")]
    device: String,
    /// Devices in all [default: 8; with --model, this machine's cores].
    #[arg(long)]
    devices: Option<usize>,
    /// Devices per machine [default: 8, or --devices when fewer].
    #[arg(long)]
    gpus_per_node: Option<usize>,
    /// Memory per device, e.g. 80GiB.
    #[arg(long)]
    device_memory: Option<String>,
    /// Dense peak TFLOP/s per device.
    #[arg(long)]
    device_tflops: Option<f64>,
    /// The share of the peak a training step reaches.
    #[arg(long, default_value_t = kiln_core::plan::cost::DEFAULT_EFFICIENCY)]
    efficiency: f64,
    /// Bandwidth between two devices of a machine, GB/s.
    #[arg(long)]
    intra_node_gbps: Option<f64>,
    /// Bandwidth from a device to another machine, GB/s.
    #[arg(long)]
    inter_node_gbps: Option<f64>,
    /// Candidates printed (every one goes to --json).
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Also write every candidate as JSON here (`-` for standard output, instead of the
    /// table).
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

/// Training precisions `--precision` takes.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PrecisionArg {
    Bf16,
    F32,
}

impl From<PrecisionArg> for Precision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::Bf16 => Precision::Bf16,
            PrecisionArg::F32 => Precision::F32,
        }
    }
}

/// What `kiln plan --json` writes.
#[derive(Debug, serde::Serialize)]
struct PlanReport<'a> {
    /// What a step asks.
    workload: &'a kiln_core::plan::cost::Workload,
    /// The devices.
    cluster: &'a kiln_core::plan::cost::Cluster,
    /// Why the first candidate was chosen.
    reason: &'a str,
    /// Every candidate: the chosen, the others that fit (fastest first), then the rejected.
    candidates: &'a [kiln_core::plan::cost::Candidate],
}

/// Runs `kiln plan`.
///
/// # Errors
/// A model or cluster described wrongly, or nothing that fits (naming what would).
pub fn run(args: PlanArgs) -> Result<(), Box<dyn std::error::Error>> {
    // `-` is standard output; a file is claimed before the plan is searched.
    let json_file = args.json.as_deref().filter(|p| p.to_str() != Some("-"));
    let _claim = crate::outputs::check_files(&[("--json", json_file)])?;
    let (name, work, cluster) = match args.model {
        Some(model) => measured(&args, model)?,
        None => {
            let (name, work) = describe::workload(&args)?;
            (name, work, describe::cluster(&args)?)
        }
    };
    let planned = search(&work, &cluster)?;
    let report = PlanReport {
        workload: &work,
        cluster: &cluster,
        reason: &planned.reason,
        candidates: &planned.candidates,
    };
    let json = serde_json::to_string_pretty(&report)?;
    match json_file {
        None if args.json.is_some() => println!("{json}"),
        other => {
            if let Some(path) = other {
                crate::outputs::write("--json", path, (json + "\n").as_bytes())?;
            }
            print!(
                "{}",
                table::render(&name, &work, &cluster, &planned, args.top)
            );
        }
    }
    Ok(())
}

/// The built-in `model` and this machine, measured.
fn measured(
    args: &PlanArgs,
    model: ModelKind,
) -> Result<(String, Workload, Cluster), Box<dyn std::error::Error>> {
    let config = TrainConfig {
        model,
        batch: args.global_batch,
        ..TrainConfig::default()
    };
    config.validate()?;
    let planner = crate::planning::planner(&config)?;
    let cores = planner.cluster.devices;
    let devices = args.devices.unwrap_or(cores);
    if devices == 0 {
        return Err("--devices must be at least 1".into());
    }
    let name = format!("the built-in {} (measured on this machine)", model.name());
    Ok((name, planner.workload.clone(), planner.cluster(devices)))
}
