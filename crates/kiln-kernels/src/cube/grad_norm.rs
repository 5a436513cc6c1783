//! The global squared norm and non-finite count over many tensors in one pass: each tensor's
//! cubes write `(Σ x², #non-finite)` partials into one buffer, then a single cube sums them.
//! Shared-memory reductions only, and no float atomics: not every runtime has them, and the
//! order in which they add is not fixed, while replicas must compute the same norm.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::ops::numeric::zeros;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::layout::{dense_input, dense_output_on};
use super::reduce::{UNITS, block_sum};

/// At most this many cubes per tensor: enough to fill a GPU, few enough that the final sum
/// over the partials is short.
const MAX_CUBES: usize = 256;

#[cube(launch)]
fn partial_kernel<F: Float>(
    x: &Tensor<F>,
    partials: &mut Tensor<f32>,
    offset: u32,
    #[define(F)] _dtype: StorageType,
) {
    let len = x.len();
    let cube = CUBE_POS_X as usize;
    let stride = CUBE_COUNT_X as usize * UNITS;
    let mut i = cube * UNITS + UNIT_POS as usize;
    let mut sq = 0.0f32;
    let mut bad = 0.0f32;
    while i < len {
        let v = f32::cast_from(x[i]);
        if f32::is_nan(v) || f32::is_inf(v) {
            bad += 1.0;
        } else {
            sq += v * v;
        }
        i += stride;
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
    let mut offset = 0;
    for (t, n) in tensors.into_iter().zip(&cubes) {
        let dtype = t.dtype;
        partial_kernel::launch::<R>(
            &client,
            CubeCount::Static(*n as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            t.into_tensor_arg(),
            partials.clone().into_tensor_arg(),
            offset as u32,
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
