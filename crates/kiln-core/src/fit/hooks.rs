//! What the loop calls back while it trains: after every step, at every periodic save and
//! evaluation.

use std::marker::PhantomData;

use burn::module::Module;
use burn::tensor::backend::Backend;

use crate::checkpoint::{CheckpointError, Saver};
use crate::optim::OptimizerState;
use crate::strategy::StepOutput;

/// What [`fit`](super::fit) calls back while it trains. A closure `FnMut(usize, &StepOutput)` is the
/// hooks of a run that only watches its steps.
pub trait FitHooks<M> {
    /// Step `step` (1-based) ended with `out`.
    fn step(&mut self, step: usize, out: &StepOutput);

    /// A periodic save is due ([`Training::save_every`](super::Training::save_every)): `model` and `optimizer` are the
    /// whole model and the strategy's optimizer state after `step` steps.
    ///
    /// # Errors
    /// A save that failed; the run stops with it.
    fn save(
        &mut self,
        step: usize,
        model: M,
        optimizer: &OptimizerState,
    ) -> Result<(), CheckpointError> {
        let _ = (step, model, optimizer);
        Ok(())
    }

    /// An evaluation is due ([`Training::eval_every`](super::Training::eval_every)): `model` is the whole model after
    /// `step` steps, as [`FitHooks::save`] would get it. Every process gets it (gathering it
    /// is a collective); which of them evaluates is the hooks' choice.
    fn eval(&mut self, step: usize, model: M) {
        let _ = (step, model);
    }
}

impl<M, F: FnMut(usize, &StepOutput)> FitHooks<M> for F {
    fn step(&mut self, step: usize, out: &StepOutput) {
        self(step, out);
    }
}

/// Hooks that hand every step to a closure and every periodic save to a [`Saver`] (none: the
/// saves are skipped).
pub struct SaveHooks<'a, B, F> {
    on_step: F,
    saver: Option<&'a mut Saver>,
    backend: PhantomData<B>,
}

impl<'a, B, F: FnMut(usize, &StepOutput)> SaveHooks<'a, B, F> {
    /// Hooks calling `on_step` after every step and `saver` for every save.
    pub fn new(on_step: F, saver: Option<&'a mut Saver>) -> Self {
        Self {
            on_step,
            saver,
            backend: PhantomData,
        }
    }
}

impl<B: Backend, M: Module<B>, F: FnMut(usize, &StepOutput)> FitHooks<M> for SaveHooks<'_, B, F> {
    fn step(&mut self, step: usize, out: &StepOutput) {
        (self.on_step)(step, out);
    }

    fn save(
        &mut self,
        step: usize,
        model: M,
        optimizer: &OptimizerState,
    ) -> Result<(), CheckpointError> {
        match self.saver.as_deref_mut() {
            Some(saver) => saver.save::<B, M>(step, model, optimizer).map(drop),
            None => Ok(()),
        }
    }
}
