//! The end of every strategy's step, written once: inspect the gradients → synchronise them →
//! settle what the guard decides → step the optimizer.
//!
//! Strategies differ only in how gradients are synchronised and where the facts the guard
//! needs (each rank's finding, the global norm) come together, which [`Sync`] says:
//! - a whole model on every rank (Single, Ddp, DataParallel): each rank's finding code rides in
//!   the data-parallel all-reduce's last bucket, and every rank computes the global norm from
//!   the summed gradients it holds whole;
//! - a model split over ranks (pipeline stages, tensor-parallel shards): no rank holds every
//!   gradient, so one small all-reduce over the world sums every rank's code and place and the
//!   ranks' squared norms, each parameter counted once: one replica contributes for all, and a
//!   parameter that every tensor-parallel shard holds whole is counted by shard 0 alone.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use burn::module::{AutodiffModule, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::collective::{Collective, CollectiveError, ReduceOp};
use crate::grads::{BucketPlan, Owners, all_reduce_gradients, reduce_to_owners};
use crate::optim::{Guard, GuardReport, GuardedOptimizer, Local, NonFinite, Settled, param_path};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// What stops a guarded step: a collective that failed, or a value that was not finite under a
/// guard whose policy is to halt (every rank returns the same report).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum StepError {
    /// The gradients' or the guard's all-reduce failed.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A loss or gradient was NaN or infinite.
    #[error(transparent)]
    NonFinite(#[from] NonFinite),
}

/// How a rank's gradients become the step's gradients.
pub(crate) struct Sync<'a, B: AutodiffBackend> {
    /// The data-parallel group and its bucket plan; `None` when the gradients are whole
    /// already (one replica, or DataParallel's sum on its main device).
    pub dp: Option<(&'a mut dyn Collective<Inner<B>>, &'a BucketPlan)>,
    /// Where the guard's facts come together when the model is split over ranks; `None` when
    /// every rank holds the whole model.
    pub split: Option<Split<'a, B>>,
    /// Which replica of `dp` steps which parameters when the replicas split the optimizer
    /// state (ZeRO-1), and receives their reduced gradients alone when they split those too
    /// (ZeRO-2); `None` when every replica steps all.
    pub owners: Option<&'a Owners>,
    /// This rank's device.
    pub device: &'a B::Device,
}

/// A rank's part of a model split over the world (see the [module docs](self)).
pub(crate) struct Split<'a, B: AutodiffBackend> {
    /// Every rank of the world.
    pub world: &'a mut dyn Collective<Inner<B>>,
    /// This rank's pipeline stage (0 without stages).
    pub stage: usize,
    /// This rank's tensor-parallel shard (0 without shards).
    pub shard: usize,
    /// Tensor-parallel shards (1 without).
    pub shards: usize,
    /// Whether this rank is the first replica of its part, which alone adds its squared norm.
    pub first_replica: bool,
    /// The parameters every shard holds whole, counted by shard 0 alone.
    pub replicated: &'a HashSet<ParamId>,
}

/// What the guard knows of a rank's gradients before they are synchronised.
pub(crate) enum Findings {
    /// The gradients passed in are this rank's own: inspect them (and whether its loss was
    /// finite).
    Inspect {
        /// Whether every micro-batch's loss was finite.
        loss_finite: bool,
    },
    /// The gradients passed in are already summed from parts inspected before (DataParallel:
    /// one finding code per device).
    Given(Vec<f32>),
}

/// What one guarded step did.
pub(crate) struct Stepped<M> {
    /// The model after the optimizer step (unchanged when the step was skipped).
    pub model: M,
    /// The guard's decision; `None` without a guard.
    pub guard: Option<GuardReport>,
    /// Time in collectives.
    pub communication: Duration,
    /// Time inspecting, settling and stepping the optimizer.
    pub compute: Duration,
}

/// Inspect → synchronise → settle → step, for one rank. See the [module docs](self).
///
/// # Errors
/// A collective failure, or the guard's [`NonFinite`] report under `nan_policy = "halt"`
/// (every rank returns the same one).
pub(crate) fn guarded_step<B, M, O>(
    optim: &mut O,
    model: M,
    grads: GradientsParams,
    findings: Findings,
    sync: Sync<'_, B>,
    lr: f64,
    step: u64,
) -> Result<Stepped<M>, StepError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: GuardedOptimizer<M, B>,
{
    let Sync {
        dp,
        split,
        owners,
        device,
    } = sync;
    let guard = optim.guard().cloned();
    let start = Instant::now();
    // A shard other than the first leaves out the parameters shard 0 counts for every shard,
    // unless its gradients are summed over `dp` first (then the sum is inspected again).
    let skip = match (&split, &dp) {
        (Some(s), None) if !counts_replicated(s) => Some(s.replicated),
        _ => None,
    };
    let (local, mut codes) = match (&guard, findings) {
        (None, _) => (None, Vec::new()),
        (Some(g), Findings::Inspect { loss_finite }) => {
            let squares = optim.squares(&model, &grads, skip);
            (
                Some(g.inspect::<B, M>(&model, &grads, loss_finite, squares)),
                Vec::new(),
            )
        }
        (Some(_), Findings::Given(codes)) => (None, codes),
    };
    let mut compute = start.elapsed();

    let sync_start = Instant::now();
    // Under ZeRO-2 each replica receives its own parameters' summed gradients alone.
    let to_owners = owners.filter(|o| o.reduces_gradients());
    // A whole model's findings ride in its data-parallel all-reduce.
    let riding = split.is_none();
    let (grads, summed, mut dp) = match dp {
        Some((group, plan)) => {
            let mine = match (&local, riding) {
                (Some(l), true) => Guard::codes(l, group.rank(), group.world_size()),
                _ => Vec::new(),
            };
            let (grads, facts) = match to_owners {
                Some(owners) => {
                    reduce_to_owners(&model, grads, plan, owners, group, device, &mine)?
                }
                None => all_reduce_gradients(&model, grads, plan, group, device, &mine)?,
            };
            if !mine.is_empty() {
                codes = facts;
            }
            (grads, true, Some(group))
        }
        None => {
            if let (Some(l), true) = (&local, riding) {
                codes = Guard::codes(l, 0, 1);
            }
            (grads, false, None)
        }
    };
    let mut communication = sync_start.elapsed();

    let settle_start = Instant::now();
    let mut settle_communication = Duration::ZERO;
    let settled = match (&guard, split) {
        (None, _) => Settled::unguarded(grads),
        (Some(g), None) => match (to_owners, dp.as_deref_mut()) {
            (Some(_), Some(group)) => {
                // Each owner holds its own parameters' sums: the norm adds the parts.
                let part = optim.squares(&model, &grads, None);
                let start = Instant::now();
                let global = sum_over_ranks::<B>(group, part, device)?;
                settle_communication = start.elapsed();
                g.settle_replica::<B, M>(&model, grads, &codes, None, step, |_| global)?
            }
            _ => {
                let local = if summed { None } else { local };
                g.settle_replica::<B, M>(&model, grads, &codes, local, step, |grads| {
                    optim.squares(&model, grads, None)
                })?
            }
        },
        (Some(g), Some(split)) => {
            let local = local.expect("a split model's ranks inspect their own gradients");
            let squares = |grads: &GradientsParams, skip: Option<&HashSet<ParamId>>| {
                optim.squares(&model, grads, skip)
            };
            let (settled, spent) = settle_split(
                g, &model, grads, local, summed, split, device, step, squares,
            )?;
            settle_communication = spent;
            settled
        }
    };
    communication += settle_communication;
    // The guard has read every summed gradient, or under ZeRO-2 and -3 added the owners' norms
    // (the norm is the whole model's); under ZeRO-1 and -2 each replica then steps its own
    // parameters and sends them to the others. Under ZeRO-3 the others gather them before
    // their next forward instead. A skipped step is skipped by every replica alike, so none
    // broadcasts.
    let mut broadcast = Duration::ZERO;
    let model = match (settled.grads, owners.zip(dp)) {
        (Some(grads), Some((owners, group))) => {
            let grads = owners.keep_mine::<B, M>(&model, grads);
            let model = optim.step_scaled(lr, model, grads, settled.factor);
            if owners.releases_parameters() {
                model
            } else {
                let start = Instant::now();
                let model = owners.share_stepped::<B, M>(model, group)?;
                broadcast = start.elapsed();
                model
            }
        }
        (Some(grads), None) => optim.step_scaled(lr, model, grads, settled.factor),
        (None, _) => model,
    };
    communication += broadcast;
    compute += settle_start
        .elapsed()
        .saturating_sub(settle_communication + broadcast);
    Ok(Stepped {
        model,
        guard: guard.map(|_| settled.report),
        communication,
        compute,
    })
}

/// `value` summed over the ranks of `group` (in f32, the collectives' type).
fn sum_over_ranks<B: AutodiffBackend>(
    group: &mut dyn Collective<Inner<B>>,
    value: f64,
    device: &B::Device,
) -> Result<f64, CollectiveError> {
    let value = Tensor::<Inner<B>, 1>::from_floats([value as f32], device);
    let sum = group.all_reduce(value, ReduceOp::Sum)?.into_scalar();
    Ok(burn::tensor::ElementConversion::elem::<f64>(sum))
}

/// Whether `split`'s rank counts the parameters every shard holds whole in the norm: shard 0
/// does, for every shard.
fn counts_replicated<B: AutodiffBackend>(split: &Split<'_, B>) -> bool {
    split.shard == 0 || split.replicated.is_empty()
}

/// The guard's decision for a rank of a split model: every rank's code, stage and shard and
/// the parts' squared norms, summed over the world in one all-reduce; then every rank settles
/// from the same facts. Returns the decision and the time the all-reduce took.
#[allow(clippy::too_many_arguments)]
fn settle_split<B: AutodiffBackend, M: AutodiffModule<B>>(
    guard: &Guard,
    module: &M,
    grads: GradientsParams,
    local: Local,
    summed: bool,
    split: Split<'_, B>,
    device: &B::Device,
    step: u64,
    squares: impl FnOnce(&GradientsParams, Option<&HashSet<ParamId>>) -> f64,
) -> Result<(Settled, Duration), StepError> {
    let squares = if summed {
        let skip = (!counts_replicated(&split)).then_some(split.replicated);
        squares(&grads, skip)
    } else {
        // Inspected without the replicated parameters already where they are not counted.
        local.squares
    };
    let (rank, world_size) = (split.world.rank(), split.world.world_size());
    // Layout: each rank's finding code, stage and shard, then the global Σ g², to which only
    // the first replica of each part adds (the replicas' sums are equal).
    let mut facts = vec![0.0f32; 3 * world_size + 1];
    facts[rank] = local.code;
    facts[world_size + rank] = split.stage as f32;
    facts[2 * world_size + rank] = split.shard as f32;
    if split.first_replica {
        facts[3 * world_size] = squares as f32;
    }
    let start = Instant::now();
    let facts = Tensor::<B::InnerBackend, 1>::from_floats(facts.as_slice(), device);
    let facts = split
        .world
        .all_reduce(facts, ReduceOp::Sum)?
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("the facts convert to f32");
    let spent = start.elapsed();
    let codes = &facts[..world_size];
    let stages = &facts[world_size..2 * world_size];
    let shards = &facts[2 * world_size..3 * world_size];
    let stage = split.stage;
    let settled = guard
        .settle(
            grads,
            codes,
            f64::from(facts[3 * world_size]),
            step,
            // Every shard of a stage holds the same parameters, so any of them can name one.
            |culprit, ordinal| {
                (stages[culprit] as usize == stage)
                    .then(|| param_path::<B, M>(module, ordinal))
                    .flatten()
            },
        )
        .map_err(|mut report: NonFinite| {
            if split.shards > 1 {
                report.shard = report.rank.map(|r| shards[r] as usize);
            }
            StepError::from(report)
        })?;
    Ok((settled, spent))
}
