//! AdamW on the fused kernel, as a Burn optimizer: `FusedAdamWConfig::init()` drops in wherever
//! `AdamWConfig::init()` does (Kiln strategies, burn-train's `Learner`, hand-written loops).
//! Its state is Burn's own [`AdamWState`], so a checkpoint written with either optimizer resumes
//! with the other.

use burn::config::Config;
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamWState, AdaptiveMomentumState, SimpleOptimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::{AdamWStep, KernelBackend, ops};

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

/// AdamW whose per-tensor update is one kernel launch (reading the parameter, gradient and
/// both moments once, writing three) instead of Burn's dozen element-wise ops.
#[derive(Clone, Debug)]
pub struct FusedAdamW {
    config: FusedAdamWConfig,
}

impl FusedAdamWConfig {
    /// The optimizer for module `M` on autodiff backend `B`.
    pub fn init<B, M>(&self) -> OptimizerAdaptor<FusedAdamW, M, B>
    where
        B: AutodiffBackend<InnerBackend: KernelBackend>,
        M: AutodiffModule<B>,
    {
        OptimizerAdaptor::from(FusedAdamW {
            config: self.clone(),
        })
    }
}

impl<B: KernelBackend> SimpleOptimizer<B> for FusedAdamW {
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
        let c = &self.config;
        let step = AdamWStep {
            lr: lr as f32,
            beta_1: c.beta_1,
            beta_2: c.beta_2,
            epsilon: c.epsilon,
            weight_decay: c.weight_decay,
            time: time as u32,
        };
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
