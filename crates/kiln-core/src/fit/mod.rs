//! The training loop programs share: build the strategy the plan names, step it over
//! epoch-shuffled global batches, and say what happened.
//!
//! `kiln train`, the Algorithm Distillation job and the strategy benchmark all train through
//! [`fit`]; what they print and save around it is theirs.

mod precision;

use std::marker::PhantomData;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::backend::Backend;

use crate::checkpoint::{CheckpointError, Saver};
use crate::data::{DataSource, EpochSampler};
use crate::optim::{OptimizerState, Precision};
use crate::plan::Plan;
use crate::strategy::{
    ConfigError, OptimizerSpec, RankReport, StepOutput, StrategyError, StrategyModel, build,
};
use crate::tensor_parallel::TpBackend;
pub use precision::{FitModel, PrecisionSupport};

/// How long and how to train: everything of a run but its [`Plan`].
pub struct Training<'a> {
    /// Optimizer steps.
    pub steps: usize,
    /// Seed of the sample order.
    pub seed: u64,
    /// The learning rate of each step (0-based).
    pub lr: &'a dyn Fn(usize) -> f64,
    /// Where a resumed run starts; `None` starts at step 0 with a fresh optimizer.
    pub resume: Option<&'a Resume>,
    /// Whether to read the optimizer state out of the ranks at the end
    /// ([`FitRecord::optimizer`]): only a run that checkpoints needs it, and it costs an
    /// encoding of every optimizer buffer.
    pub keep_optimizer_state: bool,
    /// Call [`FitHooks::save`] after every this many steps (not after the last step, whose
    /// model and state [`fit`] returns); `None` never.
    pub save_every: Option<usize>,
    /// Each sample's length, to make batches of similar lengths
    /// ([`EpochSampler::grouped_by_length`](crate::data::EpochSampler::grouped_by_length));
    /// `None` draws batches at random.
    pub lengths: Option<&'a [usize]>,
    /// Call [`FitHooks::eval`] after every this many steps (not after the last step: the
    /// caller evaluates the model [`fit`] returns); `None` never. A save due at the same step
    /// comes after the evaluation, so it can record the loss.
    pub eval_every: Option<usize>,
    /// Asked after every step: `true` ends the run there, as if it had been its last step
    /// (how SIGINT and SIGTERM stop a run without losing it). `None` runs to the end.
    pub stop: Option<&'a (dyn Fn() -> bool + Sync)>,
}

impl Training<'_> {
    /// The step this run starts from: the resumed one, or 0.
    pub fn first_step(&self) -> usize {
        self.resume.map_or(0, |r| r.step)
    }
}

/// What [`fit`] calls back while it trains. A closure `FnMut(usize, &StepOutput)` is the
/// hooks of a run that only watches its steps.
pub trait FitHooks<M> {
    /// Step `step` (1-based) ended with `out`.
    fn step(&mut self, step: usize, out: &StepOutput);

    /// A periodic save is due ([`Training::save_every`]): `model` and `optimizer` are the
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

    /// An evaluation is due ([`Training::eval_every`]): `model` is the whole model after
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

/// Where a resumed [`fit`] starts: the steps already trained (the sampler skips their batches)
/// and the optimizer state after them. With the model saved at that point, the run continues
/// bit for bit as if it had not stopped.
#[derive(Debug, Clone)]
pub struct Resume {
    /// Steps already trained.
    pub step: usize,
    /// The strategy's optimizer state after them ([`FitRecord::optimizer`]).
    pub optimizer: OptimizerState,
}

/// What stops a [`fit`]: the strategy (a plan the model cannot run, a failed rank, a halting
/// guard) or a checkpoint that could not be saved.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    /// The strategy's error.
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    /// A checkpoint could not be saved during training (boxed: it is rare, and large).
    #[error(transparent)]
    Checkpoint(Box<CheckpointError>),
}

impl From<CheckpointError> for FitError {
    fn from(e: CheckpointError) -> Self {
        Self::Checkpoint(Box::new(e))
    }
}

impl From<ConfigError> for FitError {
    fn from(e: ConfigError) -> Self {
        Self::Strategy(e.into())
    }
}

impl From<crate::data::DataError> for FitError {
    fn from(e: crate::data::DataError) -> Self {
        Self::Strategy(e.into())
    }
}

/// What a [`fit`] did.
#[derive(Debug, Clone)]
pub struct FitRecord {
    /// The plan that ran.
    pub plan: Plan,
    /// The loss of every step this run trained (from the resumed step on).
    pub losses: Vec<f64>,
    /// The step the run started from (0, or the resumed step).
    pub first_step: usize,
    /// The last step trained: `first_step + losses.len()`.
    pub last_step: usize,
    /// Whether [`Training::stop`] ended the run before its last step.
    pub stopped: bool,
    /// The last step [`FitHooks::save`] was called for, if any.
    pub saved_step: Option<usize>,
    /// Steps the NaN guard skipped (`nan_policy = "skip"`).
    pub skipped_steps: usize,
    /// The optimizer state at the end, to checkpoint next to the model, when asked for
    /// ([`Training::keep_optimizer_state`]).
    pub optimizer: Option<OptimizerState>,
    /// Seconds of the loop (building the strategy excluded).
    pub wall_s: f64,
    /// Each rank's totals.
    pub ranks: Vec<RankReport>,
}

impl FitRecord {
    /// Saves the end of the run through `saver`: its last step and `model`, unless its last
    /// periodic save already was that step or the record kept no optimizer state. Returns the
    /// folder of the run's last save, if any.
    ///
    /// # Errors
    /// As [`Saver::save`].
    pub fn save_end<B: Backend, M: Module<B>>(
        &self,
        saver: &mut Saver,
        model: M,
    ) -> Result<Option<std::path::PathBuf>, CheckpointError> {
        if let Some(optimizer) = &self.optimizer
            && self.saved_step != Some(self.last_step)
        {
            saver.save::<B, M>(self.last_step, model, optimizer)?;
        }
        Ok(saver.last().map(|(_, dir)| dir.clone()))
    }

    /// Mean loss of the last `n` steps (fewer when the run was shorter); NaN without steps.
    pub fn tail_loss(&self, n: usize) -> f64 {
        let tail = &self.losses[self.losses.len().saturating_sub(n)..];
        tail.iter().sum::<f64>() / tail.len() as f64
    }

    /// Milliseconds per optimizer step.
    pub fn ms_per_step(&self) -> f64 {
        1e3 * self.wall_s / self.losses.len().max(1) as f64
    }
}

/// Trains `model` on `data` as `plan` says, over `devices` (one per rank of the plan), in the
/// precision `optim`'s configuration names (bf16 and f16 wrap the model in
/// [`MixedPrecision`]), calling `hooks` after every step (1-based) and every
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

/// A run's plan, schedule, optimizer and hooks, as [`fit`] hands them on.
pub(crate) struct Run<'a, 'b, B, S, M> {
    pub(super) plan: &'a Plan,
    pub(super) training: &'a Training<'a>,
    pub(super) optim: &'a S,
    pub(super) hooks: &'b mut dyn FitHooks<M>,
    pub(super) backend: PhantomData<B>,
}

/// [`fit`] of `model` as it is, in f32.
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
