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

mod copies;
mod groups;
mod record;
mod rule;

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;

use burn::config::Config;
use burn::module::AutodiffModule;
use burn::optim::adaptor::GradAdaptor;
use burn::optim::{GradientsParams, LearningRate, MultiGradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, FloatDType};
use hashbrown::HashMap as RecordMap;

pub use self::copies::LowCopies;
use self::groups::{Collect, Group, Item, Replace, matching, regroup};
use self::record::record_of;
pub use self::rule::{AdamWRule, FusedAdamWRecord};
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
            copies: None,
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

/// AdamW stepping every parameter in one launch; see the [module docs](self).
#[derive(Clone)]
pub struct FusedAdamW<M, B: AutodiffBackend<InnerBackend: KernelBackend>> {
    config: FusedAdamWConfig,
    /// The moments after the last step, by groups of parameters stepped together.
    groups: Vec<Group<Inner<B>>>,
    /// States loaded from a record and not stepped since.
    pending: FusedAdamWRecord<B>,
    /// Where it leaves mixed precision's copies of the f32 parameters it steps, when on.
    copies: Option<LowCopies>,
    module: PhantomData<M>,
}

impl<M, B> FusedAdamW<M, B>
where
    B: AutodiffBackend<InnerBackend: KernelBackend>,
    M: AutodiffModule<B>,
{
    /// This optimizer, writing a compute-dtype copy of the f32 parameters it steps into
    /// `copies` whenever they are on: mixed precision reads them instead of casting.
    pub fn with_low_copies(mut self, copies: LowCopies) -> Self {
        self.share_low_copies(copies);
        self
    }

    /// [`Self::with_low_copies`] in place.
    pub fn share_low_copies(&mut self, copies: LowCopies) {
        self.copies = Some(copies);
    }

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
        let on = self.copies.clone().filter(LowCopies::is_on);
        let mut collect = Collect::<B> {
            grads: &mut grads,
            pending: &mut self.pending,
            copies: on.as_ref(),
            seen: HashSet::new(),
            items: Vec::new(),
        };
        module.visit(&mut collect);
        let items = collect.items;
        // Copies are of use only where the model can tell its parameter is still the tensor a
        // copy was made from: a backend that does not see a tensor equal its own clone (the
        // plain CubeCL backends) casts instead.
        let copies = on.filter(|_| {
            items
                .first()
                .is_some_and(|i| ops::same_tensor(&i.param, &i.param.clone()))
        });
        if items.is_empty() {
            return module;
        }
        let last = std::mem::take(&mut self.groups);
        let groups = if matching::<B>(&last, &items) {
            last
        } else {
            regroup::<B>(last, &items)
        };
        let mut items = items.into_iter();
        let mut updated = HashMap::new();
        let mut lows = HashMap::new();
        let mut stepped = Vec::with_capacity(groups.len());
        for group in groups {
            let members: Vec<Item<Inner<B>>> = items.by_ref().take(group.ids.len()).collect();
            let time = group.time + 1;
            let current = members.iter().all(|i| i.current);
            let (params, grads): (Vec<_>, Vec<_>) =
                members.into_iter().map(|i| (i.param, i.grad)).unzip();
            let step = self.config.step(lr, time);
            // Copies of f32 parameters only (a bf16 or f16 parameter is its own copy), made
            // from the last step's flat output while the model's parameters are still its
            // views: read in one binding, the copy's buffer costs wgpu no launch.
            let last = group.last.clone().filter(|_| current);
            let copy = copies
                .as_ref()
                .filter(|c| group.m.dtype() == DType::F32 && c.dtype() != FloatDType::F32)
                .filter(|_| last.is_some())
                .map(|c| {
                    let device = group.m.device();
                    let align = Inner::<B>::flat_alignment(&device, c.dtype().into());
                    (
                        FlatLayout::new(group.layout.lens().to_vec(), align),
                        c.dtype(),
                    )
                });
            let (flat, m, v) = match (&copy, last) {
                (None, _) | (_, None) => ops::adamw_many(
                    params,
                    grads,
                    group.m,
                    group.v,
                    &group.layout,
                    &step,
                    grad_scale,
                )
                .expect("the optimizer lays out what it steps"),
                (Some((layout, dtype)), Some(last)) => {
                    let [flat, m, v, low] = ops::adamw_many_copy(
                        last,
                        grads,
                        group.m,
                        group.v,
                        &group.layout,
                        &step,
                        grad_scale,
                        (layout, *dtype),
                    )
                    .expect("the optimizer lays out what it steps");
                    let low = ops::flat_segments(low, layout);
                    lows.extend(group.ids.iter().copied().zip(low));
                    (flat, m, v)
                }
            };
            let views = ops::flat_segments(flat.clone(), &group.layout);
            updated.extend(group.ids.iter().copied().zip(views));
            stepped.push(Group {
                m,
                v,
                time,
                last: copies.is_some().then_some(flat),
                ..group
            });
        }
        self.groups = stepped;
        module.map(&mut Replace::<B> {
            updated,
            lows,
            copies,
        })
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
