//! The fused AdamW's state between steps: parameters stepped together in groups whose moments
//! lie in flat buffers, and the passes over a module that take its gradients and put the stepped
//! parameters back.

use std::collections::{HashMap, HashSet};

use burn::module::{ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::GradAdaptor;
use burn::optim::{AdamWState, AdaptiveMomentumState};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Shape, Tensor};

use super::{FusedAdamWRecord, LowCopies};
use crate::{FlatLayout, KernelBackend};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Parameters stepped together: they share a step count and a dtype, and their moments lie in
/// two flat buffers.
#[derive(Clone)]
pub(super) struct Group<B: Backend> {
    pub(super) ids: Vec<ParamId>,
    pub(super) shapes: Vec<Shape>,
    pub(super) layout: FlatLayout,
    pub(super) m: Tensor<B, 1>,
    pub(super) v: Tensor<B, 1>,
    /// Steps taken.
    pub(super) time: usize,
    /// The parameters as the last step wrote them, flat, when it kept them for the next step
    /// to read in one binding (with mixed precision's copies on).
    pub(super) last: Option<Tensor<B, 1>>,
}

/// A parameter with a gradient this step.
pub(super) struct Item<B: Backend> {
    pub(super) id: ParamId,
    pub(super) shape: Shape,
    pub(super) param: Tensor<B, 1>,
    pub(super) grad: Tensor<B, 1>,
    /// Moments and steps taken, from a loaded record.
    pub(super) loaded: Option<(Tensor<B, 1>, Tensor<B, 1>, usize)>,
    /// Whether the parameter is still the tensor the last step put in the model (known only
    /// with mixed precision's copies on).
    pub(super) current: bool,
}

/// A parameter's first and second moments, flat, and the steps they have seen.
type Moments<B> = (Tensor<Inner<B>, 1>, Tensor<Inner<B>, 1>, usize);

/// Parameters stepped together, with the moments each brings.
type Run<'a, B> = Vec<(&'a Item<Inner<B>>, Option<Moments<B>>)>;

/// Whether this step's parameters are the last step's groups, in order and shape: then
/// the flat moments carry over as they are.
pub(super) fn matching<B: AutodiffBackend>(
    groups: &[Group<Inner<B>>],
    items: &[Item<Inner<B>>],
) -> bool {
    let ids = groups.iter().flat_map(|g| g.ids.iter().zip(&g.shapes));
    items.iter().all(|i| i.loaded.is_none())
        && items.len() == groups.iter().map(|g| g.ids.len()).sum::<usize>()
        && ids
            .zip(items)
            .all(|((id, shape), item)| *id == item.id && *shape == item.shape)
}

/// Lays the moments out afresh for `items`: a group per run of parameters that share a step
/// count and a dtype, with moments from the last step, a loaded record, or zeros.
pub(super) fn regroup<B: AutodiffBackend<InnerBackend: KernelBackend>>(
    last: Vec<Group<Inner<B>>>,
    items: &[Item<Inner<B>>],
) -> Vec<Group<Inner<B>>> {
    let mut previous: HashMap<ParamId, Moments<B>> = HashMap::new();
    for group in last {
        for (i, id) in group.ids.iter().enumerate() {
            let segment = group.layout.segment(i);
            let m = group.m.clone().slice(segment.clone());
            let v = group.v.clone().slice(segment);
            previous.insert(*id, (m, v, group.time));
        }
    }
    let mut groups: Vec<Group<Inner<B>>> = Vec::new();
    let mut runs: Vec<Run<'_, B>> = Vec::new();
    let mut key: Option<(usize, DType)> = None;
    for item in items {
        let state = item.loaded.clone().or_else(|| previous.remove(&item.id));
        let this = (state.as_ref().map_or(0, |s| s.2), item.param.dtype());
        if key != Some(this) {
            runs.push(Vec::new());
            key = Some(this);
        }
        runs.last_mut()
            .expect("a run was just opened")
            .push((item, state));
    }
    for run in runs {
        let device = run[0].0.param.device();
        let dtype = run[0].0.param.dtype();
        let time = run[0].1.as_ref().map_or(0, |s| s.2);
        let align = Inner::<B>::flat_alignment(&device, dtype);
        let layout = FlatLayout::new(
            run.iter().map(|(i, _)| i.shape.num_elements()).collect(),
            align,
        );
        let fresh = run.iter().all(|(_, s)| s.is_none());
        let flat = |pick: fn(&Moments<B>) -> Tensor<Inner<B>, 1>| {
            if fresh {
                // A first step: one buffer of zeros, not one per parameter joined.
                return Tensor::zeros([layout.total()], (&device, dtype));
            }
            let parts = run
                .iter()
                .map(|(item, state)| match state {
                    Some(s) => pick(s).to_device(&device).cast(dtype),
                    None => Tensor::zeros([item.shape.num_elements()], (&device, dtype)),
                })
                .collect();
            layout.join(parts, &device, dtype)
        };
        groups.push(Group {
            ids: run.iter().map(|(i, _)| i.id).collect(),
            shapes: run.iter().map(|(i, _)| i.shape.clone()).collect(),
            m: flat(|s| s.0.clone()),
            v: flat(|s| s.1.clone()),
            layout,
            time,
            last: None,
        });
    }
    groups
}

/// Takes each parameter's gradient (and loaded state) in visiting order, once per parameter.
pub(super) struct Collect<'a, B: AutodiffBackend<InnerBackend: KernelBackend>> {
    pub(super) grads: &'a mut GradAdaptor,
    pub(super) pending: &'a mut FusedAdamWRecord<B>,
    pub(super) copies: Option<&'a LowCopies>,
    pub(super) seen: HashSet<ParamId>,
    pub(super) items: Vec<Item<Inner<B>>>,
}

impl<B: AutodiffBackend<InnerBackend: KernelBackend>> ModuleVisitor<B> for Collect<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        // A tied parameter is visited once per use but has one gradient.
        if !self.seen.insert(param.id) {
            return;
        }
        let Some((grad, _)) = self.grads.remove::<Inner<B>, D>(param.id) else {
            return;
        };
        let tensor = param.val().inner();
        let current = self.copies.is_some_and(|c| c.is_current(param.id, &tensor));
        let shape = tensor.shape();
        let len = shape.num_elements();
        let device = tensor.device();
        let loaded = self.pending.remove(&param.id).map(|record| {
            let state: AdamWState<Inner<B>, D> = record.into_state();
            let AdaptiveMomentumState {
                time,
                moment_1,
                moment_2,
                ..
            } = state.momentum;
            (
                moment_1.reshape([len]).to_device(&device),
                moment_2.reshape([len]).to_device(&device),
                time,
            )
        });
        self.items.push(Item {
            id: param.id,
            shape,
            param: tensor.reshape([len]),
            grad: grad.to_device(&device).reshape([len]),
            loaded,
            current,
        });
    }
}

/// Puts each stepped parameter's new value (a view of the flat result) in place, and leaves
/// its compute-dtype copy (when the step made one) in `copies` against that very tensor.
pub(super) struct Replace<B: AutodiffBackend> {
    pub(super) updated: HashMap<ParamId, Tensor<Inner<B>, 1>>,
    pub(super) lows: HashMap<ParamId, Tensor<Inner<B>, 1>>,
    pub(super) copies: Option<LowCopies>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Replace<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let tensor = match self.updated.get(&id) {
            Some(flat) => {
                let value = flat.clone().reshape(tensor.shape());
                if let Some(copies) = &self.copies {
                    copies.keep(id, value.clone(), self.lows.remove(&id));
                }
                let mut new = Tensor::from_inner(value);
                if tensor.is_require_grad() {
                    new = new.require_grad();
                }
                new
            }
            None => tensor,
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}
