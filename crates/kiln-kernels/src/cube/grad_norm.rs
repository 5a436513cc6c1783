//! The global squared norm and non-finite count over many tensors in one pass: the tensors are
//! bound together (a `Sequence`, in chunks of as many as the runtime binds to one launch: every
//! tensor of a model Kiln trains in one launch on CUDA, 30 at a time on wgpu over lavapipe), each
//! tensor's cubes write `(Σ x², #non-finite)` partials into one buffer, then a single cube sums
//! them. Shared-memory reductions only, and no float atomics: not every runtime has them, and
//! the order in which they add is not fixed, while replicas must compute the same norm.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::ops::numeric::zeros;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::bindings::{launches, tensors_per_launch};
use super::layout::{dense_input, dense_output_on};
use super::reduce::{UNITS, block_sum};

/// At most this many cubes per tensor: enough to fill a GPU, few enough that the final sum
/// over the partials is short.
const MAX_CUBES: usize = 256;

/// The cubes a tensor of `len` values gets: one per `UNITS` values, at most `MAX_CUBES` (the
/// rest loop). The host sizes the launch with the same formula.
#[cube]
fn cubes_for(len: usize) -> usize {
    usize::min(len.div_ceil(UNITS), MAX_CUBES)
}

#[cube(launch)]
fn partial_kernel<F: Float>(
    xs: &Sequence<Tensor<F>>,
    partials: &mut Tensor<f32>,
    offset: u32,
    #[comptime] count: usize,
    #[define(F)] _dtype: StorageType,
) {
    let cube = CUBE_POS_X as usize;
    let mut sq = 0.0f32;
    let mut bad = 0.0f32;
    // Tensor `t` holds cubes [before, before + cubes_for(len)). Each cube reads its own
    // tensor's part; the sum over the cube's units comes after, outside any branch, where
    // every unit reaches the barrier.
    let mut before = 0usize;
    #[unroll]
    for t in 0..count {
        let x = xs.index(t);
        let len = x.len();
        let cubes = cubes_for(len);
        if cube >= before && cube < before + cubes {
            let stride = cubes * UNITS;
            let mut i = (cube - before) * UNITS + UNIT_POS as usize;
            while i < len {
                let v = f32::cast_from(x[i]);
                if f32::is_nan(v) || f32::is_inf(v) {
                    bad += 1.0;
                } else {
                    sq += v * v;
                }
                i += stride;
            }
        }
        before += cubes;
    }
    let sq = block_sum(sq);
    let bad = block_sum(bad);
    if UNIT_POS == 0 {
        let at = (offset as usize + cube) * 2;
        partials[at] = sq;
        partials[at + 1] = bad;
    }
}

#[cube(launch)]
fn total_kernel(partials: &Tensor<f32>, out: &mut Tensor<f32>) {
    let pairs = partials.len() / 2;
    let mut i = UNIT_POS as usize;
    let mut sq = 0.0f32;
    let mut bad = 0.0f32;
    while i < pairs {
        sq += partials[2 * i];
        bad += partials[2 * i + 1];
        i += UNITS;
    }
    let sq = block_sum(sq);
    let bad = block_sum(bad);
    if UNIT_POS == 0 {
        out[0] = sq;
        out[1] = bad;
    }
}

/// `[Σ x² over finite x, #non-finite]` as an f32 `[2]` tensor on `device`.
pub(crate) fn sq_norm<R: CubeRuntime>(
    tensors: Vec<CubeTensor<R>>,
    device: &R::Device,
) -> CubeTensor<R> {
    let client = R::client(device);
    let tensors: Vec<_> = tensors
        .into_iter()
        .map(dense_input)
        .filter(|t| t.meta.shape().num_elements() > 0)
        .collect();
    let cubes: Vec<usize> = tensors
        .iter()
        .map(|t| t.meta.shape().num_elements().div_ceil(UNITS).min(MAX_CUBES))
        .collect();
    let total: usize = cubes.iter().sum();
    let partials = dense_output_on(
        client.clone(),
        device.clone(),
        Shape::new([2 * total.max(1)]),
        DType::F32,
    );
    // The partials' buffer and every tensor of the chunk are bound to each launch; tensors of
    // one chunk share a dtype (the kernel is compiled for one).
    let per_launch = tensors_per_launch(&client, 1, 1);
    let mut offset = 0;
    let tensors: Vec<(CubeTensor<R>, usize)> = tensors.into_iter().zip(cubes).collect();
    for chunk in launches(tensors, per_launch, |(t, _)| t.dtype) {
        let dtype = chunk[0].0.dtype;
        let n: usize = chunk.iter().map(|(_, n)| n).sum();
        let count = chunk.len();
        let mut xs = SequenceArg::new();
        for (t, _) in chunk {
            xs.push(t.into_tensor_arg());
        }
        partial_kernel::launch::<R>(
            &client,
            CubeCount::Static(n as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            xs,
            partials.clone().into_tensor_arg(),
            offset as u32,
            count,
            dtype.into(),
        );
        offset += n;
    }
    if total == 0 {
        // Nothing to sum: the partials buffer was never written. (A 1-D tensor is never
        // pitched, so the optimized-layout `zeros` is dense too.)
        return zeros::<R>(device.clone(), Shape::new([2]), DType::F32);
    }
    let out = dense_output_on(client.clone(), device.clone(), Shape::new([2]), DType::F32);
    total_kernel::launch::<R>(
        &client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(UNITS as u32),
        partials.into_tensor_arg(),
        out.clone().into_tensor_arg(),
    );
    out
}
