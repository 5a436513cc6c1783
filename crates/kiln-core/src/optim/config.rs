//! What the [`PerformanceOptimizer`](super::PerformanceOptimizer) does between the gradient
//! synchronisation and the optimizer step: its configuration, builder-style and serde.

use serde::{Deserialize, Serialize};

use super::{GuardConfigError, LossScaleConfig, Precision};

/// What to do when a loss or gradient is not finite (NaN or ±Inf).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NanPolicy {
    /// Every rank skips the step: no parameter and no optimizer state changes, so the replicas
    /// stay identical, and training goes on with the next batch.
    Skip,
    /// Every rank returns the same error, naming the parameter, the rank and the step.
    #[default]
    Halt,
}

impl NanPolicy {
    /// Every policy, in the order help texts list them.
    pub const ALL: [NanPolicy; 2] = [NanPolicy::Skip, NanPolicy::Halt];
    /// Their names, in the same order.
    pub const ALL_NAMES: [&'static str; 2] = ["skip", "halt"];

    /// The policy's name in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            NanPolicy::Skip => "skip",
            NanPolicy::Halt => "halt",
        }
    }
}

impl std::fmt::Display for NanPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for NanPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        NanPolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown nan_policy {s:?}; use {}",
                    NanPolicy::ALL_NAMES.join(" or ")
                )
            })
    }
}

/// Configuration of a [`PerformanceOptimizer`](super::PerformanceOptimizer).
///
/// ```
/// use kiln_core::optim::{NanPolicy, PerformanceConfig};
/// let config = PerformanceConfig::new()
///     .with_clip_norm(Some(1.0))
///     .with_nan_policy(NanPolicy::Skip);
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PerformanceConfig {
    /// Largest global gradient norm: when the L2 norm over every gradient of the whole model
    /// (all ranks, all shards) exceeds it, every gradient is scaled by `clip_norm / norm`, as
    /// PyTorch's `clip_grad_norm_`. `None`: no clipping (the norm is still reported).
    pub clip_norm: Option<f64>,
    /// What a non-finite loss or gradient does.
    pub nan_policy: NanPolicy,
    /// The compute precision. Strategies do not read it: a program applies it by wrapping
    /// the model in [`MixedPrecision`](super::MixedPrecision), as `kiln train` does.
    pub precision: Precision,
    /// The dynamic loss scale used with `precision = "f16"` (`[optimizer.loss_scale]`).
    pub loss_scale: LossScaleConfig,
}

impl Default for PerformanceConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl PerformanceConfig {
    /// No clipping; a non-finite value halts training.
    pub fn new() -> Self {
        Self {
            clip_norm: None,
            nan_policy: NanPolicy::Halt,
            precision: Precision::F32,
            loss_scale: LossScaleConfig::default(),
        }
    }

    /// Sets [`Self::clip_norm`].
    pub fn with_clip_norm(mut self, clip_norm: Option<f64>) -> Self {
        self.clip_norm = clip_norm;
        self
    }

    /// Sets [`Self::precision`].
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// Sets [`Self::nan_policy`].
    pub fn with_nan_policy(mut self, nan_policy: NanPolicy) -> Self {
        self.nan_policy = nan_policy;
        self
    }

    /// Checks that the settings can work.
    ///
    /// # Errors
    /// [`GuardConfigError`] naming the bad setting.
    pub fn validate(&self) -> Result<(), GuardConfigError> {
        if let Some(clip) = self.clip_norm
            && !(clip > 0.0 && clip.is_finite())
        {
            return Err(GuardConfigError::ClipNorm(clip));
        }
        self.loss_scale.validate()
    }
}
