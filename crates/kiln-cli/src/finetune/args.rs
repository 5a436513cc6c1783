//! `kiln finetune`'s flags, and how they override the config: what a run trains, where it
//! writes, and the plan it runs.

use std::path::PathBuf;

use kiln_core::plan::Plan;
use kiln_nn::llm::{DataFormat, Packing, TrainOn};

use super::config::{FinetuneConfig, FinetuneConfigError, MergedDtype};
use crate::checkpoint_args::CheckpointArgs;
use crate::launched::Launched;
use crate::run_config::RunArgs;

/// Flags of `kiln finetune`; each overrides the same field of `--config`.
#[derive(clap::Args, Debug)]
pub struct FinetuneArgs {
    /// TOML config to start from (`model`, `data`, `output`, `merged`, `seq_len`, `packing`,
    /// `load_in_4bit`, `[lora]`, `[quant]`, `[checkpoint]`, and `[train]` as in kiln train's
    /// config).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The Hugging Face model folder: config.json, model.safetensors (or a sharded index) and
    /// tokenizer.json; or a Hub name (org/name[@revision]) downloaded into the Hugging Face
    /// cache.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// The data: JSON Lines, a JSON array or Parquet (`.parquet`) of `{"text": ..}`,
    /// `{"prompt": .., "completion": ..}` (strings, or lists of messages), `{"messages":
    /// [{"role": .., "content": ..}, ..]}` or Alpaca's `{"instruction", "input", "output"}`.
    /// Conversations go through the model's chat template.
    #[arg(long, value_name = "FILE")]
    data: Option<PathBuf>,
    /// The shape of the data's rows [default: auto, told by each row's keys].
    #[arg(long, value_enum)]
    data_format: Option<DataFormatArg>,
    /// A Jinja chat template to render conversations with, instead of the model folder's
    /// (chat_template.jinja, or tokenizer_config.json's chat_template).
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// What the loss trains: the completions and the assistant turns (with their end-of-turn
    /// tokens), or every token [default: completion].
    #[arg(long, value_enum)]
    train_on: Option<TrainOnArg>,
    /// Where to write the adapters (PEFT's adapter_config.json and
    /// adapter_model.safetensors) [default: finetuned]. `--out`, as every subcommand names
    /// where its results go; `--output` is the same flag.
    #[arg(long = "out", visible_alias = "output", value_name = "DIR")]
    output: Option<PathBuf>,
    /// Also write the model with the adapters merged, as a Hugging Face folder.
    #[arg(long, value_name = "DIR")]
    merged: Option<PathBuf>,
    /// The merged model's dtype, or with --full the model's [default: auto, the base
    /// folder's].
    #[arg(long, value_enum)]
    merged_dtype: Option<MergedDtype>,
    /// Full fine-tuning: every weight trains, no adapters; --out receives the whole model as
    /// a Hugging Face folder (safetensors in the base's dtype, its config and tokenizer
    /// files). Pair it with `--strategy ddp --shard-state optimizer` to split AdamW's state.
    #[arg(long)]
    full: bool,
    /// QLoRA: quantise every projection to 4 bits (NF4) as it is loaded.
    #[arg(long)]
    load_in_4bit: bool,
    /// LoRA rank [default: 16].
    #[arg(long)]
    lora_rank: Option<usize>,
    /// LoRA alpha: the adapters' output is scaled by alpha / rank [default: 16].
    #[arg(long, allow_negative_numbers = true)]
    lora_alpha: Option<f32>,
    /// Projections to adapt, comma-separated, or `all-linear` (PEFT's name for all seven)
    /// [default: all seven: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj].
    #[arg(long, value_delimiter = ',')]
    target_modules: Option<Vec<String>>,
    /// rsLoRA: scale the adapters' output by alpha / √rank instead of alpha / rank.
    #[arg(long)]
    use_rslora: bool,
    /// Activation checkpointing: keep only each decoder layer's input and recompute its
    /// activations in the backward (each stage's, under pipeline stages, as --recompute).
    #[arg(long)]
    gradient_checkpointing: bool,
    /// Dropout on the adapters' input while training, as PEFT's lora_dropout [default: 0].
    #[arg(long, value_name = "P")]
    lora_dropout: Option<f64>,
    /// Tokens per sequence [default: 256, or the model's max_position_embeddings when
    /// fewer]. With padding, a longer example's end is cut (with a warning) and one whose
    /// prompt fills it is refused.
    #[arg(long)]
    seq_len: Option<usize>,
    /// Held-out examples to evaluate the loss on (any of --data's shapes): every
    /// --eval-every steps, at every checkpoint and at the end. The checkpoint of the lowest
    /// eval loss is kept whatever --keep says.
    #[arg(long, value_name = "FILE")]
    eval_data: Option<PathBuf>,
    /// Or hold out this fraction of --data (drawn with --seed) to evaluate on.
    #[arg(long, value_name = "FRACTION")]
    eval_split: Option<f64>,
    /// Also evaluate every N steps.
    #[arg(long, value_name = "N")]
    eval_every: Option<usize>,
    /// Batches of examples of similar lengths (transformers' group_by_length), so that
    /// padding each batch to its longest pads little.
    #[arg(long)]
    group_by_length: bool,
    /// Passes over the data, in place of --steps: ⌈epochs · sequences / batch⌉ steps.
    #[arg(long, conflicts_with = "steps")]
    epochs: Option<f64>,
    /// One example per sequence, padded to the batch's longest; `bfd`: whole examples packed
    /// best-fit-decreasing into sequences of --seq-len, each attending only to itself (TRL's
    /// default packing; `pack` says the same); `wrapped`: the examples' stream cut into full
    /// sequences, attending across examples [default: pad].
    #[arg(long, value_enum)]
    packing: Option<PackingArg>,
    #[command(flatten)]
    run: RunArgs,
    /// Save checkpoints (the adapters and the optimizer state; the base is the model
    /// folder's) into this folder: at the end, every --save-every steps, and on SIGINT /
    /// SIGTERM after the current step.
    #[arg(long, value_name = "DIR")]
    save: Option<PathBuf>,
    #[command(flatten)]
    checkpoint: CheckpointArgs,
    /// Write a JSON summary here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Append a JSON line per logging step (step, loss, lr, grad_norm, tokens_per_s) and per
    /// evaluation here, flushed as the run goes.
    #[arg(long, value_name = "FILE")]
    log_file: Option<PathBuf>,
    /// Steps per --log-file line; its loss is their mean [default: 1].
    #[arg(long, value_name = "N", requires = "log_file")]
    log_every: Option<usize>,
    /// Draw the training and eval losses against the step into this SVG file at the end.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

/// What a run reports beside its adapters: the flags' files, written by the first process.
pub(super) struct Reports {
    pub json: Option<PathBuf>,
    pub log_file: Option<PathBuf>,
    pub log_every: usize,
    pub svg: Option<PathBuf>,
}

/// `--packing`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PackingArg {
    Pad,
    #[value(alias = "pack")]
    Bfd,
    Wrapped,
}

/// `--data-format`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum DataFormatArg {
    Auto,
    Text,
    PromptCompletion,
    Messages,
    Alpaca,
}

impl From<DataFormatArg> for DataFormat {
    fn from(arg: DataFormatArg) -> Self {
        match arg {
            DataFormatArg::Auto => Self::Auto,
            DataFormatArg::Text => Self::Text,
            DataFormatArg::PromptCompletion => Self::PromptCompletion,
            DataFormatArg::Messages => Self::Messages,
            DataFormatArg::Alpaca => Self::Alpaca,
        }
    }
}

/// `--train-on`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum TrainOnArg {
    Completion,
    All,
}

/// Where `kiln finetune` saves to and resumes from, as the flags name them.
pub(super) struct Checkpoints {
    pub save: Option<PathBuf>,
    pub args: CheckpointArgs,
}

impl FinetuneArgs {
    pub(super) fn into_config(
        self,
        launched: &Launched,
    ) -> Result<(FinetuneConfig, Plan, Reports, Checkpoints), FinetuneConfigError> {
        let mut c = match &self.config {
            Some(path) => FinetuneConfig::load(path)?,
            None => FinetuneConfig::default(),
        };
        if let Some(model) = self.model {
            c.model = Some(model);
        }
        if let Some(data) = self.data {
            c.data = Some(data);
        }
        if let Some(format) = self.data_format {
            c.data_format = format.into();
        }
        if let Some(template) = self.chat_template {
            c.chat_template = Some(template);
        }
        if let Some(train_on) = self.train_on {
            c.train_on = match train_on {
                TrainOnArg::Completion => TrainOn::Completion,
                TrainOnArg::All => TrainOn::All,
            };
        }
        if let Some(output) = self.output {
            c.output = output;
        }
        if let Some(merged) = self.merged {
            c.merged = Some(merged);
        }
        if let Some(dtype) = self.merged_dtype {
            c.merged_dtype = dtype;
        }
        c.load_in_4bit |= self.load_in_4bit;
        c.full |= self.full;
        if let Some(rank) = self.lora_rank {
            c.lora.rank = rank;
        }
        if let Some(alpha) = self.lora_alpha {
            c.lora.alpha = alpha;
        }
        if let Some(targets) = self.target_modules {
            c.lora.target_modules = targets;
        }
        c.lora.use_rslora |= self.use_rslora;
        c.gradient_checkpointing |= self.gradient_checkpointing;
        c.group_by_length |= self.group_by_length;
        if let Some(dropout) = self.lora_dropout {
            c.lora.dropout = dropout;
        }
        if let Some(seq_len) = self.seq_len {
            c.seq_len = Some(seq_len);
        }
        if let Some(epochs) = self.epochs {
            c.epochs = Some(epochs);
        }
        if let Some(data) = self.eval_data {
            c.eval.data = Some(data);
        }
        if let Some(split) = self.eval_split {
            c.eval.split = Some(split);
        }
        if let Some(every) = self.eval_every {
            c.eval.every = Some(every);
        }
        if let Some(packing) = self.packing {
            c.packing = match packing {
                PackingArg::Pad => Packing::Pad,
                PackingArg::Bfd => Packing::Bfd,
                PackingArg::Wrapped => Packing::Wrapped,
            };
        }
        let dp = self.run.apply(&mut c.train)?;
        if c.gradient_checkpointing {
            // Stages recompute whole: a pipeline stage's forward is checkpointed already.
            c.train.parallel.pipeline.recompute = true;
            if c.train.parallel.auto.recompute.is_none() {
                c.train.parallel.auto.recompute = Some(true);
            }
            // Under ZeRO-3 each recomputed layer gathers its own parameters as it runs, so a
            // step holds the replica's part and one layer instead of the whole model.
            let ddp = &mut c.train.parallel.ddp;
            ddp.gather_units |= ddp.shard_state.splits_parameters();
        }
        self.checkpoint.apply(&mut c.checkpoint);
        c.validate()?;
        // The planner builds and measures Kiln's own models, not a pretrained one.
        let plan = crate::planning::plan(
            &c.train,
            dp,
            launched,
            crate::run_config::AutoPlan::Replicas,
        )?;
        c.train
            .placement(&plan)
            .map_err(crate::run_config::ConfigError::from)?;
        let checkpoints = Checkpoints {
            save: self.save,
            args: self.checkpoint,
        };
        if self.log_every == Some(0) {
            return Err(FinetuneConfigError::LogEvery);
        }
        let reports = Reports {
            json: self.json,
            log_file: self.log_file,
            log_every: self.log_every.unwrap_or(1),
            svg: self.svg,
        };
        Ok((c, plan, reports, checkpoints))
    }
}
