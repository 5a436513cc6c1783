//! The PerformanceOptimizer's flags, shared by `kiln train` and `kiln ad train`.

use kiln_core::optim::{NanPolicy, PerformanceConfig, Precision};

use crate::names::{nan_policy_parser, precision_parser};

/// `--clip-norm`, `--nan-policy`, `--precision`: each overrides the same field of
/// `[optimizer]`.
#[derive(clap::Args, Debug)]
pub struct OptimizerArgs {
    /// Clip the gradients to this global L2 norm over the whole model, all ranks and stages
    /// together, as PyTorch's clip_grad_norm_ [default: no clipping].
    #[arg(long, allow_negative_numbers = true)]
    clip_norm: Option<f64>,
    /// What a NaN or infinite loss or gradient does: `skip` the step on every rank, or `halt`
    /// with a report naming the parameter, the rank and the step [default: halt].
    #[arg(long, value_parser = nan_policy_parser())]
    nan_policy: Option<NanPolicy>,
    /// Compute precision: `bf16` or `f16` (with a dynamic loss scale) keep f32 master weights
    /// [default: f32].
    #[arg(long, value_parser = precision_parser())]
    precision: Option<Precision>,
}

impl OptimizerArgs {
    /// Applies the flags to `config`.
    pub fn apply(&self, config: &mut PerformanceConfig) {
        if let Some(clip) = self.clip_norm {
            config.clip_norm = Some(clip);
        }
        if let Some(policy) = self.nan_policy {
            config.nan_policy = policy;
        }
        if let Some(precision) = self.precision {
            config.precision = precision;
        }
    }
}
