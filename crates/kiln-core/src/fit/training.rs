//! What a run is asked: how long and how to train, and where a resumed run starts.

use crate::optim::OptimizerState;

/// How long and how to train: everything of a run but its [`Plan`](crate::plan::Plan).
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
    /// ([`FitRecord::optimizer`](super::FitRecord::optimizer)): only a run that checkpoints needs it, and it costs an
    /// encoding of every optimizer buffer.
    pub keep_optimizer_state: bool,
    /// Call [`FitHooks::save`](super::FitHooks::save) after every this many steps (not after the last step, whose
    /// model and state [`fit`](super::fit) returns); `None` never.
    pub save_every: Option<usize>,
    /// Each sample's length, to make batches of similar lengths
    /// ([`EpochSampler::grouped_by_length`](crate::data::EpochSampler::grouped_by_length));
    /// `None` draws batches at random.
    pub lengths: Option<&'a [usize]>,
    /// Call [`FitHooks::eval`](super::FitHooks::eval) after every this many steps (not after the last step: the
    /// caller evaluates the model [`fit`](super::fit) returns); `None` never. A save due at the same step
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

/// Where a resumed [`fit`](super::fit) starts: the steps already trained (the sampler skips their batches)
/// and the optimizer state after them. With the model saved at that point, the run continues
/// bit for bit as if it had not stopped.
#[derive(Debug, Clone)]
pub struct Resume {
    /// Steps already trained.
    pub step: usize,
    /// The strategy's optimizer state after them ([`FitRecord::optimizer`](super::FitRecord::optimizer)).
    pub optimizer: OptimizerState,
}
