//! How `fit` trains a model in bf16 or f16: the model's [`LowPrecision`] capability wraps it
//! in [`MixedPrecision`] for the run and hands back the f32 model inside.
//!
//! [`LowPrecision`]: crate::model::ParallelModel::LowPrecision

use burn::module::{AutodiffModule, ModuleDisplay};
use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

use super::hooks::FitHooks;
use super::record::{FitError, FitRecord};
use super::run::{Run, fit_as_is};
use crate::checkpoint::CheckpointError;
use crate::data::DataSource;
use crate::model::{LowPrecisionStep, ParallelModel, Supported, TrainModel, Unsupported};
use crate::optim::{MixedPrecision, OptimizerState};
use crate::strategy::{ConfigError, OptimizerSpec, StepOutput, StrategyKind, StrategyModel};
use crate::tensor_parallel::TpBackend;

/// A model [`fit`](super::fit) trains under any plan its declaration allows: a
/// [`StrategyModel`] whose precision capability holds too (implemented for all of them).
pub trait FitModel<B: AutodiffBackend + TpBackend>:
    StrategyModel<B> + ParallelModel<B, LowPrecision: PrecisionSupport<B, Self>>
{
}

impl<B, M> FitModel<B> for M
where
    B: AutodiffBackend + TpBackend,
    M: StrategyModel<B> + ParallelModel<B, LowPrecision: PrecisionSupport<B, M>>,
{
}

/// How a capability trains in bf16 or f16 (see [`ParallelModel::LowPrecision`]). Only Kiln
/// calls it.
#[allow(private_interfaces)]
pub trait PrecisionSupport<B: AutodiffBackend + TpBackend, M: TrainModel<B>> {
    /// Runs `run` with `model` wrapped in mixed precision; returns it unwrapped.
    #[doc(hidden)]
    fn fit_low<S: OptimizerSpec<B>, I: Send + 'static>(
        run: Run<'_, '_, B, S, M>,
        devices: Vec<B::Device>,
        model: M,
        data: DataSource<B, I, M::Input>,
    ) -> Result<(M, FitRecord), FitError>;
}

#[allow(private_interfaces)]
impl<B, M> PrecisionSupport<B, M> for Supported
where
    B: AutodiffBackend + TpBackend,
    M: TrainModel<B> + LowPrecisionStep<B> + ModuleDisplay,
    <M as AutodiffModule<B>>::InnerModule: ModuleDisplay,
    MixedPrecision<B, M>: StrategyModel<B> + TrainStep<Input = M::Input, Output = M::Output>,
{
    fn fit_low<S: OptimizerSpec<B>, I: Send + 'static>(
        run: Run<'_, '_, B, S, M>,
        devices: Vec<B::Device>,
        model: M,
        data: DataSource<B, I, M::Input>,
    ) -> Result<(M, FitRecord), FitError> {
        let mut wrapped = MixedPrecision::new(model, run.optim.precision());
        if let Some(scale) = run.optim.loss_scale() {
            wrapped = wrapped.with_loss_scale(scale.clone());
        }
        // One rank, one micro-batch: the optimizer is the gradients' only reader.
        let alone = run.plan.strategy() == StrategyKind::Single
            && run.plan.world_size() == 1
            && run.plan.grad_accumulation() == 1;
        if alone && run.optim.reads_low_precision_grads() {
            tracing::debug!("mixed precision hands the optimizer its gradients uncast");
            wrapped = wrapped.with_low_precision_grads();
        }
        // The optimizer's copies of the parameters: written only where this one model reads them.
        let copies = run.optim.low_copies().cloned();
        if let Some(copies) = &copies {
            copies.set_on(alone);
            wrapped = wrapped.with_low_copies(copies.clone());
        }
        let Run {
            plan,
            training,
            optim,
            hooks,
            backend,
        } = run;
        // Replicas that split their state keep the others' parameters in the dtype this model
        // computes in, not as f32 masters.
        let plan = plan.clone().computing_in(optim.precision().dtype());
        let mut unwrapped = Unwrapped(hooks);
        let run = Run {
            plan: &plan,
            training,
            optim,
            hooks: &mut unwrapped,
            backend,
        };
        let fitted = fit_as_is(run, devices, wrapped, data);
        // The copies (a compute-dtype copy of the whole model, a LoRA base's included) are
        // let go with the run, not kept for as long as the optimizer's spec lives.
        if let Some(copies) = copies {
            copies.set_on(false);
        }
        let (trained, record) = fitted?;
        Ok((trained.model, record))
    }
}

#[allow(private_interfaces)]
impl<B, M> PrecisionSupport<B, M> for Unsupported
where
    B: AutodiffBackend + TpBackend,
    M: TrainModel<B>,
{
    fn fit_low<S: OptimizerSpec<B>, I: Send + 'static>(
        run: Run<'_, '_, B, S, M>,
        _: Vec<B::Device>,
        _: M,
        _: DataSource<B, I, M::Input>,
    ) -> Result<(M, FitRecord), FitError> {
        Err(ConfigError::Unsupported {
            strategy: format!("precision {}", run.optim.precision()),
            contract: "LowPrecisionStep",
            capability: "LowPrecision",
        }
        .into())
    }
}

/// The hooks of a model, called with that model wrapped in [`MixedPrecision`]: a save gets
/// the f32 model inside, as a run in f32 would have saved it.
struct Unwrapped<'h, M>(&'h mut dyn FitHooks<M>);

impl<B: AutodiffBackend, M: TrainModel<B>> FitHooks<MixedPrecision<B, M>> for Unwrapped<'_, M> {
    fn step(&mut self, step: usize, out: &StepOutput) {
        self.0.step(step, out);
    }

    fn save(
        &mut self,
        step: usize,
        model: MixedPrecision<B, M>,
        optimizer: &OptimizerState,
    ) -> Result<(), CheckpointError> {
        self.0.save(step, model.model, optimizer)
    }

    fn eval(&mut self, step: usize, model: MixedPrecision<B, M>) {
        self.0.eval(step, model.model);
    }
}
