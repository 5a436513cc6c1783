//! Which replica owns which parameter when the optimizer state is split among the replicas
//! (ZeRO-1, ZeRO-2 which also reduces each gradient to its owner alone, and ZeRO-3 which also
//! releases the others' parameters between steps): the owner alone keeps the parameter's
//! optimizer state and steps it, then broadcasts the new value to the others (after the step,
//! or under ZeRO-3 before the next forward).
//!
//! Ownership is by whole parameters, not by flat slices of the buckets as DeepSpeed cuts them:
//! Burn's optimizers keep their state per parameter and step whatever parameters the gradients
//! name, so an owner steps its parameters with the optimizer unchanged (Burn's, the fused
//! AdamW, a user's), and a checkpoint's state is the ordinary per-parameter record. The price
//! is balance: a part is within one parameter of `1 / dp` of the elements, and a model whose
//! largest parameter outweighs a replica's share (an embedding over few replicas) leaves that
//! owner heavier.

use std::collections::HashSet;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{FloatDType, Tensor, backend::AutodiffBackend};

use super::{BucketPlan, broadcast_parameters_in};
use crate::collective::{Collective, CollectiveError};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Each replica's parameters, and the buckets its broadcast sends them in.
#[derive(Debug, Clone)]
pub(crate) struct Owners {
    /// Per replica, the plan of the parameters it owns, in the module's order.
    parts: Vec<BucketPlan>,
    /// The parameters this replica owns.
    mine: HashSet<ParamId>,
    /// This replica.
    rank: usize,
    /// Whether each owner alone receives its parameters' reduced gradients (ZeRO-2).
    gradients: bool,
    /// Whether each replica holds only its own parameters between steps (ZeRO-3).
    parameters: bool,
    /// Under ZeRO-1 and ZeRO-2 with mixed precision, the compute dtype each replica holds the
    /// others' parameters in (their owners keep the f32 masters).
    others_dtype: Option<FloatDType>,
    /// The largest bucket of a broadcast.
    cap_bytes: usize,
}

impl Owners {
    /// Splits `plan`'s parameters among `replicas` by elements (the optimizer state's size:
    /// AdamW keeps two f32 moments per element whatever the parameter's dtype), largest first,
    /// each to the replica with the fewest so far (ties to the lowest rank). Every replica
    /// computes the same split from the same plan. The gradients are reduced to every replica
    /// and the parameters kept whole: see [`Self::reducing_gradients`] and
    /// [`Self::releasing_parameters`] for ZeRO-2 and ZeRO-3.
    pub(crate) fn new(plan: &BucketPlan, replicas: usize, rank: usize, cap_bytes: usize) -> Self {
        let mut order: Vec<usize> = (0..plan.slots.len()).collect();
        // Stable: equal sizes keep the module's order, so the split is the same everywhere.
        order.sort_by_key(|&i| std::cmp::Reverse(plan.slots[i].numel));
        let mut load = vec![0usize; replicas];
        let mut owner = vec![0usize; plan.slots.len()];
        for i in order {
            let least = (0..replicas)
                .min_by_key(|&r| (load[r], r))
                .expect("at least one replica");
            owner[i] = least;
            load[least] += plan.slots[i].numel;
        }
        let owner_of = |id: ParamId| owner[plan.index[&id]];
        let parts = (0..replicas)
            .map(|r| plan.subset(|id| owner_of(id) == r, cap_bytes))
            .collect();
        let mine = plan
            .slots
            .iter()
            .filter(|s| owner_of(s.id) == rank)
            .map(|s| s.id)
            .collect();
        Self {
            parts,
            mine,
            rank,
            gradients: false,
            parameters: false,
            others_dtype: None,
            cap_bytes,
        }
    }

    /// With `yes`, the gradients are reduced to their owners ([`super::reduce_to_owners`])
    /// instead of to every replica (ZeRO-2).
    pub(crate) fn reducing_gradients(self, yes: bool) -> Self {
        Self {
            gradients: yes,
            ..self
        }
    }

    /// With `yes`, each replica holds only its own parameters between steps (ZeRO-3): the
    /// others are [released](Self::release) after the step and [gathered](Self::broadcast)
    /// before the next forward, in place of the broadcast after the step.
    pub(crate) fn releasing_parameters(self, yes: bool) -> Self {
        Self {
            parameters: yes,
            ..self
        }
    }

    /// With `dtype` (a mixed-precision model's compute dtype), each replica holds the others'
    /// parameters in it between steps: the owners keep the f32 master weights of their parts
    /// and send each other replica the copy its forward reads, the same bits its own cast
    /// would make. Under ZeRO-3 the released parameters' placeholders are in `dtype`, which
    /// mixed precision takes as they are instead of casting a whole copy of each.
    pub(crate) fn holding_others_in(self, dtype: Option<FloatDType>) -> Self {
        Self {
            others_dtype: dtype,
            ..self
        }
    }

    /// The dtype the replica holds the others' parameters in, where it is not theirs.
    pub(crate) fn others_dtype(&self) -> Option<FloatDType> {
        self.others_dtype
    }

    /// Whether each owner alone receives its parameters' reduced gradients (ZeRO-2).
    pub(crate) fn reduces_gradients(&self) -> bool {
        self.gradients
    }

    /// Whether each replica holds only its own parameters between steps (ZeRO-3).
    pub(crate) fn releases_parameters(&self) -> bool {
        self.parameters
    }

    /// Per replica, the plan of the parameters it owns, in rank order.
    pub(crate) fn parts(&self) -> &[BucketPlan] {
        &self.parts
    }

    /// This replica.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// Bytes of this replica's parameters' gradients (in the parameters' dtypes).
    pub(crate) fn my_grad_bytes(&self) -> usize {
        self.parts[self.rank].slots.iter().map(|s| s.bytes).sum()
    }

    /// The parameters this replica owns.
    pub(crate) fn mine(&self) -> &HashSet<ParamId> {
        &self.mine
    }

    /// Bytes of the parameters other replicas own: what [`Self::release`] frees.
    pub(crate) fn others_bytes(&self) -> usize {
        let all: usize = self
            .parts
            .iter()
            .flat_map(|p| &p.slots)
            .map(|s| s.bytes)
            .sum();
        all - self.my_grad_bytes()
    }

    /// Elements each replica owns, in rank order.
    pub(crate) fn elements(&self) -> Vec<usize> {
        self.parts
            .iter()
            .map(|p| p.bucket_elements().iter().sum())
            .collect()
    }

    /// `grads` with only this replica's parameters' gradients: what its optimizer steps.
    pub(crate) fn keep_mine<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        module: &M,
        mut grads: GradientsParams,
    ) -> GradientsParams {
        module.visit(&mut DropOthers::<B> {
            mine: &self.mine,
            grads: &mut grads,
            backend: std::marker::PhantomData,
        });
        grads
    }

    /// The owned parameters `module` holds (the whole model, or one unit of it) from their
    /// owners: one broadcast per bucket of each owner's parameters in `module`, in rank order,
    /// so every replica ends with the owners' values bit for bit. A released parameter's
    /// placeholder only sizes the buffer that receives it. Every replica calls this with the
    /// same part of the model.
    ///
    /// # Errors
    /// The first [`CollectiveError`]; the group is then poisoned.
    pub(crate) fn broadcast<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        module: M,
        collective: &mut dyn Collective<Inner<B>>,
    ) -> Result<M, CollectiveError> {
        let held = param_ids::<B, M>(&module);
        self.broadcast_held(module, &held, collective)
    }

    /// [`Self::broadcast`] of `module`, whose parameters' ids are `held`.
    pub(crate) fn broadcast_held<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        module: M,
        held: &HashSet<ParamId>,
        collective: &mut dyn Collective<Inner<B>>,
    ) -> Result<M, CollectiveError> {
        self.broadcast_parts(module, Some(held), collective, None)
    }

    /// After the owners' step (ZeRO-1 and ZeRO-2): every owner's parameters broadcast to the
    /// others, as they are or, where the replicas [hold the others in the compute
    /// dtype](Self::holding_others_in), cast to it (the owner keeps its f32 values).
    ///
    /// # Errors
    /// The first [`CollectiveError`]; the group is then poisoned.
    pub(crate) fn share_stepped<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        module: M,
        collective: &mut dyn Collective<Inner<B>>,
    ) -> Result<M, CollectiveError> {
        self.broadcast_parts(module, None, collective, self.others_dtype)
    }

    /// Each owner's parameters (those of `held` alone where given) broadcast from it, one
    /// broadcast per bucket, in rank order; cast to `dtype` first where given, and then kept
    /// by the owner as they were.
    fn broadcast_parts<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        mut module: M,
        held: Option<&HashSet<ParamId>>,
        collective: &mut dyn Collective<Inner<B>>,
        dtype: Option<FloatDType>,
    ) -> Result<M, CollectiveError> {
        for (root, part) in self.parts.iter().enumerate() {
            let part = match held {
                Some(held) if !part.slots.iter().all(|s| held.contains(&s.id)) => {
                    std::borrow::Cow::Owned(part.subset(|id| held.contains(&id), self.cap_bytes))
                }
                _ => std::borrow::Cow::Borrowed(part),
            };
            if part.num_params() > 0 {
                let replace = root != self.rank || dtype.is_none();
                module = broadcast_parameters_in(module, &part, collective, root, dtype, replace)?;
            }
        }
        Ok(module)
    }

    /// `module` with every parameter another replica owns cast to the dtype the replica holds
    /// the others' in ([`Self::holding_others_in`]); `module` as it is without one, and under
    /// ZeRO-3, which [releases](Self::release) them instead.
    pub(crate) fn lower<B: AutodiffBackend, M: AutodiffModule<B>>(&self, module: M) -> M {
        match self.others_dtype.is_some() && !self.parameters {
            true => module.map(&mut Others::<B> {
                owners: self,
                release: false,
                backend: std::marker::PhantomData,
            }),
            false => module,
        }
    }

    /// Bytes the replica frees by holding the others' parameters in their compute dtype
    /// instead of f32, or by releasing them (ZeRO-3).
    pub(crate) fn freed_bytes(&self) -> usize {
        let others = self.others_bytes();
        match (self.parameters, self.others_dtype) {
            (true, _) => others,
            // The others' parameters are f32 masters: a 2-byte copy keeps half of each.
            (false, Some(dtype)) => others - others / 4 * burn::tensor::DType::from(dtype).size(),
            (false, None) => 0,
        }
    }

    /// `module` with every parameter another replica owns replaced by a placeholder of its
    /// shape, dtype (the compute dtype where the replica holds the others' parameters in it)
    /// and `require_grad` that holds one element: a zero broadcast to the shape,
    /// a view with zero strides on Burn's backends. Only [`Self::broadcast`] reads it, for its
    /// shape, and replaces it with the owner's value.
    pub(crate) fn release<B: AutodiffBackend, M: AutodiffModule<B>>(&self, module: M) -> M {
        module.map(&mut Others::<B> {
            owners: self,
            release: true,
            backend: std::marker::PhantomData,
        })
    }

    /// Whether `id` is a parameter another replica owns (released under ZeRO-3).
    pub(crate) fn is_others(&self, id: ParamId) -> bool {
        !self.mine.contains(&id) && self.parts.iter().any(|p| p.index.contains_key(&id))
    }
}

/// The ids of `module`'s float parameters.
pub(crate) fn param_ids<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) -> HashSet<ParamId> {
    struct Ids<'a, B> {
        ids: &'a mut HashSet<ParamId>,
        backend: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Ids<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.ids.insert(param.id);
        }
    }
    let mut ids = HashSet::new();
    module.visit(&mut Ids::<B> {
        ids: &mut ids,
        backend: std::marker::PhantomData,
    });
    ids
}

/// Maps every parameter another replica owns, keeping its id, shape and `require_grad`: in the
/// compute dtype where the replica holds the others' parameters in it, and with `release` a
/// one-element placeholder ([`Owners::release`]), else the value cast ([`Owners::lower`]).
struct Others<'a, B: AutodiffBackend> {
    owners: &'a Owners,
    release: bool,
    backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Others<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if !self.owners.is_others(param.id) {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let dtype = match self.owners.others_dtype {
            Some(dtype) => dtype.into(),
            None => tensor.dtype(),
        };
        let value = match self.release {
            true => {
                let (dims, device) = (tensor.dims(), tensor.device());
                // Dropping `tensor` here frees the value once no other handle holds it.
                drop(tensor);
                Tensor::<Inner<B>, D>::zeros([1; D], (&device, dtype)).expand(dims)
            }
            false => tensor.inner().cast(dtype),
        };
        Param::from_mapped_value(
            id,
            Tensor::from_inner(value).set_require_grad(require_grad),
            mapper,
        )
    }
}

struct DropOthers<'a, B: AutodiffBackend> {
    mine: &'a HashSet<ParamId>,
    grads: &'a mut GradientsParams,
    backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for DropOthers<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !self.mine.contains(&param.id) {
            self.grads.remove::<Inner<B>, D>(param.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::backend::Backend;

    use super::*;
    use crate::grads::ParamSelection;

    type B = Autodiff<Flex>;

    #[derive(Module, Debug)]
    struct Widths<B: Backend> {
        layers: Vec<Linear<B>>,
    }

    /// Layers of `widths[i] × 4` weights and 4 biases.
    fn widths(widths: &[usize]) -> Widths<B> {
        let device = Default::default();
        Widths {
            layers: widths
                .iter()
                .map(|&w| LinearConfig::new(w, 4).init(&device))
                .collect(),
        }
    }

    #[test]
    fn every_parameter_has_one_owner_and_the_parts_are_balanced() {
        let model = widths(&[64, 1, 8, 16, 2, 32, 4]);
        let plan = BucketPlan::new(&model, 1 << 20, ParamSelection::Trainable);
        for replicas in 1..=4 {
            let owners: Vec<Owners> = (0..replicas)
                .map(|r| Owners::new(&plan, replicas, r, 1 << 20))
                .collect();
            let mut seen = HashSet::new();
            for o in &owners {
                assert_eq!(
                    o.elements(),
                    owners[0].elements(),
                    "every rank splits alike"
                );
                for id in o.mine() {
                    assert!(seen.insert(*id), "a parameter with two owners");
                }
            }
            assert_eq!(
                seen.len(),
                plan.num_params(),
                "a parameter without an owner"
            );
            let elements = owners[0].elements();
            let total: usize = elements.iter().sum();
            let largest = plan.slots.iter().map(|s| s.numel).max().unwrap();
            let (lo, hi) = (
                elements.iter().min().unwrap(),
                elements.iter().max().unwrap(),
            );
            assert_eq!(total, plan.bucket_elements().iter().sum::<usize>());
            // Largest-first to the lightest part: parts differ by at most one parameter.
            assert!(hi - lo <= largest, "{elements:?}");
        }
    }

    #[test]
    fn release_keeps_a_placeholder_and_a_gather_restores_the_owners_values() {
        use burn::backend::flex::FlexTensor;
        use burn::tensor::TensorPrimitive;

        /// The storage behind a parameter's value.
        fn storage<const D: usize>(param: &Param<Tensor<B, D>>) -> FlexTensor {
            match param.val().inner().into_primitive() {
                TensorPrimitive::Float(t) => t,
                TensorPrimitive::QFloat(_) => unreachable!("float parameters"),
            }
        }
        let model = widths(&[64, 48, 32]);
        let plan = BucketPlan::new(&model, 1 << 20, ParamSelection::Trainable);
        let replicas = 2;
        let owners: Vec<Owners> = (0..replicas)
            .map(|r| Owners::new(&plan, replicas, r, 1 << 20).releasing_parameters(true))
            .collect();
        let handles = crate::collective::InProcess::<Flex>::group(
            replicas,
            std::time::Duration::from_secs(10),
        );
        let gathered: Vec<Widths<B>> = std::thread::scope(|s| {
            let jobs: Vec<_> = handles
                .into_iter()
                .zip(&owners)
                .map(|(mut group, owners)| {
                    let model = model.clone();
                    s.spawn(move || {
                        let dims: Vec<_> = model.layers.iter().map(|l| l.weight.dims()).collect();
                        let released = owners.release::<B, _>(model);
                        for (layer, dims) in released.layers.iter().zip(dims) {
                            let mine = owners.mine().contains(&layer.weight.id);
                            // The placeholder holds one element, with the value's shape.
                            let bytes = storage(&layer.weight).bytes().len();
                            assert_eq!(bytes <= 4, !mine, "{bytes} bytes held");
                            assert_eq!(layer.weight.dims(), dims);
                            assert!(layer.weight.val().is_require_grad());
                        }
                        owners.broadcast::<B, _>(released, &mut group).unwrap()
                    })
                })
                .collect();
            jobs.into_iter().map(|j| j.join().unwrap()).collect()
        });
        for replica in gathered {
            for (got, want) in replica.layers.iter().zip(&model.layers) {
                assert_eq!(
                    got.weight.val().into_data(),
                    want.weight.val().into_data(),
                    "gathered from its owner, bit for bit"
                );
            }
        }
    }

    #[test]
    fn keep_mine_drops_the_gradients_of_other_owners() {
        let model = widths(&[3, 5, 7]);
        let plan = BucketPlan::new(&model, 1 << 20, ParamSelection::Trainable);
        let owners = Owners::new(&plan, 2, 1, 1 << 20);
        let device = Default::default();
        let loss = model
            .layers
            .iter()
            .map(|l| {
                l.forward(Tensor::<B, 2>::ones([2, l.weight.dims()[0]], &device))
                    .sum()
            })
            .reduce(|a, b| a + b)
            .unwrap();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        assert_eq!(grads.len(), 6);
        let mine = owners.mine().len();
        assert!(0 < mine && mine < 6, "{mine} of 6 parameters");
        assert_eq!(owners.keep_mine::<B, _>(&model, grads).len(), mine);
    }
}
