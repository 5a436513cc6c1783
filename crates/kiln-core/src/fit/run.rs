//! The loop itself: build the strategy, step it over the sampler's global batches, call the
//! hooks, stop when asked, and record what happened.

use std::marker::PhantomData;
use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;

use super::hooks::FitHooks;
use super::record::FitError;
use super::record::FitRecord;
use super::training::Training;
use crate::data::{DataSource, EpochSampler};
use crate::plan::Plan;
use crate::strategy::{OptimizerSpec, StrategyModel, build};
use crate::tensor_parallel::TpBackend;

/// A run's plan, schedule, optimizer and hooks, as [`fit`](super::fit) hands them on.
pub(crate) struct Run<'a, 'b, B, S, M> {
    pub(super) plan: &'a Plan,
    pub(super) training: &'a Training<'a>,
    pub(super) optim: &'a S,
    pub(super) hooks: &'b mut dyn FitHooks<M>,
    pub(super) backend: PhantomData<B>,
}

/// [`fit`](super::fit) of `model` as it is, in f32.
pub(super) fn fit_as_is<B, M, S, I>(
    run: Run<'_, '_, B, S, M>,
    devices: Vec<B::Device>,
    model: M,
    data: DataSource<B, I, M::Input>,
) -> Result<(M, FitRecord), FitError>
where
    B: AutodiffBackend + TpBackend,
    M: StrategyModel<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    let Run {
        plan,
        training,
        optim,
        hooks,
        ..
    } = run;
    let mut sampler = EpochSampler::new(data.len(), plan.global_batch(), training.seed)?;
    if let Some(lengths) = training.lengths {
        sampler = sampler.grouped_by_length(lengths.to_vec())?;
    }
    let mut strategy = build(plan, devices, model, optim, data)?;
    let first = training.first_step();
    if let Some(resume) = training.resume {
        strategy.load_optimizer_state(&resume.optimizer)?;
        tracing::info!("resuming at step {first} of {}", training.steps);
    }
    // Capped: `steps` is what a user typed, and the losses grow as the steps do.
    let mut losses = Vec::with_capacity(training.steps.saturating_sub(first).min(1 << 16));
    let mut skipped_steps = 0;
    let (mut stopped, mut saved_step) = (false, None);
    let start = Instant::now();
    let batches = sampler
        .batches()
        .take(training.steps)
        .enumerate()
        .skip(first);
    for (step, batch) in batches {
        let out = strategy.step(&batch, (training.lr)(step))?;
        losses.push(out.loss);
        skipped_steps += usize::from(out.guard.is_some_and(|g| g.skipped));
        let done = step + 1;
        hooks.step(done, &out);
        if done == training.steps {
            break;
        }
        // A request from another process arrives with a step (`out.stop`); this process's own
        // stops it now, or (across processes) after the next step, with everyone.
        let asked = training.stop.is_some_and(|stop| stop());
        if out.stop || (asked && strategy.ask_stop()) {
            stopped = true;
            tracing::info!("stopping after step {done} of {}", training.steps);
            break;
        }
        let due = |every: Option<usize>| every.is_some_and(|n| done.is_multiple_of(n));
        let (eval, save) = (due(training.eval_every), due(training.save_every));
        if eval || save {
            let model = strategy.model()?;
            if eval {
                hooks.eval(done, model.clone());
            }
            if save {
                hooks.save(done, model, &strategy.optimizer_state()?)?;
                saved_step = Some(done);
            }
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
    let record = FitRecord {
        plan: plan.clone(),
        first_step: first,
        last_step: first + losses.len(),
        stopped,
        saved_step,
        losses,
        skipped_steps,
        wall_s,
        ranks: strategy.stats().into_iter().map(Into::into).collect(),
        optimizer: None,
    };
    // Across processes the state is gathered through the collective, which every process must
    // join, whether or not it keeps the state (only the one that saves does).
    let state = match training.keep_optimizer_state || strategy.spans_processes() {
        true => Some(strategy.optimizer_state()?),
        false => None,
    };
    let record = FitRecord {
        optimizer: state.filter(|_| training.keep_optimizer_state),
        ..record
    };
    Ok((strategy.model()?, record))
}
