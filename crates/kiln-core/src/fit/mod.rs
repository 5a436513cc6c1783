//! The training loop programs share: build the strategy the plan names, step it over
//! epoch-shuffled global batches, and say what happened.
//!
//! `kiln train`, the Algorithm Distillation job and the strategy benchmark all train through
//! [`fit`]; what they print and save around it is theirs.

mod hooks;
mod precision;
mod record;
mod run;
mod training;

use std::marker::PhantomData;

use burn::tensor::backend::AutodiffBackend;

use crate::data::DataSource;
use crate::optim::Precision;
use crate::plan::Plan;
use crate::strategy::OptimizerSpec;
use crate::tensor_parallel::TpBackend;
pub use hooks::{FitHooks, SaveHooks};
pub use precision::{FitModel, PrecisionSupport};
pub use record::{FitError, FitRecord};
use run::{Run, fit_as_is};
pub use training::{Resume, Training};

/// Trains `model` on `data` as `plan` says, over `devices` (one per rank of the plan), in the
/// precision `optim`'s configuration names (bf16 and f16 wrap the model in
/// [`MixedPrecision`](crate::optim::MixedPrecision)), calling `hooks` after every step (1-based) and every
/// [`Training::save_every`] steps; returns the trained whole model.
///
/// # Errors
/// A plan the model cannot run (refused from its [`ParallelModel`](crate::model::ParallelModel) declaration), a global
/// batch the data cannot fill, or what the strategy reports.
pub fn fit<B, M, S, I>(
    plan: &Plan,
    training: &Training<'_>,
    devices: Vec<B::Device>,
    model: M,
    optim: &S,
    data: DataSource<B, I, M::Input>,
    hooks: &mut dyn FitHooks<M>,
) -> Result<(M, FitRecord), FitError>
where
    B: AutodiffBackend + TpBackend,
    M: FitModel<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    tracing::info!(strategy = %plan.strategy(), "plan: {plan}");
    let run = Run {
        plan,
        training,
        optim,
        hooks,
        backend: PhantomData,
    };
    match optim.precision() {
        Precision::F32 => fit_as_is(run, devices, model, data),
        _ => <M::LowPrecision as PrecisionSupport<B, M>>::fit_low(run, devices, model, data),
    }
}
