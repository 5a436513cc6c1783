//! AdamW on the fused kernels, as a Burn optimizer: `FusedAdamWConfig::init()` drops in wherever
//! `AdamWConfig::init()` does (Kiln strategies, burn-train's `Learner`, hand-written loops).
//!
//! One step is one kernel launch for every parameter together (a few on runtimes that bind few
//! buffers per launch), as PyTorch's `fused=True` AdamW is: the moments of all parameters live
//! in two flat buffers ([`FlatLayout`]), and the updated parameters are written to a third,
//! of which each parameter is a view. Burn's own AdamW, and an optimizer stepping one tensor at a
//! time, launch a kernel (or a dozen) per parameter.
//!
//! Its record is Burn's: a map from parameter to [`AdamWState`], so a checkpoint written with
//! Burn's `AdamW` resumes with this optimizer and the other way round.

use std::collections::{HashMap, HashSet};

use hashbrown::HashMap as RecordMap;
use std::marker::PhantomData;

use burn::config::Config;
use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::GradAdaptor;
use burn::optim::record::AdaptorRecord;
use burn::optim::{
    AdamWState, AdaptiveMomentumState, GradientsParams, LearningRate, MultiGradientsParams,
    Optimizer, SimpleOptimizer,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Shape, Tensor};

use crate::{AdamWStep, FlatLayout, KernelBackend, ops};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Hyper-parameters, with Burn's `AdamWConfig` defaults.
#[derive(Config, Debug)]
pub struct FusedAdamWConfig {
    /// First-moment decay.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Second-moment decay.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// Added to `√v̂`.
    #[config(default = 1e-5)]
    pub epsilon: f32,
    /// Decoupled weight decay.
    #[config(default = 1e-4)]
    pub weight_decay: f32,
}

impl FusedAdamWConfig {
    /// The optimizer for module `M` on autodiff backend `B`.
    pub fn init<B, M>(&self) -> FusedAdamW<M, B>
    where
        B: AutodiffBackend<InnerBackend: KernelBackend>,
        M: AutodiffModule<B>,
    {
        FusedAdamW {
            config: self.clone(),
            groups: Vec::new(),
            pending: RecordMap::new(),
            module: PhantomData,
        }
    }

    fn step(&self, lr: LearningRate, time: usize) -> AdamWStep {
        AdamWStep {
            lr: lr as f32,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            time: time as u32,
        }
    }
}

/// The per-tensor AdamW rule, one kernel launch per parameter: a Burn [`SimpleOptimizer`]
/// whose state is Burn's [`AdamWState`]. [`FusedAdamW`]'s record is typed by it, which makes
/// the record the same as Burn's `AdamW` record.
#[derive(Clone, Debug)]
pub struct AdamWRule {
    config: FusedAdamWConfig,
}

impl AdamWRule {
    /// The rule with `config`'s hyper-parameters.
    pub fn new(config: FusedAdamWConfig) -> Self {
        Self { config }
    }
}

impl<B: KernelBackend> SimpleOptimizer<B> for AdamWRule {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        // A first step starts from zero moments, which is Burn's first-step formula.
        let (m, v, time) = match state {
            Some(s) => (
                s.momentum.moment_1,
                s.momentum.moment_2,
                s.momentum.time + 1,
            ),
            None => (grad.zeros_like(), grad.zeros_like(), 1),
        };
        let step = self.config.step(lr, time);
        let (tensor, m, v) = ops::adamw_step(tensor, grad, m, v, &step)
            .expect("Burn hands the optimizer a gradient of the parameter's shape");
        let momentum = AdaptiveMomentumState::new(time, m, v);
        (tensor, Some(AdamWState { momentum }))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        AdamWState {
            momentum: state.momentum.to_device(device),
        }
    }
}

/// The record: Burn's `AdamW` record, a state per parameter.
pub type FusedAdamWRecord<B> = RecordMap<ParamId, AdaptorRecord<AdamWRule, B>>;

/// AdamW stepping every parameter in one launch; see the [module docs](self).
#[derive(Clone)]
pub struct FusedAdamW<M, B: AutodiffBackend<InnerBackend: KernelBackend>> {
    config: FusedAdamWConfig,
    /// The moments after the last step, by groups of parameters stepped together.
    groups: Vec<Group<Inner<B>>>,
    /// States loaded from a record and not stepped since.
    pending: FusedAdamWRecord<B>,
    module: PhantomData<M>,
}

/// Parameters stepped together: they share a step count and a dtype, and their moments lie in
/// two flat buffers.
#[derive(Clone)]
struct Group<B: Backend> {
    ids: Vec<ParamId>,
    shapes: Vec<Shape>,
    layout: FlatLayout,
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
    /// Steps taken.
    time: usize,
}

/// A parameter with a gradient this step.
struct Item<B: Backend> {
    id: ParamId,
    shape: Shape,
    param: Tensor<B, 1>,
    grad: Tensor<B, 1>,
    /// Moments and steps taken, from a loaded record.
    loaded: Option<(Tensor<B, 1>, Tensor<B, 1>, usize)>,
}

impl<M, B> FusedAdamW<M, B>
where
    B: AutodiffBackend<InnerBackend: KernelBackend>,
    M: AutodiffModule<B>,
{
    /// One step with every gradient multiplied by `grad_scale` first (the guard's clipping
    /// factor), inside the same launch.
    pub fn step_scaled(
        &mut self,
        lr: LearningRate,
        module: M,
        grads: GradientsParams,
        grad_scale: f32,
    ) -> M {
        self.step_adapted(lr, module, grads.into(), grad_scale)
    }

    fn step_adapted(
        &mut self,
        lr: LearningRate,
        module: M,
        mut grads: GradAdaptor,
        grad_scale: f32,
    ) -> M {
        let mut collect = Collect::<B> {
            grads: &mut grads,
            pending: &mut self.pending,
            seen: HashSet::new(),
            items: Vec::new(),
        };
        module.visit(&mut collect);
        let items = collect.items;
        if items.is_empty() {
            return module;
        }
        let groups = match self.matching(&items) {
            true => std::mem::take(&mut self.groups),
            false => self.regroup(&items),
        };
        let mut items = items.into_iter();
        let mut updated = HashMap::new();
        let mut stepped = Vec::with_capacity(groups.len());
        for group in groups {
            let members: Vec<Item<Inner<B>>> = items.by_ref().take(group.ids.len()).collect();
            let time = group.time + 1;
            let (params, grads): (Vec<_>, Vec<_>) =
                members.into_iter().map(|i| (i.param, i.grad)).unzip();
            let (flat, m, v) = ops::adamw_many(
                params,
                grads,
                group.m,
                group.v,
                &group.layout,
                &self.config.step(lr, time),
                grad_scale,
            )
            .expect("the optimizer lays out what it steps");
            for (i, id) in group.ids.iter().enumerate() {
                let view = flat.clone().slice(group.layout.segment(i));
                updated.insert(*id, view);
            }
            stepped.push(Group {
                m,
                v,
                time,
                ..group
            });
        }
        self.groups = stepped;
        module.map(&mut Replace::<B> { updated })
    }

    /// Whether this step's parameters are the last step's groups, in order and shape: then
    /// the flat moments carry over as they are.
    fn matching(&self, items: &[Item<Inner<B>>]) -> bool {
        let ids = self.groups.iter().flat_map(|g| g.ids.iter().zip(&g.shapes));
        items.iter().all(|i| i.loaded.is_none())
            && items.len() == self.groups.iter().map(|g| g.ids.len()).sum::<usize>()
            && ids
                .zip(items)
                .all(|((id, shape), item)| *id == item.id && *shape == item.shape)
    }

    /// Lays the moments out afresh for `items`: a group per run of parameters that share a step
    /// count and a dtype, with moments from the last step, a loaded record, or zeros.
    fn regroup(&mut self, items: &[Item<Inner<B>>]) -> Vec<Group<Inner<B>>> {
        let mut previous: HashMap<ParamId, Moments<B>> = HashMap::new();
        for group in self.groups.drain(..) {
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
            let flat = |pick: fn(&Moments<B>) -> Tensor<Inner<B>, 1>| {
                let mut parts = Vec::new();
                for (i, (item, state)) in run.iter().enumerate() {
                    let len = item.shape.num_elements();
                    parts.push(match state {
                        Some(s) => pick(s).to_device(&device).cast(dtype),
                        None => Tensor::zeros([len], (&device, dtype)),
                    });
                    let pad = layout.padding(i);
                    if pad > 0 {
                        parts.push(Tensor::zeros([pad], (&device, dtype)));
                    }
                }
                if run.iter().all(|(_, s)| s.is_none()) {
                    Tensor::zeros([layout.total()], (&device, dtype))
                } else {
                    Tensor::cat(parts, 0)
                }
            };
            groups.push(Group {
                ids: run.iter().map(|(i, _)| i.id).collect(),
                shapes: run.iter().map(|(i, _)| i.shape.clone()).collect(),
                m: flat(|s| s.0.clone()),
                v: flat(|s| s.1.clone()),
                layout,
                time,
            });
        }
        groups
    }
}

/// A parameter's first and second moments, flat, and the steps they have seen.
type Moments<B> = (Tensor<Inner<B>, 1>, Tensor<Inner<B>, 1>, usize);

/// Parameters stepped together, with the moments each brings.
type Run<'a, B> = Vec<(&'a Item<Inner<B>>, Option<Moments<B>>)>;

/// Takes each parameter's gradient (and loaded state) in visiting order, once per parameter.
struct Collect<'a, B: AutodiffBackend<InnerBackend: KernelBackend>> {
    grads: &'a mut GradAdaptor,
    pending: &'a mut FusedAdamWRecord<B>,
    seen: HashSet<ParamId>,
    items: Vec<Item<Inner<B>>>,
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
        });
    }
}

/// Puts each stepped parameter's new value (a view of the flat result) in place.
struct Replace<B: AutodiffBackend> {
    updated: HashMap<ParamId, Tensor<Inner<B>, 1>>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Replace<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let tensor = match self.updated.get(&id) {
            Some(flat) => {
                let mut new = Tensor::from_inner(flat.clone().reshape(tensor.shape()));
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

/// The record of one parameter's moments, whatever its rank.
fn record_of<B: AutodiffBackend<InnerBackend: KernelBackend>>(
    shape: &Shape,
    m: Tensor<Inner<B>, 1>,
    v: Tensor<Inner<B>, 1>,
    time: usize,
) -> AdaptorRecord<AdamWRule, B> {
    fn ranked<B: AutodiffBackend<InnerBackend: KernelBackend>, const D: usize>(
        shape: &Shape,
        m: Tensor<Inner<B>, 1>,
        v: Tensor<Inner<B>, 1>,
        time: usize,
    ) -> AdaptorRecord<AdamWRule, B> {
        let momentum = AdaptiveMomentumState::new(
            time,
            m.reshape(shape.clone().dims::<D>()),
            v.reshape(shape.clone().dims::<D>()),
        );
        AdaptorRecord::from_state::<D>(AdamWState { momentum })
    }
    match shape.num_dims() {
        1 => ranked::<B, 1>(shape, m, v, time),
        2 => ranked::<B, 2>(shape, m, v, time),
        3 => ranked::<B, 3>(shape, m, v, time),
        4 => ranked::<B, 4>(shape, m, v, time),
        5 => ranked::<B, 5>(shape, m, v, time),
        6 => ranked::<B, 6>(shape, m, v, time),
        7 => ranked::<B, 7>(shape, m, v, time),
        8 => ranked::<B, 8>(shape, m, v, time),
        rank => unreachable!("Burn's parameters have 1 to 8 dimensions, not {rank}"),
    }
}

impl<M, B> Optimizer<M, B> for FusedAdamW<M, B>
where
    B: AutodiffBackend<InnerBackend: KernelBackend>,
    M: AutodiffModule<B>,
{
    type Record = FusedAdamWRecord<B>;

    fn step(&mut self, lr: LearningRate, module: M, grads: GradientsParams) -> M {
        self.step_adapted(lr, module, grads.into(), 1.0)
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        self.step_adapted(lr, module, grads.into(), 1.0)
    }

    fn to_record(&self) -> Self::Record {
        let mut record = self.pending.clone();
        for group in &self.groups {
            for (i, (id, shape)) in group.ids.iter().zip(&group.shapes).enumerate() {
                let segment = group.layout.segment(i);
                let m = group.m.clone().slice(segment.clone());
                let v = group.v.clone().slice(segment);
                record.insert(*id, record_of::<B>(shape, m, v, group.time));
            }
        }
        record
    }

    fn load_record(mut self, record: Self::Record) -> Self {
        self.groups.clear();
        self.pending = record;
        self
    }
}
