//! Whole-model summaries of parameters: checksums to compare replicas and runs.

use std::marker::PhantomData;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Tensor, backend::Backend};

/// The f64 sum and sum of squares of every float parameter value of a model: equal
/// checksums for equal models, and a cheap fingerprint to compare runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ParamChecksum {
    /// Sum of all values.
    pub sum: f64,
    /// Sum of all squared values.
    pub sq_sum: f64,
    /// Number of values.
    pub count: u64,
}

/// Reads every float parameter of `module` to the host and sums it in f64.
pub fn checksum<B: Backend, M: Module<B>>(module: &M) -> ParamChecksum {
    let mut visitor = HostChecksum::<B> {
        sum: ParamChecksum::default(),
        backend: PhantomData,
    };
    module.visit(&mut visitor);
    visitor.sum
}

struct HostChecksum<B> {
    sum: ParamChecksum,
    backend: PhantomData<B>,
}

impl<B: Backend> ModuleVisitor<B> for HostChecksum<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let data = param.val().into_data().convert::<f64>();
        for v in data.iter::<f64>() {
            self.sum.sum += v;
            self.sum.sq_sum += v * v;
            self.sum.count += 1;
        }
    }
}

/// `[sum, sum of squares]` of every float parameter, computed on `device` without leaving it.
pub fn checksum_tensor<B: Backend, M: Module<B>>(module: &M, device: &B::Device) -> Tensor<B, 1> {
    let mut visitor = DeviceChecksum::<B> {
        sums: Tensor::zeros([2], device),
    };
    module.visit(&mut visitor);
    visitor.sums
}

struct DeviceChecksum<B: Backend> {
    sums: Tensor<B, 1>,
}

impl<B: Backend> ModuleVisitor<B> for DeviceChecksum<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let flat = param.val().flatten::<1>(0, D - 1);
        let pair = Tensor::cat(vec![flat.clone().sum(), flat.powi_scalar(2).sum()], 0);
        self.sums = self.sums.clone() + pair.to_device(&self.sums.device());
    }
}
