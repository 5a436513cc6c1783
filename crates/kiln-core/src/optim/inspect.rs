//! Passes over a module's gradients: their squared norms (which also reveal non-finite
//! values), scaling them, and naming a parameter by its module path.
//!
//! Parameters are identified across ranks by their *ordinal*: the position of the parameter's
//! first visit in the module's visiting order. Every replica of a model visits in the same
//! order, so an ordinal found on one rank names the same parameter on all of them.

use std::collections::HashSet;
use std::marker::PhantomData;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{ElementConversion, Tensor, backend::AutodiffBackend};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// `Σ g²` over every gradient of `module` in `grads`, as one reduction in a fixed order
/// ([`ordered_sum`]): the gradients are flattened into one vector first, so the cost is a few
/// ops and one read whatever the number of parameters (a reduction per parameter costs more in dispatch than in arithmetic at the
/// sizes Kiln trains on the CPU). Non-finite exactly when a gradient is (or when the sum
/// overflows f32). The copy is transient and as large as the gradients.
///
/// Parameters in `skip` are left out: a tensor-parallel shard other than the first skips the
/// parameters every shard holds whole, which shard 0 counts for all.
pub(crate) fn total_squares<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &GradientsParams,
    skip: Option<&HashSet<ParamId>>,
) -> f64 {
    let mut visitor = Flatten::<B> {
        grads,
        seen: skip.cloned().unwrap_or_default(),
        flats: Vec::new(),
    };
    module.visit(&mut visitor);
    if visitor.flats.is_empty() {
        return 0.0;
    }
    let sum: f32 = ordered_sum(Tensor::cat(visitor.flats, 0).square())
        .into_scalar()
        .elem();
    f64::from(sum)
}

/// [`total_squares`] on the fused kernels: one multi-tensor pass over the gradients (a launch
/// per chunk of tensors the runtime binds at once, then one for the total), no copy of them.
/// The kernel sums the finite squares and counts the non-finite values; a count above zero
/// makes the result NaN, as the plain sum would be.
pub(crate) fn fused_squares<B, M>(
    module: &M,
    grads: &GradientsParams,
    skip: Option<&HashSet<ParamId>>,
) -> f64
where
    B: AutodiffBackend<InnerBackend: kiln_kernels::KernelBackend>,
    M: AutodiffModule<B>,
{
    let mut visitor = Flatten::<B> {
        grads,
        seen: skip.cloned().unwrap_or_default(),
        flats: Vec::new(),
    };
    module.visit(&mut visitor);
    let Some(device) = visitor.flats.first().map(Tensor::device) else {
        return 0.0;
    };
    let report = kiln_kernels::ops::grad_norm(visitor.flats, &device);
    if report.non_finite > 0 {
        f64::NAN
    } else {
        f64::from(report.sq_norm)
    }
}

/// The sum of `t` in an order fixed by its length alone: the same on every run and every rank.
///
/// `Tensor::sum` gives no such promise. CubeCL's full sum on CUDA adds with float atomics in
/// whatever order the cubes finish, so Ddp replicas that hold bit-identical gradients could
/// compute norms that differ in the last bit, clip by different factors and drift apart.
/// `sum_dim` reduces each output in a fixed order on every backend; summing rows of `CHUNK`
/// values and then the row sums keeps many units busy on a GPU, with no atomics.
fn ordered_sum<B: burn::tensor::backend::Backend>(mut t: Tensor<B, 1>) -> Tensor<B, 1> {
    const CHUNK: usize = 1024;
    loop {
        let n = t.dims()[0];
        if n <= CHUNK {
            return t.sum_dim(0);
        }
        let rows = n.div_ceil(CHUNK);
        let pad = rows * CHUNK - n;
        if pad > 0 {
            let zeros = Tensor::zeros([pad], &t.device());
            t = Tensor::cat(vec![t, zeros], 0);
        }
        t = t.reshape([rows, CHUNK]).sum_dim(1).reshape([rows]);
    }
}

struct Flatten<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    seen: HashSet<ParamId>,
    flats: Vec<Tensor<Inner<B>, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !self.seen.insert(param.id) {
            return;
        }
        if let Some(grad) = self.grads.get::<Inner<B>, D>(param.id) {
            let numel = grad.shape().num_elements();
            self.flats.push(grad.reshape([numel]));
        }
    }
}

/// The squared L2 norm of each gradient of `module` found in `grads`, as
/// `(ordinal, Σ g²)` in visiting order.
///
/// One reduction per gradient, then a single read of all of them. The guard runs it only to
/// find which gradient made [`total_squares`] non-finite: one holding a NaN or ±Inf has a
/// non-finite sum of squares; so does a finite one whose squares overflow f32 (|g| > 1.8e19).
pub(crate) fn grad_squares<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &GradientsParams,
) -> Vec<(usize, f32)> {
    let mut visitor = Squares::<B> {
        grads,
        seen: HashSet::new(),
        ordinals: Vec::new(),
        sums: Vec::new(),
    };
    module.visit(&mut visitor);
    if visitor.sums.is_empty() {
        return Vec::new();
    }
    let values = Tensor::cat(visitor.sums, 0)
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("sums of squares convert to f32");
    visitor.ordinals.into_iter().zip(values).collect()
}

struct Squares<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    seen: HashSet<ParamId>,
    ordinals: Vec<usize>,
    sums: Vec<Tensor<Inner<B>, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Squares<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let ordinal = self.seen.len();
        if !self.seen.insert(param.id) {
            return;
        }
        if let Some(grad) = self.grads.get::<Inner<B>, D>(param.id) {
            self.ordinals.push(ordinal);
            self.sums.push(grad.square().sum());
        }
    }
}

/// Multiplies every gradient of `module` in `grads` by `factor`.
pub(crate) fn scale_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    mut grads: GradientsParams,
    factor: f64,
) -> GradientsParams {
    let mut visitor = Scale::<B> {
        grads: &mut grads,
        seen: HashSet::new(),
        factor,
        backend: PhantomData,
    };
    module.visit(&mut visitor);
    grads
}

struct Scale<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    seen: HashSet<ParamId>,
    factor: f64,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        // A tied parameter is visited once per use but has one gradient, scaled once.
        if !self.seen.insert(param.id) {
            return;
        }
        if let Some(grad) = self.grads.remove::<Inner<B>, D>(param.id) {
            self.grads.register(param.id, grad.mul_scalar(self.factor));
        }
    }
}

/// The module path of the parameter at `ordinal` (`blocks.1.attn.query.weight`), or `None`
/// when the module has fewer parameters.
pub(crate) fn param_path<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    ordinal: usize,
) -> Option<String> {
    let mut visitor = Path::<B> {
        target: ordinal,
        stack: Vec::new(),
        seen: HashSet::new(),
        found: None,
        backend: PhantomData,
    };
    module.visit(&mut visitor);
    visitor.found
}

struct Path<B: AutodiffBackend> {
    target: usize,
    stack: Vec<String>,
    seen: HashSet<ParamId>,
    found: Option<String>,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Path<B> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.stack.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.stack.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let ordinal = self.seen.len();
        if self.seen.insert(param.id) && ordinal == self.target && self.found.is_none() {
            self.found = Some(self.stack.join("."));
        }
    }
}
