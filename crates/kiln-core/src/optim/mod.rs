//! The `PerformanceOptimizer`: what every strategy runs between the gradient synchronisation
//! and the optimizer step.
//!
//! - **Global-norm clipping**: one L2 norm over every gradient of the whole model, over all
//!   ranks and pipeline stages, equal to single-device clipping at the same global batch
//!   (Burn's own `GradientClipping::Norm` clips each tensor by its own norm).
//! - **NaN/Inf guard**: a non-finite loss or gradient is found in the same pass that computes
//!   the norm, reported with the parameter's module path, the rank and the step, and either
//!   skipped by every rank at once or returned as the same error by every rank.
//!
//! - **Mixed precision**: [`MixedPrecision`] trains a model in bf16 or f16 with f32 master
//!   weights; for f16 a [`LossScale`] shared with the optimizer scales the loss and is
//!   adjusted by the guard.
//! - **Learning-rate schedules**: [`LrSchedule`], warm-up then constant, linear or cosine decay
//!   by transformers' formulas, a pure function of the step.
//! - **Optimizer state**: [`OptimizerState`], what a strategy's optimizers hold, saved and
//!   loaded so that a resumed run continues bit for bit.
//!
//! Per-rank findings ride in the gradient all-reduce's last bucket, so the guard adds no
//! collective call to replicated strategies. The pipeline and `Tensor`, whose ranks hold
//! different parameters and share no all-reduce, add one small call over the world per step. See the book's page on the PerformanceOptimizer.

mod config;
mod config_error;
mod guard;
mod guarded;
mod inspect;
mod performance;
mod precision;
mod precision_cast;
mod precision_parallel;
mod report;
mod scaler;
mod schedule;
mod state;
pub(crate) mod step;

pub use config::{NanPolicy, PerformanceConfig};
pub use config_error::GuardConfigError;
pub use guard::{Guard, GuardReport};
pub(crate) use guard::{Local, Settled};
pub use guarded::GuardedOptimizer;
pub(crate) use inspect::{param_path, total_squares};
pub use performance::PerformanceOptimizer;
pub use precision::{MixedPrecision, Precision};
pub use report::{NonFinite, NonFiniteValue};
pub use scaler::{LossScale, LossScaleConfig};
pub use schedule::{LrDecay, LrSchedule, ScheduleError};
pub use state::{OptimizerState, StateError, StateLayout};
pub(crate) use state::{decode, encode, recorder, tensor_bytes};
