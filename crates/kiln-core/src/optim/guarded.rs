//! [`GuardedOptimizer`]: what Kiln's strategies step, any Burn optimizer with or without guards,
//! and its implementations for Burn's optimizers and the fused AdamW.

use std::collections::HashSet;

use burn::module::{AutodiffModule, ParamId};
use burn::optim::LearningRate;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{GradientsParams, Optimizer, SimpleOptimizer};
use burn::tensor::backend::AutodiffBackend;
use kiln_kernels::LowCopies;

use super::guard::Guard;
use super::inspect::{scale_grads, total_squares};

/// An optimizer that Kiln's strategies can step: any Burn optimizer, with or without guards.
///
/// The strategies call [`Self::guard`] between the gradient synchronisation and
/// [`Optimizer::step`]; a guard may clip the gradients, skip the step, or halt. Every
/// optimizer Burn ships is an [`OptimizerAdaptor`] and has no guard; wrap one in a
/// [`PerformanceOptimizer`] to add them. An optimizer of your own needs a one-line
/// `impl GuardedOptimizer<M, B> for MyOptimizer {}`.
///
/// The guard's two passes over the gradients, [`Self::squares`] and [`Self::step_scaled`], are
/// the optimizer's to make: their defaults run Burn's tensor ops, and an optimizer with fused
/// kernels ([`kiln_kernels::FusedAdamW`]) makes each in one launch, or none.
pub trait GuardedOptimizer<M: AutodiffModule<B>, B: AutodiffBackend>: Optimizer<M, B> {
    /// The guards to run before each step; `None` steps with the gradients as they are.
    fn guard(&self) -> Option<&Guard> {
        None
    }

    /// `Σ g²` over the gradients of `module` in `grads` (leaving out those of `skip`): non-finite
    /// exactly when a gradient is, or when the sum overflows f32, and the same on every rank
    /// that holds the same gradients (an order of addition fixed by their sizes).
    fn squares(&self, module: &M, grads: &GradientsParams, skip: Option<&HashSet<ParamId>>) -> f64 {
        total_squares::<B, M>(module, grads, skip)
    }

    /// Leaves mixed precision's compute-dtype copy of each f32 parameter it steps in `copies`
    /// (whenever they are on), made in the step's own pass: the fused AdamW does; the default
    /// makes none, and mixed precision casts the parameters itself.
    fn share_low_copies(&mut self, _copies: LowCopies) {}

    /// One step with every gradient multiplied by `factor` first (the guard's clipping over the
    /// loss scale; 1 for neither).
    fn step_scaled(
        &mut self,
        lr: LearningRate,
        module: M,
        grads: GradientsParams,
        factor: f64,
    ) -> M {
        let grads = if factor == 1.0 {
            grads
        } else {
            scale_grads::<B, M>(&module, grads, factor)
        };
        self.step(lr, module, grads)
    }

    /// The optimizer with its state kept only for the parameters in `keep`: what a replica
    /// keeps of a whole state when the replicas split it (`shard_state = "optimizer"`).
    /// `None` (the default) for an optimizer whose state is not kept per parameter, which
    /// `ddp` then refuses to split.
    fn retain_state(self, _keep: &HashSet<ParamId>) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }

    /// The optimizer with `other`'s per-parameter state added to its own (the replicas'
    /// parts, gathered into one state for a checkpoint). `None` as for [`Self::retain_state`].
    fn merge_state(self, _other: Self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }
}

impl<O, M, B> GuardedOptimizer<M, B> for OptimizerAdaptor<O, M, B>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: SimpleOptimizer<B::InnerBackend>,
{
    fn retain_state(self, keep: &HashSet<ParamId>) -> Option<Self> {
        Some(edit_record(self, |r| r.retain(|id, _| keep.contains(id))))
    }

    fn merge_state(self, other: Self) -> Option<Self> {
        let other = other.to_record();
        Some(edit_record(self, |r| r.extend(other)))
    }
}

/// `optim` with its record changed by `edit`: Burn's optimizers and the fused AdamW keep their
/// state as a map from `ParamId` (two map types), split and joined alike.
fn edit_record<M, B, O>(optim: O, edit: impl FnOnce(&mut O::Record)) -> O
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let mut record = optim.to_record();
    edit(&mut record);
    optim.load_record(record)
}

/// The fused AdamW makes the guard's passes in a launch or two: the squared norm of every
/// gradient in one multi-tensor pass, and the clipping inside its own step.
impl<M, B> GuardedOptimizer<M, B> for kiln_kernels::FusedAdamW<M, B>
where
    B: AutodiffBackend<InnerBackend: kiln_kernels::KernelBackend>,
    M: AutodiffModule<B>,
{
    fn squares(&self, module: &M, grads: &GradientsParams, skip: Option<&HashSet<ParamId>>) -> f64 {
        super::inspect::fused_squares::<B, M>(module, grads, skip)
    }

    fn step_scaled(
        &mut self,
        lr: LearningRate,
        module: M,
        grads: GradientsParams,
        factor: f64,
    ) -> M {
        kiln_kernels::FusedAdamW::step_scaled(self, lr, module, grads, factor as f32)
    }

    fn share_low_copies(&mut self, copies: LowCopies) {
        kiln_kernels::FusedAdamW::share_low_copies(self, copies);
    }

    fn retain_state(self, keep: &HashSet<ParamId>) -> Option<Self> {
        Some(edit_record(self, |r| r.retain(|id, _| keep.contains(id))))
    }

    fn merge_state(self, other: Self) -> Option<Self> {
        let other = other.to_record();
        Some(edit_record(self, |r| r.extend(other)))
    }
}
