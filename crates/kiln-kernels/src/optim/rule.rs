//! The per-tensor AdamW rule, whose state types the fused AdamW's record.

use burn::module::ParamId;
use burn::optim::record::AdaptorRecord;
use burn::optim::{AdamWState, AdaptiveMomentumState, SimpleOptimizer};
use burn::tensor::Tensor;
use hashbrown::HashMap as RecordMap;

use super::FusedAdamWConfig;
use crate::{KernelBackend, ops};

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
