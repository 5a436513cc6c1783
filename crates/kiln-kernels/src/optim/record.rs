//! A parameter's moments as Burn's AdamW record holds them, whatever the parameter's rank.

use burn::optim::record::AdaptorRecord;
use burn::optim::{AdamWState, AdaptiveMomentumState};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Shape, Tensor};

use super::AdamWRule;
use crate::KernelBackend;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// The record of one parameter's moments, whatever its rank.
pub(super) fn record_of<B: AutodiffBackend<InnerBackend: KernelBackend>>(
    shape: &Shape,
    m: Tensor<Inner<B>, 1>,
    v: Tensor<Inner<B>, 1>,
    time: usize,
) -> AdaptorRecord<AdamWRule, B> {
    fn ranked<B: AutodiffBackend<InnerBackend: KernelBackend>, const D: usize>(
        shape: &Shape,
        m: Tensor<Inner<B>, 1>,
        v: Tensor<Inner<B>, 1>,
        time: usize,
    ) -> AdaptorRecord<AdamWRule, B> {
        let momentum = AdaptiveMomentumState::new(
            time,
            m.reshape(shape.clone().dims::<D>()),
            v.reshape(shape.clone().dims::<D>()),
        );
        AdaptorRecord::from_state::<D>(AdamWState { momentum })
    }
    match shape.num_dims() {
        1 => ranked::<B, 1>(shape, m, v, time),
        2 => ranked::<B, 2>(shape, m, v, time),
        3 => ranked::<B, 3>(shape, m, v, time),
        4 => ranked::<B, 4>(shape, m, v, time),
        5 => ranked::<B, 5>(shape, m, v, time),
        6 => ranked::<B, 6>(shape, m, v, time),
        7 => ranked::<B, 7>(shape, m, v, time),
        8 => ranked::<B, 8>(shape, m, v, time),
        rank => unreachable!("Burn's parameters have 1 to 8 dimensions, not {rank}"),
    }
}
