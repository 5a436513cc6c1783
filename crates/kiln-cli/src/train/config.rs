//! The `kiln train` job as a config: TOML-loadable, every field defaulted; flags override.

use std::path::Path;

use kiln_core::optim::{GuardConfigError, PerformanceConfig};
use kiln_core::strategy::{StrategyConfigs, StrategyKind};

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
    /// Which strategy (`auto` resolves from the world size).
    pub strategy: StrategyKind,
    /// Which backend.
    pub backend: BackendKind,
    /// Ranks (devices; on the CPU, threads sharing the CPU).
    pub world: usize,
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
    /// AdamW learning rate.
    pub lr: f64,
    /// Samples in the synthetic data set.
    pub samples: usize,
    /// Settings of every strategy (`[parallel.ddp]`, `[parallel.pipeline]`, …), as the
    /// strategy builder takes them.
    pub parallel: StrategyConfigs,
    /// What runs between the gradient synchronisation and AdamW (`[optimizer]`: `clip_norm`,
    /// `nan_policy`).
    pub optimizer: PerformanceConfig,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            model: ModelKind::Mlp,
            strategy: StrategyKind::Auto,
            backend: BackendKind::Flex,
            world: 1,
            devices: None,
            steps: 300,
            batch: 64,
            seed: 42,
            lr: 3e-3,
            samples: 8192,
            parallel: StrategyConfigs::default(),
            optimizer: PerformanceConfig::default(),
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
    /// Global batch smaller than the world.
    #[error(
        "--batch {batch} is smaller than --world {world}: every rank needs at least one sample per step"
    )]
    BatchSmallerThanWorld {
        /// Global batch.
        batch: usize,
        /// Ranks.
        world: usize,
    },
    /// The strategy cannot run on that many ranks.
    #[error(transparent)]
    Strategy(#[from] kiln_core::strategy::ConfigError),
    /// `devices` and `world` disagree, or `devices` is empty.
    #[error(transparent)]
    Devices(#[from] DeviceError),
    /// The `[optimizer]` settings cannot work.
    #[error(transparent)]
    Optimizer(#[from] GuardConfigError),
    /// A learning rate that cannot train.
    #[error("--lr must be a positive finite number, got {0}")]
    LearningRate(f64),
}

impl TrainConfig {
    /// Where the ranks run.
    ///
    /// # Errors
    /// When `devices` is empty or disagrees with `world`.
    pub fn placement(&self) -> Result<Placement, DeviceError> {
        Placement::new(self.world, self.devices.as_deref())
    }

    /// Reads a TOML config; missing fields take their defaults.
    ///
    /// # Errors
    /// When the file cannot be read or parsed (unknown fields included).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Ok(config_file::load(path)?)
    }

    /// Checks what the strategies cannot check before training starts.
    ///
    /// # Errors
    /// The first problem found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.world == 0 {
            return Err(ConfigError::ZeroWorld);
        }
        if self.batch < self.world {
            return Err(ConfigError::BatchSmallerThanWorld {
                batch: self.batch,
                world: self.world,
            });
        }
        self.placement()?;
        self.parallel.check_world(self.strategy, self.world)?;
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(ConfigError::LearningRate(self.lr));
        }
        self.optimizer.validate()?;
        self.optimizer
            .check_strategy(self.strategy.resolve(self.world).kind)?;
        Ok(())
    }
}
