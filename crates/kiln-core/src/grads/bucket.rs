//! Packing many parameters into few flat buckets, so that a model of hundreds of small
//! tensors needs a handful of collective calls per step instead of hundreds.

use std::collections::HashMap;
use std::ops::Range;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::{Tensor, backend::Backend};

/// Which parameters a plan covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamSelection {
    /// Parameters that receive gradients (for gradient synchronisation).
    Trainable,
    /// Every float parameter, frozen ones too (for broadcasting a model).
    All,
}

/// What [`BucketPlan::run`] gives back: one flat tensor per slot, and the tail.
pub(crate) type Unpacked<B> = (Vec<Tensor<B, 1>>, Option<Tensor<B, 1>>);

/// One parameter's place in the flat layout.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub(crate) id: ParamId,
    pub(crate) numel: usize,
    /// `numel` times the parameter's element size.
    pub(crate) bytes: usize,
}

/// A fixed assignment of a module's float parameters to buckets of at most `cap_bytes` each
/// (a parameter larger than the cap gets a bucket of its own), in the module's visiting order.
///
/// Every rank builds the same plan from the same model definition, which is what lets ranks
/// exchange buckets without exchanging the layout.
#[derive(Debug, Clone)]
pub struct BucketPlan {
    pub(crate) slots: Vec<Slot>,
    pub(crate) index: HashMap<ParamId, usize>,
    buckets: Vec<Range<usize>>,
}

impl BucketPlan {
    /// Plans buckets of at most `cap_bytes` for the `selection` of `module`'s parameters.
    pub fn new<B: Backend, M: Module<B>>(
        module: &M,
        cap_bytes: usize,
        selection: ParamSelection,
    ) -> Self {
        let mut collect = CollectSlots::<B> {
            selection,
            slots: Vec::new(),
            seen: HashMap::new(),
            backend: std::marker::PhantomData,
        };
        module.visit(&mut collect);
        Self::of_slots(collect.slots, cap_bytes)
    }

    /// The plan of the parameters among this one's for which `keep` holds, in the same order,
    /// in buckets of at most `cap_bytes`.
    pub(crate) fn subset(&self, keep: impl Fn(ParamId) -> bool, cap_bytes: usize) -> Self {
        let slots = self.slots.iter().filter(|s| keep(s.id)).cloned().collect();
        Self::of_slots(slots, cap_bytes)
    }

    /// `slots` in order, packed greedily into buckets of at most `cap_bytes`.
    fn of_slots(slots: Vec<Slot>, cap_bytes: usize) -> Self {
        let mut buckets = Vec::new();
        let (mut start, mut filled) = (0, 0);
        for (i, slot) in slots.iter().enumerate() {
            if i > start && filled + slot.bytes > cap_bytes {
                buckets.push(start..i);
                (start, filled) = (i, 0);
            }
            filled += slot.bytes;
        }
        if start < slots.len() {
            buckets.push(start..slots.len());
        }
        let index = slots
            .iter()
            .enumerate()
            .map(|(i, slot)| (slot.id, i))
            .collect();
        Self {
            slots,
            index,
            buckets,
        }
    }

    /// Number of buckets, hence of collective calls per synchronisation.
    pub fn num_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Number of parameter tensors covered.
    pub fn num_params(&self) -> usize {
        self.slots.len()
    }

    /// Elements in each bucket.
    pub fn bucket_elements(&self) -> Vec<usize> {
        self.buckets
            .iter()
            .map(|range| self.slots[range.clone()].iter().map(|s| s.numel).sum())
            .collect()
    }

    /// Packs `flats` (one flat tensor per slot, in slot order) bucket by bucket, runs `op` on
    /// each packed bucket, and unpacks the results. `tail` is appended to the last bucket and
    /// returned separately, so small side data rides along without a call of its own.
    ///
    /// # Panics
    /// When `flats` does not have one tensor per slot.
    pub(crate) fn run<B: Backend, E>(
        &self,
        flats: Vec<Tensor<B, 1>>,
        tail: Option<Tensor<B, 1>>,
        mut op: impl FnMut(Tensor<B, 1>) -> Result<Tensor<B, 1>, E>,
    ) -> Result<Unpacked<B>, E> {
        assert_eq!(flats.len(), self.slots.len(), "one flat tensor per slot");
        let mut flats = flats.into_iter();
        let mut out = Vec::with_capacity(self.slots.len());
        let mut tail = tail;
        let last = self.buckets.len().saturating_sub(1);
        for (b, range) in self.buckets.iter().enumerate() {
            let mut parts: Vec<Tensor<B, 1>> = flats.by_ref().take(range.len()).collect();
            let tail_len = match (&tail, b == last) {
                (Some(t), true) => {
                    parts.push(t.clone());
                    t.dims()[0]
                }
                _ => 0,
            };
            let packed = if parts.len() == 1 {
                parts.pop().expect("one part")
            } else {
                Tensor::cat(parts, 0)
            };
            let reduced = op(packed)?;
            let mut offset = 0;
            for slot in &self.slots[range.clone()] {
                out.push(reduced.clone().narrow(0, offset, slot.numel));
                offset += slot.numel;
            }
            if tail_len > 0 {
                tail = Some(reduced.narrow(0, offset, tail_len));
            }
        }
        if self.buckets.is_empty()
            && let Some(t) = tail.take()
        {
            tail = Some(op(t)?);
        }
        Ok((out, tail))
    }
}

struct CollectSlots<B: Backend> {
    selection: ParamSelection,
    slots: Vec<Slot>,
    /// Tied parameters are visited once per use; they are synchronised once.
    seen: HashMap<ParamId, ()>,
    backend: std::marker::PhantomData<B>,
}

impl<B: Backend> ModuleVisitor<B> for CollectSlots<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if self.selection == ParamSelection::Trainable && !value.is_require_grad() {
            return;
        }
        if self.seen.insert(param.id, ()).is_some() {
            return;
        }
        let numel = value.shape().num_elements();
        self.slots.push(Slot {
            id: param.id,
            numel,
            bytes: numel * value.dtype().size(),
        });
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::nn::{Linear, LinearConfig};

    use super::*;

    type B = Autodiff<Flex>;

    #[derive(Module, Debug)]
    struct Many<B: Backend> {
        layers: Vec<Linear<B>>,
    }

    fn many(n: usize) -> Many<B> {
        let device = Default::default();
        Many {
            layers: (0..n)
                .map(|_| LinearConfig::new(4, 4).init(&device))
                .collect(),
        }
    }

    #[test]
    fn small_parameters_share_buckets() {
        // 50 layers × (16 + 4) floats = 4000 bytes; a 1 KiB cap gives ~4 buckets.
        let plan = BucketPlan::new(&many(50), 1024, ParamSelection::Trainable);
        assert_eq!(plan.num_params(), 100);
        assert_eq!(plan.bucket_elements().iter().sum::<usize>(), 50 * 20);
        assert!(
            plan.num_buckets() >= 4 && plan.num_buckets() <= 5,
            "{plan:?}"
        );
        assert!(plan.bucket_elements().iter().all(|&e| e * 4 <= 1024));
    }

    #[test]
    fn a_large_parameter_gets_its_own_bucket() {
        let plan = BucketPlan::new(&many(3), 8, ParamSelection::Trainable);
        assert_eq!(plan.num_buckets(), 6);
    }

    #[test]
    fn frozen_parameters_are_not_trainable() {
        let model = many(2);
        let frozen = Many {
            layers: vec![model.layers[0].clone().no_grad(), model.layers[1].clone()],
        };
        let trainable = BucketPlan::new(&frozen, 1 << 20, ParamSelection::Trainable);
        let all = BucketPlan::new(&frozen, 1 << 20, ParamSelection::All);
        assert_eq!((trainable.num_params(), all.num_params()), (2, 4));
    }

    #[test]
    fn run_round_trips_and_carries_the_tail() {
        let plan = BucketPlan::new(&many(5), 64, ParamSelection::Trainable);
        let device = Default::default();
        let flats: Vec<Tensor<Flex, 1>> = plan
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| Tensor::full([s.numel], i as f32, &device))
            .collect();
        let tail = Tensor::<Flex, 1>::from_floats([7.0, 8.0], &device);
        let mut calls = 0;
        let (out, tail) = plan
            .run(flats, Some(tail), |t| {
                calls += 1;
                Ok::<_, ()>(t.mul_scalar(2.0))
            })
            .unwrap();
        assert_eq!(calls, plan.num_buckets());
        for (i, t) in out.into_iter().enumerate() {
            let values = t.into_data().to_vec::<f32>().unwrap();
            assert!(values.iter().all(|&v| v == 2.0 * i as f32));
        }
        assert_eq!(
            tail.unwrap().into_data().to_vec::<f32>().unwrap(),
            vec![14.0, 16.0]
        );
    }
}
