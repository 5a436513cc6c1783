//! The `kiln train` job as a config: TOML-loadable, every field defaulted; flags override.

use std::path::Path;

use kiln_core::checkpoint::{Checkpoint, CheckpointConfig, config_differences};
use kiln_core::optim::{GuardConfigError, LrDecay, LrSchedule, PerformanceConfig, ScheduleError};
use kiln_core::plan::Plan;
use kiln_core::strategy::{StrategyConfigs, StrategyKind};
use kiln_kernels::FusedAdamWConfig;

use crate::backend::{BackendKind, DeviceError, Placement};
use crate::config_file::{self, ConfigFileError};

/// A built-in model.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// An MLP classifier on a random linear teacher's labels.
    #[default]
    Mlp,
    /// A small causal transformer on Fibonacci sequences modulo 16.
    Transformer,
}

/// Everything `kiln train` needs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Which built-in model to train.
    pub model: ModelKind,
    /// Its blocks (the transformer's) or hidden layers (the MLP's), where not its own (2):
    /// what pipeline stages split.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<usize>,
    /// Which strategy (`auto` resolves from the world size).
    pub strategy: StrategyKind,
    /// Which backend.
    pub backend: BackendKind,
    /// Ranks (devices; on the CPU, threads sharing the CPU); unset lets the plan choose
    /// (`auto` on the CPU: its cores).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub world: Option<usize>,
    /// The device of each rank (`devices = [0, 0]`); `world` must equal its length. Without
    /// it, CPU ranks share the CPU and CUDA ranks take GPUs `0..world`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<usize>>,
    /// Optimizer steps.
    pub steps: usize,
    /// Global batch: samples per optimizer step over all ranks.
    pub batch: usize,
    /// Seed of the model, the data and the sample order.
    pub seed: u64,
    /// AdamW's peak learning rate.
    pub lr: f64,
    /// What the rate does after the warm-up: `constant`, `linear` or `cosine` (to zero at the
    /// last step).
    pub lr_scheduler: LrDecay,
    /// Steps of linear warm-up from 0 to `lr`.
    pub warmup_steps: usize,
    /// Or the warm-up as a fraction of `steps`.
    pub warmup_ratio: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Samples in the synthetic data set.
    pub samples: usize,
    /// Settings of every strategy (`[parallel.ddp]`, `[parallel.pipeline]`, …), as the
    /// strategy builder takes them.
    pub parallel: StrategyConfigs,
    /// What runs between the gradient synchronisation and AdamW (`[optimizer]`: `clip_norm`,
    /// `nan_policy`).
    pub optimizer: PerformanceConfig,
    /// How often `--save` saves, and how many saves it keeps (`[checkpoint]`: `every`,
    /// `keep`).
    pub checkpoint: CheckpointConfig,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            model: ModelKind::Mlp,
            layers: None,
            strategy: StrategyKind::Auto,
            backend: BackendKind::Flex,
            world: None,
            devices: None,
            steps: 300,
            batch: 64,
            seed: 42,
            lr: 3e-3,
            lr_scheduler: LrDecay::Constant,
            warmup_steps: 0,
            warmup_ratio: 0.0,
            // Burn's AdamW default.
            weight_decay: 1e-4,
            samples: 8192,
            parallel: StrategyConfigs::default(),
            optimizer: PerformanceConfig::default(),
            checkpoint: CheckpointConfig::default(),
        }
    }
}

/// A config that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML file could not be used.
    #[error(transparent)]
    File(#[from] ConfigFileError),
    /// World of zero ranks.
    #[error("--world must be at least 1")]
    ZeroWorld,
    /// The plan cannot run.
    #[error(transparent)]
    Strategy(#[from] kiln_core::strategy::ConfigError),
    /// A flag the strategy does not read.
    #[error(transparent)]
    Flag(#[from] crate::parallel_args::FlagError),
    /// `devices` and `world` disagree, or `devices` is empty.
    #[error(transparent)]
    Devices(#[from] DeviceError),
    /// The `[optimizer]` settings cannot work.
    #[error(transparent)]
    Optimizer(#[from] GuardConfigError),
    /// A count outside what the run can hold.
    #[error("--{flag} must be between {min} and {max}, got {value}")]
    OutOfRange {
        /// The flag (and config field).
        flag: &'static str,
        /// The value given.
        value: usize,
        /// The least allowed.
        min: usize,
        /// The most allowed.
        max: usize,
    },
    /// A resumed run whose config is not the checkpoint's.
    #[error(
        "the checkpoint {path} was trained with another config ({fields}); resume with the \
         config and flags that saved it (only --steps, where it trains and the checkpoint \
         settings may change)"
    )]
    OtherConfig {
        /// The checkpoint's config file.
        path: String,
        /// What differs.
        fields: String,
    },
    /// A checkpoint setting that cannot work.
    #[error(transparent)]
    Checkpoint(#[from] kiln_core::checkpoint::CheckpointError),
    /// `auto` could not measure the model, or the processes could not plan together.
    #[error("auto could not plan the run: {0}; name a --strategy to skip planning")]
    Measure(String),
    /// A learning rate that cannot train.
    #[error("--lr must be a positive finite number, got {0}")]
    LearningRate(f64),
    /// A weight decay that cannot train.
    #[error("--weight-decay must be a finite number at least 0, got {0}")]
    WeightDecay(f64),
    /// A schedule that cannot run.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
}

impl ModelKind {
    /// The model's name in checkpoints and reports.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Transformer => "transformer",
        }
    }
}

/// The config's file in every checkpoint step `kiln train` saves.
pub const CONFIG_FILE: &str = "config.toml";

impl TrainConfig {
    /// Checks that this config trains what `checkpoint` was trained with: every setting but
    /// those a resumed run may change (`steps`, unless the learning rate decays over them;
    /// where it trains: `world`, `devices`,
    /// `strategy`, `backend` and `parallel`, which the plan's check covers, and `checkpoint`).
    ///
    /// # Errors
    /// [`ConfigError::OtherConfig`] naming the settings that differ; a checkpoint without the
    /// config or with one that does not parse.
    pub fn check_resumed(&self, checkpoint: &Checkpoint) -> Result<(), ConfigError> {
        let path = checkpoint.dir().join(CONFIG_FILE).display().to_string();
        let unreadable = |reason: String| ConfigError::OtherConfig {
            path: path.clone(),
            fields: format!("unreadable: {reason}"),
        };
        let text = std::str::from_utf8(checkpoint.file(CONFIG_FILE)?)
            .map_err(|e| unreadable(e.to_string()))?;
        let saved: TrainConfig = toml::from_str(text).map_err(|e| unreadable(e.to_string()))?;
        // A decaying schedule spreads over the run's steps: resumed with others, every rate
        // from here on would differ from the run that saved.
        let keep_steps = saved.schedule().depends_on_steps();
        let comparable = |c: &TrainConfig| {
            let c = TrainConfig {
                steps: if keep_steps { c.steps } else { 0 },
                world: None,
                devices: None,
                strategy: StrategyKind::Auto,
                backend: BackendKind::Flex,
                parallel: StrategyConfigs::default(),
                checkpoint: CheckpointConfig::default(),
                ..c.clone()
            };
            toml::Value::try_from(c).map_err(|e| unreadable(e.to_string()))
        };
        let fields = config_differences(&comparable(&saved)?, &comparable(self)?);
        if fields.is_empty() {
            return Ok(());
        }
        Err(ConfigError::OtherConfig {
            path,
            fields: format!("{} differ", fields.join(", ")),
        })
    }

    /// The most samples the synthetic data sets hold.
    pub const MAX_SAMPLES: usize = 1 << 22;

    /// The most blocks a built-in model is built with: far past what its small synthetic
    /// tasks need, and few enough that a typo cannot build a model of millions of layers.
    pub const MAX_LAYERS: usize = 256;

    /// Where this process's ranks of `plan` run.
    ///
    /// # Errors
    /// When `devices` is empty or disagrees with the plan's ranks.
    pub fn placement(&self, plan: &Plan) -> Result<Placement, DeviceError> {
        Ok(Placement::new(plan.local_ranks(), self.devices.as_deref())?
            .for_local_process(plan.process().local_rank))
    }

    /// Reads a TOML config; missing fields take their defaults.
    ///
    /// # Errors
    /// When the file cannot be read or parsed (unknown fields included).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Ok(config_file::load(path)?)
    }

    /// Checks the settings the plan does not read.
    ///
    /// # Errors
    /// The first problem found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.world == Some(0) {
            return Err(ConfigError::ZeroWorld);
        }
        // The synthetic data set is built in memory; 2^22 samples is 512 MiB of MLP features.
        for (flag, value, min, max) in [
            ("steps", self.steps, 1, usize::MAX),
            ("batch", self.batch, 1, Self::MAX_SAMPLES),
            ("samples", self.samples, 1, Self::MAX_SAMPLES),
            ("layers", self.layers.unwrap_or(1), 1, Self::MAX_LAYERS),
        ] {
            if !(min..=max).contains(&value) {
                return Err(ConfigError::OutOfRange {
                    flag,
                    value,
                    min,
                    max,
                });
            }
        }
        self.checkpoint.validate()?;
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(ConfigError::LearningRate(self.lr));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return Err(ConfigError::WeightDecay(self.weight_decay));
        }
        self.schedule().validate()?;
        self.optimizer.validate()?;
        Ok(())
    }

    /// The learning-rate schedule.
    pub fn schedule(&self) -> LrSchedule {
        LrSchedule {
            decay: self.lr_scheduler,
            warmup_steps: self.warmup_steps,
            warmup_ratio: self.warmup_ratio,
        }
    }

    /// The learning rate of step `step` (0-based).
    pub fn lr_at(&self, step: usize) -> f64 {
        self.lr * self.schedule().factor(step, self.steps)
    }

    /// AdamW with this run's weight decay, fused into one launch per step on a GPU.
    pub fn adamw(&self) -> FusedAdamWConfig {
        FusedAdamWConfig::new().with_weight_decay(self.weight_decay as f32)
    }
}

/// How `auto` lays out a run's ranks.
#[derive(Debug, Clone, Copy)]
pub enum AutoPlan<'a> {
    /// With the built-in model measured here, on the layout of the checkpoint the run resumes
    /// from, if any.
    Measured {
        /// The checkpoint the run resumes from.
        resume: Option<&'a Path>,
    },
    /// A replica per rank: the run's model is not one the planner builds (`kiln finetune`'s).
    Replicas,
}
