//! Which replica owns which parameter when the optimizer state is split among the replicas
//! (ZeRO-1, and ZeRO-2 which also reduces each gradient to its owner alone): the owner alone
//! keeps the parameter's optimizer state and steps it, then broadcasts the new value to the
//! others.
//!
//! Ownership is by whole parameters, not by flat slices of the buckets as DeepSpeed cuts them:
//! Burn's optimizers keep their state per parameter and step whatever parameters the gradients
//! name, so an owner steps its parameters with the optimizer unchanged (Burn's, the fused
//! AdamW, a user's), and a checkpoint's state is the ordinary per-parameter record. The price
//! is balance: a part is within one parameter of `1 / dp` of the elements, and a model whose
//! largest parameter outweighs a replica's share (an embedding over few replicas) leaves that
//! owner heavier.

use std::collections::HashSet;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, backend::AutodiffBackend};

use super::{BucketPlan, broadcast_parameters};
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
}

impl Owners {
    /// Splits `plan`'s parameters among `replicas` by elements (the optimizer state's size:
    /// AdamW keeps two f32 moments per element whatever the parameter's dtype), largest first,
    /// each to the replica with the fewest so far (ties to the lowest rank). Every replica
    /// computes the same split from the same plan. With `gradients`, the gradients are reduced
    /// to their owners ([`super::reduce_to_owners`]) instead of to every replica.
    pub(crate) fn new(
        plan: &BucketPlan,
        replicas: usize,
        rank: usize,
        cap_bytes: usize,
        gradients: bool,
    ) -> Self {
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
            gradients,
        }
    }

    /// Whether each owner alone receives its parameters' reduced gradients (ZeRO-2).
    pub(crate) fn reduces_gradients(&self) -> bool {
        self.gradients
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

    /// Every replica's parameters from their owner: one broadcast per bucket of each part, in
    /// rank order, so every replica ends with the owners' values bit for bit.
    ///
    /// # Errors
    /// The first [`CollectiveError`]; the group is then poisoned.
    pub(crate) fn broadcast<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        mut module: M,
        collective: &mut dyn Collective<Inner<B>>,
    ) -> Result<M, CollectiveError> {
        for (root, part) in self.parts.iter().enumerate() {
            module = broadcast_parameters(module, part, collective, root)?;
        }
        Ok(module)
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
                .map(|r| Owners::new(&plan, replicas, r, 1 << 20, false))
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
    fn keep_mine_drops_the_gradients_of_other_owners() {
        let model = widths(&[3, 5, 7]);
        let plan = BucketPlan::new(&model, 1 << 20, ParamSelection::Trainable);
        let owners = Owners::new(&plan, 2, 1, 1 << 20, false);
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
