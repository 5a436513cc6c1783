//! Bucketed synchronisation of gradients (all-reduce) and parameters (broadcast).

use std::marker::PhantomData;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{FloatDType, Tensor, backend::AutodiffBackend};

use super::BucketPlan;
use crate::collective::{Collective, CollectiveError, ReduceOp};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Sums `grads` over every rank of `collective`, one all-reduce per bucket of `plan`.
///
/// A parameter may have a gradient on some ranks and not on others (a branch taken only for
/// some inputs); it is reduced with zeros where missing, and left without a gradient only if
/// no rank had one, exactly as single-device training over the union of the data would. The
/// presence flags ride in the last bucket, so they cost no extra call; so do `facts`, small
/// per-rank values (the guard's findings) that come back summed over the ranks.
///
/// # Errors
/// The first [`CollectiveError`]; the group is then poisoned.
pub fn all_reduce_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    mut grads: GradientsParams,
    plan: &BucketPlan,
    collective: &mut dyn Collective<Inner<B>>,
    device: &B::Device,
    facts: &[f32],
) -> Result<(GradientsParams, Vec<f32>), CollectiveError> {
    let flats = flatten_grads(module, &mut grads, plan);
    let tail = presence_and_facts(&flats, facts);
    let flats = flats
        .into_iter()
        .zip(&plan.slots)
        .map(|(flat, slot)| flat.unwrap_or_else(|| Tensor::zeros([slot.numel], device)))
        .collect();
    let tail = Tensor::<Inner<B>, 1>::from_floats(tail.as_slice(), device);

    let (reduced, tail) = plan.run(flats, Some(tail), |bucket| {
        collective.all_reduce(bucket, ReduceOp::Sum)
    })?;
    let (presence, facts) = split_tail(tail.expect("the tail travels with the buckets"), plan);
    let reduced = reduced.into_iter().map(Some).collect();
    Ok((unflatten_grads(module, plan, reduced, presence), facts))
}

/// Each planned parameter's gradient taken out of `grads` as a flat tensor, in slot order
/// (`None` where this rank has none).
pub(super) fn flatten_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    plan: &BucketPlan,
) -> Vec<Option<Tensor<Inner<B>, 1>>> {
    let mut flatten = FlattenGrads::<B> {
        plan,
        grads,
        flats: vec![None; plan.slots.len()],
    };
    module.visit(&mut flatten);
    flatten.flats
}

/// One presence flag per slot (1 where this rank has a gradient), then `facts`: what travels
/// summed over the ranks beside the gradients.
pub(super) fn presence_and_facts<T>(flats: &[Option<T>], facts: &[f32]) -> Vec<f32> {
    flats
        .iter()
        .map(|f| f32::from(u8::from(f.is_some())))
        .chain(facts.iter().copied())
        .collect()
}

/// The summed [`presence_and_facts`] back on the host: the presence counts, and the facts.
pub(super) fn split_tail<B: burn::tensor::backend::Backend>(
    tail: Tensor<B, 1>,
    plan: &BucketPlan,
) -> (Vec<f32>, Vec<f32>) {
    let mut presence = tail
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("the presence flags convert to f32");
    let facts = presence.split_off(plan.slots.len());
    (presence, facts)
}

/// `reduced` (a flat tensor per slot, `None` where this rank holds none) registered as the
/// gradients of their parameters, shaped as them, where some rank had a gradient.
pub(super) fn unflatten_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    plan: &BucketPlan,
    reduced: Vec<Option<Tensor<Inner<B>, 1>>>,
    presence: Vec<f32>,
) -> GradientsParams {
    let mut unflatten = UnflattenGrads::<B> {
        plan,
        grads: GradientsParams::new(),
        reduced,
        presence,
        backend: PhantomData,
    };
    module.visit(&mut unflatten);
    unflatten.grads
}

/// Replaces every parameter of `module` covered by `plan` with rank `root`'s value, one
/// broadcast per bucket; `require_grad` of each parameter is kept.
///
/// # Errors
/// The first [`CollectiveError`]; the group is then poisoned.
pub fn broadcast_parameters<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: M,
    plan: &BucketPlan,
    collective: &mut dyn Collective<Inner<B>>,
    root: usize,
) -> Result<M, CollectiveError> {
    broadcast_parameters_in(module, plan, collective, root, None, true)
}

/// [`broadcast_parameters`] with rank `root`'s values cast to `dtype` first (`None`: as they
/// are), replacing the parameters only where `replace` (the root, sending, keeps its own).
pub(crate) fn broadcast_parameters_in<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: M,
    plan: &BucketPlan,
    collective: &mut dyn Collective<Inner<B>>,
    root: usize,
    dtype: Option<FloatDType>,
    replace: bool,
) -> Result<M, CollectiveError> {
    let mut flatten = FlattenParams::<B> {
        plan,
        flats: vec![None; plan.slots.len()],
    };
    module.visit(&mut flatten);
    let flats = flatten
        .flats
        .into_iter()
        .map(|f: Option<Tensor<Inner<B>, 1>>| {
            let flat = f.expect("every planned parameter is visited");
            match dtype {
                Some(dtype) if flat.dtype() != dtype.into() => flat.cast(dtype),
                _ => flat,
            }
        })
        .collect();
    let (values, _) = plan.run(flats, None, |bucket| collective.broadcast(bucket, root))?;
    if !replace {
        return Ok(module);
    }
    let mut replace = ReplaceParams::<B> {
        plan,
        values,
        backend: PhantomData,
    };
    Ok(module.map(&mut replace))
}

struct FlattenGrads<'a, B: AutodiffBackend> {
    plan: &'a BucketPlan,
    grads: &'a mut GradientsParams,
    flats: Vec<Option<Tensor<Inner<B>, 1>>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for FlattenGrads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(&slot) = self.plan.index.get(&param.id) else {
            return;
        };
        if let Some(grad) = self.grads.remove::<Inner<B>, D>(param.id) {
            self.flats[slot] = Some(grad.reshape([self.plan.slots[slot].numel]));
        }
    }
}

struct UnflattenGrads<'a, B: AutodiffBackend> {
    plan: &'a BucketPlan,
    grads: GradientsParams,
    reduced: Vec<Option<Tensor<Inner<B>, 1>>>,
    presence: Vec<f32>,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for UnflattenGrads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(&slot) = self.plan.index.get(&param.id) else {
            return;
        };
        // `take` also keeps a tied parameter from being registered twice.
        let Some(flat) = self.reduced[slot].take() else {
            return;
        };
        if self.presence[slot] > 0.0 {
            let shape: [usize; D] = param.val().dims();
            self.grads.register(param.id, flat.reshape(shape));
        }
    }
}

struct FlattenParams<'a, B: AutodiffBackend> {
    plan: &'a BucketPlan,
    flats: Vec<Option<Tensor<Inner<B>, 1>>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for FlattenParams<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(&slot) = self.plan.index.get(&param.id) {
            let numel = self.plan.slots[slot].numel;
            self.flats[slot] = Some(param.val().inner().reshape([numel]));
        }
    }
}

struct ReplaceParams<'a, B: AutodiffBackend> {
    plan: &'a BucketPlan,
    values: Vec<Tensor<Inner<B>, 1>>,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for ReplaceParams<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(&slot) = self.plan.index.get(&param.id) else {
            return param;
        };
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let value = self.values[slot].clone().reshape(tensor.dims());
        let value = Tensor::from_inner(value).set_require_grad(require_grad);
        Param::from_mapped_value(id, value, mapper)
    }
}
