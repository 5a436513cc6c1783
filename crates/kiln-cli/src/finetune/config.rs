//! The `kiln finetune` job as a config: TOML-loadable, every field defaulted but the model
//! folder and the data file; flags override.

use std::path::{Path, PathBuf};

use kiln_core::checkpoint::{Checkpoint, CheckpointConfig, CheckpointError, config_differences};
use kiln_nn::llm::{
    DataFormat, LlmConfig, LoraSpec, Packing, TARGET_MODULES, TrainOn, expand_target_modules,
};
use kiln_nn::lora::QuantConfig;

use crate::config_file;
use crate::run_config::{ConfigError, TrainConfig};

/// The adapters' settings (`[lora]`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraSettings {
    /// The rank `r`.
    pub rank: usize,
    /// `lora_alpha`: the adapter's output is scaled by `alpha / rank`.
    pub alpha: f32,
    /// The projections adapted in every layer (`["all-linear"]`: all seven, as PEFT names them).
    pub target_modules: Vec<String>,
    /// rsLoRA's scale `alpha / √rank`.
    pub use_rslora: bool,
    /// `lora_dropout`: the adapters' input dropout while training.
    pub dropout: f64,
}

impl Default for LoraSettings {
    fn default() -> Self {
        // QLoRA's and Unsloth's usual start: every projection, r = 16, alpha = 16.
        Self {
            rank: 16,
            alpha: 16.0,
            target_modules: TARGET_MODULES.map(String::from).to_vec(),
            use_rslora: false,
            dropout: 0.0,
        }
    }
}

impl LoraSettings {
    /// PEFT's form of these settings.
    pub fn spec(&self) -> LoraSpec {
        LoraSpec {
            rank: self.rank,
            alpha: self.alpha,
            target_modules: expand_target_modules(&self.target_modules),
            use_rslora: self.use_rslora,
            dropout: self.dropout,
        }
    }
}

/// Evaluation on held-out data (`[eval]`): the loss the run cannot have trained on, to choose
/// a step by and to see over-fitting.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalSettings {
    /// A file of held-out examples, in any of `data`'s shapes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<PathBuf>,
    /// Or the fraction of `data` held out, drawn with `train.seed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<f64>,
    /// Evaluate every this many steps too; the run always evaluates at its end and at every
    /// checkpoint it saves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every: Option<usize>,
}

impl EvalSettings {
    /// Whether the run evaluates.
    pub fn enabled(&self) -> bool {
        self.data.is_some() || self.split.is_some()
    }
}

/// The dtype a merged model is written in.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum MergedDtype {
    /// The dtype the base folder stores its weights in.
    #[default]
    Auto,
    /// 32-bit floats.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
}

impl MergedDtype {
    /// The dtype to write a model whose base lies in `base_dir` in.
    ///
    /// # Errors
    /// A base folder whose weights cannot be read (for `auto`).
    pub fn resolve(self, base_dir: &Path) -> Result<burn::tensor::DType, kiln_nn::llm::LlmError> {
        use burn::tensor::DType;
        Ok(match self {
            Self::Auto => kiln_nn::llm::stored_dtype(base_dir)?,
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
            Self::F16 => DType::F16,
        })
    }
}

/// Everything `kiln finetune` needs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FinetuneConfig {
    /// The Hugging Face model folder (`config.json`, safetensors, `tokenizer.json`).
    pub model: Option<PathBuf>,
    /// The data file: JSON Lines, a JSON array or Parquet.
    pub data: Option<PathBuf>,
    /// The shape of the data's rows (`auto`: told by each row's keys).
    pub data_format: DataFormat,
    /// A Jinja chat template to use instead of the model folder's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<PathBuf>,
    /// What the loss trains: the completions and assistant turns, or every token.
    pub train_on: TrainOn,
    /// Where the adapters are written, in PEFT's layout, or with `full` the whole model as a
    /// Hugging Face folder (`out` is the same key, as the flag).
    #[serde(alias = "out")]
    pub output: PathBuf,
    /// Full fine-tuning: every weight trains (no adapters), and `output` receives the whole
    /// model in `merged_dtype`.
    pub full: bool,
    /// Where the model with the adapters merged is written as a Hugging Face folder, if
    /// anywhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merged: Option<PathBuf>,
    /// The merged model's dtype: its base's (`auto`), or `f32`, `bf16`, `f16`.
    pub merged_dtype: MergedDtype,
    /// QLoRA: every projection quantised to 4 bits as it is loaded.
    pub load_in_4bit: bool,
    /// The 4-bit code book and scale precision (`[quant]`).
    pub quant: QuantConfig,
    /// Tokens per sequence [default: 256, or the model's max_position_embeddings when fewer].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<usize>,
    /// One example per sequence, padded, or examples packed (best fit, or wrapped).
    pub packing: Packing,
    /// Passes over the data, in place of `train.steps`: the steps are `⌈epochs · sequences /
    /// batch⌉`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epochs: Option<f64>,
    /// The adapters.
    pub lora: LoraSettings,
    /// Periodic checkpoints (`[checkpoint]`: `every`, `keep`), saved with `--save DIR`.
    pub checkpoint: CheckpointConfig,
    /// Held-out evaluation (`[eval]`).
    pub eval: EvalSettings,
    /// Activation checkpointing: each decoder layer's activations recomputed in the backward
    /// (each stage's, under pipeline stages), for one more forward a step.
    pub gradient_checkpointing: bool,
    /// Batches of examples of similar lengths (transformers' `group_by_length`).
    pub group_by_length: bool,
    /// Strategy, devices, steps, batch (sequences per step), learning rate and optimizer
    /// (`[train]`, as `kiln train`'s config; its `model`, `samples` and `checkpoint` are
    /// not used here).
    pub train: TrainConfig,
}

impl Default for FinetuneConfig {
    fn default() -> Self {
        Self {
            model: None,
            data: None,
            data_format: DataFormat::Auto,
            chat_template: None,
            train_on: TrainOn::Completion,
            output: PathBuf::from("finetuned"),
            full: false,
            merged: None,
            merged_dtype: MergedDtype::Auto,
            load_in_4bit: false,
            quant: QuantConfig::new(),
            seq_len: None,
            packing: Packing::Pad,
            epochs: None,
            lora: LoraSettings::default(),
            checkpoint: CheckpointConfig::default(),
            eval: EvalSettings::default(),
            gradient_checkpointing: false,
            group_by_length: false,
            train: TrainConfig {
                steps: 100,
                batch: 8,
                lr: 2e-4,
                // transformers' TrainingArguments default.
                weight_decay: 0.0,
                ..TrainConfig::default()
            },
        }
    }
}

/// A fine-tuning config that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum FinetuneConfigError {
    /// A setting of the training run.
    #[error(transparent)]
    Train(#[from] ConfigError),
    /// The file could not be used.
    #[error(transparent)]
    File(#[from] config_file::ConfigFileError),
    /// A required input is not given.
    #[error("--{0} is required (or `{0} = ...` in --config)")]
    Missing(&'static str),
    /// A `[train]` setting that belongs to `kiln train`.
    #[error(
        "[train] {0} is kiln train's setting; kiln finetune trains the model folder of --model \
         on --data"
    )]
    NotHere(&'static str),
    /// Bad adapter settings.
    #[error(transparent)]
    Lora(#[from] kiln_nn::llm::LlmError),
    /// A merged model to be written over the base it merges.
    #[error(
        "--merged {0} is the --model folder; the merged model replaces its weights, so write it \
         into another folder"
    )]
    MergedIntoBase(PathBuf),
    /// A merged model to be written into the adapters' folder.
    #[error(
        "--merged {0} is the --out folder; the merged model and the adapters each need a folder \
         of their own"
    )]
    MergedIntoAdapters(PathBuf),
    /// A resume whose config differs from the checkpoint's.
    #[error(
        "{path}: the checkpoint was saved by another config: {fields}; resume with the config \
         it was saved with (only steps, where it trains and checkpoint settings may change)"
    )]
    OtherConfig {
        /// The checkpoint's config file.
        path: String,
        /// What differs.
        fields: String,
    },
    /// A checkpoint that cannot be used.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A number of epochs that cannot train.
    #[error("--epochs must be a positive number of passes over the data (at most 10^6), got {0}")]
    Epochs(f64),
    /// A sequence length of zero.
    #[error("--seq-len must be at least 1 (tokens per sequence)")]
    NoSeqLen,
    /// Held-out data given twice.
    #[error(
        "--eval-data and --eval-split both name held-out data; give one (a file of its own, \
         or a fraction of --data)"
    )]
    TwoEvalSets,
    /// Dropout under activation checkpointing.
    #[error(
        "--lora-dropout {0} with --gradient-checkpointing: the recomputed layers would drop \
         other inputs than the forward did, and train on gradients of neither; give one of them"
    )]
    DropoutRecomputed(f64),
    /// Full fine-tuning of a 4-bit base.
    #[error(
        "--full trains every weight, but --load-in-4bit keeps the projections in 4 bits, which \
         do not train; drop one of them (QLoRA is --load-in-4bit without --full)"
    )]
    FullIn4Bit,
    /// Full fine-tuning with a merged model asked for.
    #[error(
        "--full writes the whole model to --out; --merged is for adapters merged into their \
         base; drop --merged (--merged-dtype sets the dtype --full writes)"
    )]
    FullMerged,
    /// Full fine-tuning with adapter settings.
    #[error(
        "--full trains without adapters, but the adapters' settings were given ([lora], \
         --lora-rank, --lora-alpha, --target-modules, --use-rslora, --lora-dropout); drop them"
    )]
    FullWithLora,
    /// A dtype for a model the run does not write.
    #[error(
        "--merged-dtype sets the dtype of the model --merged or --full writes, and the run \
         writes neither; give one of them, or drop --merged-dtype"
    )]
    DtypeOfNoModel,
    /// A logging period of zero steps.
    #[error("--log-every must be at least 1 (steps per --log-file line)")]
    LogEvery,
    /// A held-out fraction that holds out nothing or everything.
    #[error(
        "--eval-split must be a fraction between 0 and 1 (0.1 holds out a tenth of --data), got {0}"
    )]
    EvalSplit(f64),
    /// An evaluation period without held-out data, or of zero steps.
    #[error("--eval-every {0}: {1}")]
    EvalEvery(usize, &'static str),
    /// A sequence length the model cannot take.
    #[error(
        "--seq-len must be between 1 and the model's max_position_embeddings ({max}), got {value}"
    )]
    SeqLen {
        /// The value given.
        value: usize,
        /// The model's limit.
        max: usize,
    },
}

/// The config's file in every checkpoint step `kiln finetune` saves.
pub const CONFIG_FILE: &str = "finetune.toml";

impl FinetuneConfig {
    /// Checks that this config fine-tunes what `checkpoint` was fine-tuned with: every setting
    /// but those a resumed run may change (`train.steps`, unless the learning rate decays over
    /// them; where it trains: `train.world`,
    /// `devices`, `strategy`, `backend` and `parallel`, which the plan's check covers; where it
    /// writes: `output`, `merged`; and `checkpoint`). Where the model folder and the data lie
    /// may change too when the checkpoint recorded their digests, which the resume checks.
    ///
    /// # Errors
    /// [`FinetuneConfigError::OtherConfig`] naming the settings that differ; a checkpoint
    /// without the config or with one that does not parse.
    pub fn check_resumed(&self, checkpoint: &Checkpoint) -> Result<(), FinetuneConfigError> {
        let path = checkpoint.dir().join(CONFIG_FILE).display().to_string();
        let unreadable = |reason: String| FinetuneConfigError::OtherConfig {
            path: path.clone(),
            fields: format!("unreadable: {reason}"),
        };
        let text = std::str::from_utf8(checkpoint.file(CONFIG_FILE)?)
            .map_err(|e| unreadable(e.to_string()))?;
        let saved: FinetuneConfig = toml::from_str(text).map_err(|e| unreadable(e.to_string()))?;
        // A checkpoint that recorded its inputs' digests checks their contents
        // (`Checkpoint::check_inputs`): where they now lie may change. An older one's paths
        // are all there is to compare.
        let digested = !checkpoint.manifest().inputs.is_empty();
        // A decaying schedule spreads over the run's steps (or its epochs, compared as
        // settings): resumed with others, every rate from here on would differ.
        let keep_steps = saved.train.schedule().depends_on_steps()
            && saved.epochs.is_none()
            && self.epochs.is_none();
        let comparable = |c: &FinetuneConfig| {
            let defaults = TrainConfig::default();
            let c = FinetuneConfig {
                model: c.model.clone().filter(|_| !digested),
                data: c.data.clone().filter(|_| !digested),
                chat_template: c.chat_template.clone().filter(|_| !digested),
                output: PathBuf::new(),
                merged: None,
                merged_dtype: MergedDtype::Auto,
                checkpoint: CheckpointConfig::default(),
                // Where the held-out data lies and how often it is read change no step;
                // the fraction held out of --data changes what trains.
                eval: EvalSettings {
                    split: c.eval.split,
                    ..EvalSettings::default()
                },
                // Recomputing changes no gradient.
                gradient_checkpointing: false,
                train: TrainConfig {
                    steps: if keep_steps { c.train.steps } else { 0 },
                    world: None,
                    devices: None,
                    strategy: defaults.strategy,
                    backend: defaults.backend,
                    parallel: defaults.parallel,
                    ..c.train.clone()
                },
                ..c.clone()
            };
            toml::Value::try_from(c).map_err(|e| unreadable(e.to_string()))
        };
        let fields = config_differences(&comparable(&saved)?, &comparable(self)?);
        if fields.is_empty() {
            return Ok(());
        }
        Err(FinetuneConfigError::OtherConfig {
            path,
            fields: format!("{} differ", fields.join(", ")),
        })
    }

    /// Reads a TOML config; missing fields take their defaults.
    ///
    /// # Errors
    /// When the file cannot be read or parsed (unknown fields included).
    pub fn load(path: &Path) -> Result<Self, FinetuneConfigError> {
        Ok(config_file::load(path)?)
    }

    /// The model folder.
    ///
    /// # Errors
    /// When none is given.
    pub fn model_dir(&self) -> Result<&Path, FinetuneConfigError> {
        self.model
            .as_deref()
            .ok_or(FinetuneConfigError::Missing("model"))
    }

    /// The data file.
    ///
    /// # Errors
    /// When none is given.
    pub fn data_file(&self) -> Result<&Path, FinetuneConfigError> {
        self.data
            .as_deref()
            .ok_or(FinetuneConfigError::Missing("data"))
    }

    /// Checks what can be checked before the model folder is read.
    ///
    /// # Errors
    /// The first problem found.
    pub fn validate(&self) -> Result<(), FinetuneConfigError> {
        self.model_dir()?;
        self.data_file()?;
        let defaults = TrainConfig::default();
        if self.train.model != defaults.model {
            return Err(FinetuneConfigError::NotHere("model"));
        }
        if self.train.samples != defaults.samples {
            return Err(FinetuneConfigError::NotHere("samples"));
        }
        if self.train.checkpoint != defaults.checkpoint {
            return Err(FinetuneConfigError::NotHere("checkpoint"));
        }
        self.train.validate()?;
        self.lora.spec().validate()?;
        if self.merged_dtype != MergedDtype::Auto && self.merged.is_none() && !self.full {
            return Err(FinetuneConfigError::DtypeOfNoModel);
        }
        if self.full {
            if self.load_in_4bit {
                return Err(FinetuneConfigError::FullIn4Bit);
            }
            if self.merged.is_some() {
                return Err(FinetuneConfigError::FullMerged);
            }
            if self.lora != LoraSettings::default() {
                return Err(FinetuneConfigError::FullWithLora);
            }
        }
        if self.seq_len == Some(0) {
            return Err(FinetuneConfigError::NoSeqLen);
        }
        if let Some(epochs) = self.epochs.filter(|e| !(*e > 0.0 && *e <= 1e6)) {
            return Err(FinetuneConfigError::Epochs(epochs));
        }
        if self.gradient_checkpointing && self.lora.dropout > 0.0 {
            return Err(FinetuneConfigError::DropoutRecomputed(self.lora.dropout));
        }
        let eval = &self.eval;
        if eval.data.is_some() && eval.split.is_some() {
            return Err(FinetuneConfigError::TwoEvalSets);
        }
        if let Some(split) = eval.split.filter(|f| !(*f > 0.0 && *f < 1.0)) {
            return Err(FinetuneConfigError::EvalSplit(split));
        }
        match eval.every {
            Some(0) => Err(FinetuneConfigError::EvalEvery(
                0,
                "give a number of steps from 1",
            )),
            Some(n) if !eval.enabled() => Err(FinetuneConfigError::EvalEvery(
                n,
                "there is nothing to evaluate; give --eval-data FILE or --eval-split FRACTION",
            )),
            _ => Ok(()),
        }
    }

    /// The steps of `epochs` passes over `sequences` sequences, when epochs are given.
    pub fn steps_for(&self, sequences: usize) -> Option<usize> {
        let per_step = self.train.batch.max(1) as f64;
        self.epochs
            .map(|e| ((e * sequences as f64 / per_step).ceil() as usize).max(1))
    }

    /// The sequence length when none is given: QLoRA recipes' usual short sequences, or the
    /// model's positions when it has fewer.
    pub const DEFAULT_SEQ_LEN: usize = 256;

    /// Tokens per sequence: as given, or the default ([`Self::fit_model`] fits it to the
    /// model).
    pub fn seq_len(&self) -> usize {
        self.seq_len.unwrap_or(Self::DEFAULT_SEQ_LEN)
    }

    /// Fits the settings to the model's config: a sequence length not given becomes the
    /// default or the model's positions, whichever is fewer; one given must fit them.
    ///
    /// # Errors
    /// A sequence longer than the model's positions.
    pub fn fit_model(&mut self, model: &LlmConfig) -> Result<(), FinetuneConfigError> {
        self.lora.spec().check_model(model)?;
        let max = model.max_position_embeddings;
        let seq_len = self.seq_len.unwrap_or(Self::DEFAULT_SEQ_LEN.min(max));
        if seq_len > max {
            return Err(FinetuneConfigError::SeqLen {
                value: seq_len,
                max,
            });
        }
        self.seq_len = Some(seq_len);
        Ok(())
    }
}
