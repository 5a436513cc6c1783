//! What `kiln finetune` does between steps: the progress bar, the log, the evaluations and
//! the checkpoints' saves.

use std::cell::{Cell, RefCell};

use burn::tensor::backend::AutodiffBackend;
use kiln_core::checkpoint::{CheckpointError, Saver};
use kiln_core::fit::FitHooks;
use kiln_core::optim::OptimizerState;
use kiln_core::strategy::StepOutput;
use kiln_nn::llm::{CausalLm, LoraAdapters};
use kiln_nn::tensor_parallel::ShardedBackend;

use super::eval::Evaluator;
use super::log::RunLog;

/// The run's hooks: every step to `on_step`, every save of the adapters (the whole model
/// under full fine-tuning) and the optimizer state to `saver` (none: saves are skipped), every evaluation and every save's model to
/// the evaluator (none: the run does not evaluate, or another process does), which evaluates
/// on the device given and shows the loss in the cell `on_step` reads.
pub(super) struct RunSaves<'a, 'e, F, D> {
    pub on_step: F,
    /// Full fine-tuning: a save holds the whole model, not the adapters.
    pub full: bool,
    pub saver: Option<&'a mut Saver>,
    pub eval: Option<(&'a mut Evaluator<'e>, &'a D, &'a Cell<Option<f64>>)>,
    pub run_log: &'a RefCell<Option<RunLog>>,
}

/// Writes a line of the run's log, if it has one. A line that cannot be written (a full
/// disk) ends the log with a warning, not the run: the log is a view of the run, not its
/// result.
pub(super) fn write_log(
    log: &RefCell<Option<RunLog>>,
    write: impl FnOnce(&mut RunLog) -> Result<(), String>,
) {
    let mut log = log.borrow_mut();
    if let Some(Err(e)) = log.as_mut().map(write) {
        let path = log.take().map(|l| l.path().display().to_string());
        tracing::warn!(
            "--log-file {}: {e}; no more lines are written",
            path.unwrap_or_default()
        );
    }
}

impl<F, D> RunSaves<'_, '_, F, D> {
    /// Evaluates `model` after `step` steps, if the run evaluates, and records the loss for
    /// a save of that step.
    fn evaluate<B>(&mut self, step: usize, model: &CausalLm<B>)
    where
        B: AutodiffBackend<InnerBackend: ShardedBackend, Device = D> + ShardedBackend,
    {
        if let Some((evaluator, device, shown)) = self.eval.as_mut() {
            let fresh = evaluator.points().last().is_none_or(|p| p.step != step);
            let point = evaluator.evaluate(step, model, device);
            shown.set(Some(point.loss));
            if let Some(saver) = self.saver.as_deref_mut() {
                saver.record_eval(step, point.loss);
            }
            if fresh {
                write_log(self.run_log, |log| log.eval(&point));
            }
        }
    }
}

impl<B, F> FitHooks<CausalLm<B>> for RunSaves<'_, '_, F, B::Device>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
    F: FnMut(usize, &StepOutput),
{
    fn step(&mut self, step: usize, out: &StepOutput) {
        (self.on_step)(step, out);
    }

    fn eval(&mut self, step: usize, model: CausalLm<B>) {
        self.evaluate(step, &model);
    }

    fn save(
        &mut self,
        step: usize,
        model: CausalLm<B>,
        optimizer: &OptimizerState,
    ) -> Result<(), CheckpointError> {
        // Every checkpoint records its eval loss, so that the best one can be kept.
        self.evaluate(step, &model);
        match (self.saver.as_deref_mut(), self.full) {
            (Some(saver), true) => saver
                .save::<B, CausalLm<B>>(step, model, optimizer)
                .map(drop),
            (Some(saver), false) => saver
                .save::<B, LoraAdapters<B>>(step, model.adapters(), optimizer)
                .map(drop),
            (None, _) => Ok(()),
        }
    }
}
