//! The whole model back from its stages, matched by `ParamId`.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};

/// `template` (the whole model, e.g. as it was before training) with every parameter that one
/// of `stages` holds replaced by the stage's value, moved to `device`. Parameters are matched
/// by `ParamId`, which splitting keeps, so this works for any model and any split; parameters
/// no stage holds keep the template's values.
pub fn assemble<B: Backend, M: Module<B>, S: Module<B>>(
    template: M,
    stages: &[S],
    device: &B::Device,
) -> M {
    let mut values = Collect::<B>::default();
    for stage in stages {
        stage.visit(&mut values);
    }
    template.map(&mut Replace {
        values,
        device: device.clone(),
    })
}

/// Every parameter's value, flattened, by id.
struct Collect<B: Backend> {
    float: HashMap<ParamId, Tensor<B, 1>>,
    int: HashMap<ParamId, Tensor<B, 1, Int>>,
    bool: HashMap<ParamId, Tensor<B, 1, Bool>>,
}

impl<B: Backend> Default for Collect<B> {
    fn default() -> Self {
        Self {
            float: HashMap::new(),
            int: HashMap::new(),
            bool: HashMap::new(),
        }
    }
}

impl<B: Backend> ModuleVisitor<B> for Collect<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let t = param.val().detach();
        let len = t.shape().num_elements();
        self.float.insert(param.id, t.reshape([len]));
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        let t = param.val();
        let len = t.shape().num_elements();
        self.int.insert(param.id, t.reshape([len]));
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        let t = param.val();
        let len = t.shape().num_elements();
        self.bool.insert(param.id, t.reshape([len]));
    }
}

struct Replace<B: Backend> {
    values: Collect<B>,
    device: B::Device,
}

impl<B: Backend> ModuleMapper<B> for Replace<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        match self.values.float.remove(&param.id) {
            Some(flat) => param.map(|t| {
                let trainable = t.is_require_grad();
                // Detached again: the reshape's output is a graph node, and only a fresh leaf
                // can become a parameter that tracks its gradient.
                flat.reshape(t.dims())
                    .to_device(&self.device)
                    .detach()
                    .set_require_grad(trainable)
            }),
            None => param,
        }
    }

    fn map_int<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Int>>,
    ) -> Param<Tensor<B, D, Int>> {
        match self.values.int.remove(&param.id) {
            Some(flat) => param.map(|t| flat.reshape(t.dims()).to_device(&self.device)),
            None => param,
        }
    }

    fn map_bool<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Bool>>,
    ) -> Param<Tensor<B, D, Bool>> {
        match self.values.bool.remove(&param.id) {
            Some(flat) => param.map(|t| flat.reshape(t.dims()).to_device(&self.device)),
            None => param,
        }
    }
}
