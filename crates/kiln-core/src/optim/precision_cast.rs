//! Mixed precision's two casts, each one pass over every parameter: the model's f32 parameters
//! to the compute dtype before the forward, and the gradients back to f32 after the backward.
//!
//! Cast one by one (as autodiff records a cast per parameter, whose backward casts each
//! gradient back), a model of `n` parameters launches `2n` cast kernels a step on a GPU, which
//! made bf16 steps slower than f32 ones. Here each direction is one multi-tensor kernel
//! ([`kiln_kernels::ops::cast_many`]): the low-precision parameters are leaves of the graph of
//! their own, and their gradients, all of them at once, become the f32 parameters'. The values
//! are the same as through autodiff's casts: a gradient cast from bf16 or f16 to f32 is exact.
//!
//! A parameter the fused AdamW stepped last and left a copy of ([`LowCopies`]) is not cast at
//! all: its copy was rounded from the same f32 values in the step's own pass.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{FloatDType, Tensor};
use kiln_kernels::{KernelBackend, LowCopies, ops};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// `model` with every float parameter cast to `dtype` (ids kept), each a leaf of the graph
/// that requires a gradient where the parameter does: the copy's gradients are the model's, in
/// `dtype` ([`grads_to_f32`] brings them back). A parameter with a copy in `copies` made from
/// it as it is takes that copy, and one held in `dtype` already (a replica's copy of a
/// parameter another replica owns, [`DdpConfig::compute_dtype`](crate::plan::DdpConfig)) is
/// taken as it is; the others are cast in one pass.
pub(crate) fn low_precision_copy<B, M>(
    model: &M,
    dtype: FloatDType,
    copies: Option<&LowCopies>,
) -> M
where
    B: AutodiffBackend<InnerBackend: KernelBackend>,
    M: AutodiffModule<B>,
{
    let mut params = Params::<B> {
        dtype,
        as_is: HashSet::new(),
        copies: copies.filter(|c| c.dtype() == dtype),
        seen: HashSet::new(),
        ids: Vec::new(),
        tensors: Vec::new(),
        frozen: Vec::new(),
        copied: HashMap::new(),
    };
    model.visit(&mut params);
    let mut low = params.copied;
    if let Some(device) = params.tensors.first().map(Tensor::device) {
        let cast = ops::cast_many(params.tensors, dtype, &device);
        // A frozen parameter (a LoRA model's base) never changes: its copy serves every later
        // step while the parameter is the same tensor, instead of a cast of the whole base in
        // each. The optimizer writes the trained ones' copies itself.
        for (frozen, copy) in params.frozen.into_iter().zip(&cast) {
            if let (Some(copies), Some(keep)) = (params.copies, frozen) {
                keep(copies, copy.clone());
            }
        }
        low.extend(params.ids.into_iter().zip(cast));
    }
    if low.is_empty() && params.as_is.is_empty() {
        return model.clone();
    }
    model.clone().map(&mut Leaves::<B> {
        low,
        as_is: params.as_is,
        made: HashMap::new(),
    })
}

/// The gradients of `low` (a copy [`low_precision_copy`] made) in f32, under the same ids,
/// cast in one pass.
pub(crate) fn grads_to_f32<B, M>(low: &M, grads: GradientsParams) -> GradientsParams
where
    B: AutodiffBackend<InnerBackend: KernelBackend>,
    M: AutodiffModule<B>,
{
    let mut taken = Grads::<B> {
        grads,
        seen: HashSet::new(),
        ids: Vec::new(),
        tensors: Vec::new(),
    };
    low.visit(&mut taken);
    let Some(device) = taken.tensors.first().map(Tensor::device) else {
        return taken.grads;
    };
    let full = ops::cast_many(taken.tensors, FloatDType::F32, &device);
    let mut back = Register::<B> {
        grads: taken.grads,
        full: taken.ids.into_iter().zip(full).collect(),
        backend: PhantomData,
    };
    low.visit(&mut back);
    back.grads
}

/// What keeps a frozen parameter's copy in the copies, once it is made.
type KeepCopy<B> = Box<dyn FnOnce(&LowCopies, Tensor<Inner<B>, 1>)>;

/// Every float parameter once, in visiting order: its copy where `copies` holds one made from
/// it, itself where it is in the compute dtype already, else flattened to be cast (and, for a
/// frozen one, how to keep its copy).
struct Params<'a, B: AutodiffBackend> {
    dtype: FloatDType,
    as_is: HashSet<ParamId>,
    copies: Option<&'a LowCopies>,
    seen: HashSet<ParamId>,
    ids: Vec<ParamId>,
    tensors: Vec<Tensor<Inner<B>, 1>>,
    frozen: Vec<Option<KeepCopy<B>>>,
    copied: HashMap<ParamId, Tensor<Inner<B>, 1>>,
}

impl<B: AutodiffBackend<InnerBackend: KernelBackend>> ModuleVisitor<B> for Params<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.seen.insert(param.id) {
            let tensor = param.val().inner();
            if let Some(copy) = self.copies.and_then(|c| c.copy_of(param.id, &tensor)) {
                self.copied.insert(param.id, copy);
                return;
            }
            let numel = tensor.shape().num_elements();
            if tensor.dtype() == self.dtype.into() {
                // As it is, not flattened: a released parameter's placeholder (a zero-stride
                // view of one element) stays one.
                self.as_is.insert(param.id);
                return;
            }
            let id = param.id;
            let frozen = !param.val().is_require_grad();
            self.frozen.push(frozen.then(|| {
                let kept = tensor.clone();
                Box::new(move |copies: &LowCopies, copy| copies.keep(id, kept, Some(copy)))
                    as KeepCopy<B>
            }));
            self.ids.push(id);
            self.tensors.push(tensor.reshape([numel]));
        }
    }
}

/// Every parameter's gradient, taken out of `grads` and flattened, in visiting order.
struct Grads<B: AutodiffBackend> {
    grads: GradientsParams,
    seen: HashSet<ParamId>,
    ids: Vec<ParamId>,
    tensors: Vec<Tensor<Inner<B>, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Grads<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !self.seen.insert(param.id) {
            return;
        }
        if let Some(grad) = self.grads.remove::<Inner<B>, D>(param.id) {
            let numel = grad.shape().num_elements();
            self.ids.push(param.id);
            self.tensors.push(grad.reshape([numel]));
        }
    }
}

/// Puts the f32 gradients back under their parameters' ids, in their shapes.
struct Register<B: AutodiffBackend> {
    grads: GradientsParams,
    full: HashMap<ParamId, Tensor<Inner<B>, 1>>,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Register<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.full.remove(&param.id) {
            self.grads
                .register::<Inner<B>, D>(param.id, grad.reshape(param.shape()));
        }
    }
}

/// Replaces each parameter with its low-precision copy as a leaf; a parameter used twice (tied)
/// gets the same leaf both times, so that both uses' gradients add up in it.
struct Leaves<B: AutodiffBackend> {
    low: HashMap<ParamId, Tensor<Inner<B>, 1>>,
    /// Parameters in the compute dtype already, each its own leaf as it is.
    as_is: HashSet<ParamId>,
    made: HashMap<ParamId, Box<dyn Any>>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Leaves<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let leaf = match self
            .made
            .get(&id)
            .and_then(|t| t.downcast_ref::<Tensor<B, D>>())
        {
            Some(leaf) => leaf.clone(),
            None => {
                let low = match self.as_is.contains(&id) {
                    true => tensor.clone().inner(),
                    false => self
                        .low
                        .remove(&id)
                        .expect("every parameter was cast")
                        .reshape(tensor.shape()),
                };
                let mut leaf = Tensor::from_inner(low);
                if tensor.is_require_grad() {
                    leaf = leaf.require_grad();
                }
                self.made.insert(id, Box::new(leaf.clone()));
                leaf
            }
        };
        Param::from_mapped_value(id, leaf, mapper)
    }
}
