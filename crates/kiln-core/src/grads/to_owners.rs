//! ZeRO-2's gradient reduction: each bucket of an owner's parameters is reduced to that owner
//! alone ([`Collective::reduce`]), so a replica ends the reduction holding the summed
//! gradients of its own parameters and nothing of the others'.
//!
//! What every replica needs from every other (whether a parameter had a gradient anywhere, and
//! the guard's findings) cannot ride in a bucket that only its owner receives: it travels in a
//! small all-reduce of its own first, one call per step.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, backend::AutodiffBackend};

use super::sync::{flatten_grads, presence_and_facts, split_tail, unflatten_grads};
use super::{BucketPlan, Owners};
use crate::collective::{Collective, CollectiveError, ReduceOp};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Sums `grads` over every rank of `collective`, each parameter's sum delivered to its owner
/// alone: the result holds this replica's own parameters' gradients. Missing gradients count as
/// zeros, and a parameter no rank had a gradient for gets none, as
/// [`super::all_reduce_gradients`] does; `facts` come back summed over the ranks.
///
/// # Errors
/// The first [`CollectiveError`]; the group is then poisoned.
pub(crate) fn reduce_to_owners<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    mut grads: GradientsParams,
    plan: &BucketPlan,
    owners: &Owners,
    collective: &mut dyn Collective<Inner<B>>,
    device: &B::Device,
    facts: &[f32],
) -> Result<(GradientsParams, Vec<f32>), CollectiveError> {
    let mut flats = flatten_grads(module, &mut grads, plan);
    let shared = presence_and_facts(&flats, facts);
    let shared = Tensor::<Inner<B>, 1>::from_floats(shared.as_slice(), device);
    let (presence, facts) = split_tail(collective.all_reduce(shared, ReduceOp::Sum)?, plan);

    let mut reduced = vec![None; plan.slots.len()];
    for (root, part) in owners.parts().iter().enumerate() {
        let part_flats = part
            .slots
            .iter()
            .map(|slot| {
                flats[plan.index[&slot.id]]
                    .take()
                    .unwrap_or_else(|| Tensor::zeros([slot.numel], device))
            })
            .collect();
        // A replica that is not the root receives nothing: it keeps its own packed bucket as
        // the "result", dropped with the rest of this part's below (`run` unpacks every
        // bucket).
        let (sums, _) = part.run(part_flats, None, |bucket| {
            let sum = collective.reduce(bucket.clone(), ReduceOp::Sum, root)?;
            Ok::<_, CollectiveError>(sum.unwrap_or(bucket))
        })?;
        if root == owners.rank() {
            for (slot, sum) in part.slots.iter().zip(sums) {
                reduced[plan.index[&slot.id]] = Some(sum);
            }
        }
    }

    Ok((unflatten_grads(module, plan, reduced, presence), facts))
}
