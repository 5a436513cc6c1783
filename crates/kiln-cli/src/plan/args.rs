//! `kiln plan`'s flags: the model and the cluster described, the precision, the output.

use std::path::PathBuf;

use kiln_core::optim::Precision;

use crate::run_config::ModelKind;

/// `kiln plan`'s flags.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// A built-in model (`kiln train --model`), measured on this machine's CPU cores: its
    /// step timed on one core, the collective probed between two ranks.
    #[arg(long, value_enum)]
    pub(super) model: Option<ModelKind>,
    /// A Hugging Face model (LLaMA family): its folder, its `config.json`, or a Hub name
    /// (org/name[@revision]) in the Hugging Face cache.
    #[arg(long, value_name = "PATH")]
    pub(super) model_config: Option<PathBuf>,
    /// Blocks (a transformer described by its shape).
    #[arg(long)]
    pub(super) layers: Option<usize>,
    /// Model width.
    #[arg(long)]
    pub(super) hidden: Option<usize>,
    /// Attention heads.
    #[arg(long)]
    pub(super) heads: Option<usize>,
    /// Key-value heads (grouped-query attention) [default: --heads].
    #[arg(long)]
    pub(super) kv_heads: Option<usize>,
    /// Feed-forward width [default: 4 × --hidden].
    #[arg(long)]
    pub(super) ffn: Option<usize>,
    /// Tokens per sample [default with --model-config: its max_position_embeddings].
    #[arg(long)]
    pub(super) seq: Option<usize>,
    /// Vocabulary.
    #[arg(long)]
    pub(super) vocab: Option<usize>,
    /// A gated (SwiGLU) feed-forward, three matrices instead of two.
    #[arg(long)]
    pub(super) gated: bool,
    /// The output head shares the embedding.
    #[arg(long)]
    pub(super) tied: bool,
    /// Parameters (a model described by its totals, with --flops-per-sample and
    /// --activation-bytes-per-sample; it cannot be tensor-parallel).
    #[arg(long)]
    pub(super) params: Option<u64>,
    /// Forward FLOPs per sample.
    #[arg(long)]
    pub(super) flops_per_sample: Option<f64>,
    /// Activation bytes one sample keeps for the backward, all blocks together.
    #[arg(long)]
    pub(super) activation_bytes_per_sample: Option<f64>,
    /// Fine-tune LoRA adapters of this rank on every projection, the base frozen (as `kiln
    /// finetune`), instead of training every weight.
    #[arg(long)]
    pub(super) lora_rank: Option<usize>,
    /// The frozen base in 4 bits (QLoRA, as `kiln finetune --load-in-4bit`); needs
    /// --lora-rank.
    #[arg(long)]
    pub(super) load_in_4bit: bool,
    /// Samples per optimizer step.
    #[arg(long)]
    pub(super) global_batch: usize,
    /// Training precision: bf16 (with f32 master weights and moments) or f32.
    #[arg(long, value_enum, default_value = "bf16")]
    pub(super) precision: PrecisionArg,
    /// The devices' kind: h100-sxm, h200, a100-80g or a100-40g (the flags below override
    /// its figures).
    #[arg(long, default_value = "h100-sxm", conflicts_with = "model")]
    pub(super) device: String,
    /// Devices in all [default: 8; with --model, this machine's cores].
    #[arg(long)]
    pub(super) devices: Option<usize>,
    /// Devices per machine [default: 8, or --devices when fewer].
    #[arg(long, conflicts_with = "model")]
    pub(super) gpus_per_node: Option<usize>,
    /// Memory per device, e.g. 80GiB, or each device's where they differ: 24GiB,12GiB (one
    /// per device; their count is the devices' unless --devices says it).
    #[arg(long, conflicts_with = "model")]
    pub(super) device_memory: Option<String>,
    /// What a plan may fill of some devices, by index, as Accelerate's `max_memory`:
    /// 0=10GiB,1=8GiB (the others keep 90 % of their memory; with --model, this machine's
    /// ranks).
    #[arg(long)]
    pub(super) max_memory: Option<String>,
    /// What a plan leaves free on every device without a --max-memory limit, e.g. 2GiB
    /// [default: 10 % of the device].
    #[arg(long)]
    pub(super) memory_margin: Option<String>,
    /// Dense peak TFLOP/s per device.
    #[arg(long, conflicts_with = "model")]
    pub(super) device_tflops: Option<f64>,
    /// The share of the peak a training step reaches.
    #[arg(long, default_value_t = kiln_core::plan::cost::DEFAULT_EFFICIENCY, conflicts_with = "model")]
    pub(super) efficiency: f64,
    /// Bandwidth between two devices of a machine, GB/s.
    #[arg(long, conflicts_with = "model")]
    pub(super) intra_node_gbps: Option<f64>,
    /// Bandwidth from a device to another machine, GB/s.
    #[arg(long, conflicts_with = "model")]
    pub(super) inter_node_gbps: Option<f64>,
    /// Candidates printed (every one goes to --json).
    #[arg(long, default_value_t = 10)]
    pub(super) top: usize,
    /// Also write every candidate as JSON here (`-` for standard output, instead of the
    /// table).
    #[arg(long, value_name = "PATH")]
    pub(super) json: Option<PathBuf>,
}

/// Training precisions `--precision` takes.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum PrecisionArg {
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
