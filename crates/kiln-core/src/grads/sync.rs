//! Bucketed synchronisation of gradients (all-reduce) and parameters (broadcast).

use std::marker::PhantomData;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, backend::AutodiffBackend};

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
    let mut flatten = FlattenGrads::<B> {
        plan,
        grads: &mut grads,
        flats: vec![None; plan.slots.len()],
    };
    module.visit(&mut flatten);
    let flats = flatten.flats;

    let tail: Vec<f32> = flats
        .iter()
        .map(|f| f32::from(u8::from(f.is_some())))
        .chain(facts.iter().copied())
        .collect();
    let flats = flats
        .into_iter()
        .zip(&plan.slots)
        .map(|(flat, slot)| flat.unwrap_or_else(|| Tensor::zeros([slot.numel], device)))
        .collect();
    let tail = Tensor::<Inner<B>, 1>::from_floats(tail.as_slice(), device);

    let (reduced, tail) = plan.run(flats, Some(tail), |bucket| {
        collective.all_reduce(bucket, ReduceOp::Sum)
    })?;
    let mut presence = tail
        .expect("the tail travels with the buckets")
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("the tail converts to f32");
    let facts = presence.split_off(plan.slots.len());

    let mut unflatten = UnflattenGrads::<B> {
        plan,
        grads: GradientsParams::new(),
        reduced: reduced.into_iter().map(Some).collect(),
        presence,
        backend: PhantomData,
    };
    module.visit(&mut unflatten);
    Ok((unflatten.grads, facts))
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
    let mut flatten = FlattenParams::<B> {
        plan,
        flats: vec![None; plan.slots.len()],
    };
    module.visit(&mut flatten);
    let flats = flatten
        .flats
        .into_iter()
        .map(|f| f.expect("every planned parameter is visited"))
        .collect();
    let (values, _) = plan.run(flats, None, |bucket| collective.broadcast(bucket, root))?;
    let mut replace = ReplaceParams::<B> {
        plan,
        values,
        backend: PhantomData,
    };
    Ok(module.map(&mut replace))
}

/// Takes each planned parameter's gradient out of `grads` as a flat tensor, in slot order.
pub(super) struct FlattenGrads<'a, B: AutodiffBackend> {
    pub(super) plan: &'a BucketPlan,
    pub(super) grads: &'a mut GradientsParams,
    pub(super) flats: Vec<Option<Tensor<Inner<B>, 1>>>,
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

/// Registers each planned parameter's reduced flat tensor as its gradient, shaped as the
/// parameter, where some rank had a gradient for it (`presence > 0`).
pub(super) struct UnflattenGrads<'a, B: AutodiffBackend> {
    pub(super) plan: &'a BucketPlan,
    pub(super) grads: GradientsParams,
    pub(super) reduced: Vec<Option<Tensor<Inner<B>, 1>>>,
    pub(super) presence: Vec<f32>,
    pub(super) backend: PhantomData<B>,
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
