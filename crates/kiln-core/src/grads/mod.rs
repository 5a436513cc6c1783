//! Gradient and parameter arithmetic over a module, and its synchronisation in buckets.
//!
//! Burn keeps gradients in a [`GradientsParams`] map from parameter id to an inner-backend
//! tensor whose rank is only known while visiting the module; the visitors here are the one
//! place that bridges that map to flat tensors a [`Collective`](crate::Collective) can move.

mod bucket;
mod owners;
mod sync;
mod to_owners;
mod units;

use std::marker::PhantomData;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, backend::AutodiffBackend};

pub use bucket::{BucketPlan, ParamSelection};
pub(crate) use owners::Owners;
pub(crate) use sync::broadcast_parameters_in;
pub use sync::{all_reduce_gradients, broadcast_parameters};
pub(crate) use to_owners::reduce_to_owners;
pub use units::gather_unit;
pub(crate) use units::lend;

/// Adds `weight · grads` into `acc`, parameter by parameter, moving `grads` to `device`.
///
/// Strategies weight each micro-batch's gradient of its *mean* loss by its share of the global
/// batch (`samples / global_samples`), so the sum over micro-batches and ranks is the gradient
/// of the global batch's mean loss, however the batch was split.
pub fn add_weighted<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    acc: GradientsParams,
    mut grads: GradientsParams,
    weight: f64,
    device: &B::Device,
) -> GradientsParams {
    let mut visitor = AddWeighted::<B> {
        acc,
        grads: &mut grads,
        weight,
        device,
        backend: PhantomData,
    };
    module.visit(&mut visitor);
    visitor.acc
}

struct AddWeighted<'a, B: AutodiffBackend> {
    acc: GradientsParams,
    grads: &'a mut GradientsParams,
    weight: f64,
    device: &'a B::Device,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for AddWeighted<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(mut grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        if self.weight != 1.0 {
            grad = grad.mul_scalar(self.weight);
        }
        let grad = grad.to_device(self.device);
        let sum = match self.acc.remove::<B::InnerBackend, D>(param.id) {
            Some(acc) => acc + grad,
            None => grad,
        };
        self.acc.register(param.id, sum);
    }
}
