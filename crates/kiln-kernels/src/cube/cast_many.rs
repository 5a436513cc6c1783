//! Many tensors cast to another float dtype in one launch, into one flat buffer laid out by a
//! [`FlatLayout`]: mixed precision's copies of every parameter, and its gradients back to f32.
//! Bound as a `Sequence` in chunks of as many tensors as the runtime binds, like the fused AdamW.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::bindings::{launches, tensors_per_launch};
use super::layout::{dense_input, dense_output_on};
use crate::FlatLayout;

#[cube(launch)]
fn cast_many_kernel<F: Float, T: Float>(
    xs: &Sequence<Tensor<F>>,
    out: &mut Tensor<T>,
    first_segment: u32,
    units: u32,
    #[comptime] count: usize,
    #[comptime] align: usize,
    #[define(F, T)] _dtypes: [StorageType; 2],
) {
    let unit = ABSOLUTE_POS;
    if unit >= units as usize {
        terminate!();
    }
    // Tensor `i` holds units [before, before + len) and the flat segment starting at `segment`.
    let mut before = 0usize;
    let mut segment = first_segment as usize;
    #[unroll]
    for i in 0..count {
        let x = xs.index(i);
        let len = x.len();
        if unit >= before && unit < before + len {
            out[segment + unit - before] = T::cast_from(x[unit - before]);
        }
        before += len;
        segment += len.div_ceil(align) * align;
    }
}

/// See [`crate::KernelBackend::cast_many`].
pub(crate) fn cast_many<R: CubeRuntime>(
    tensors: Vec<CubeTensor<R>>,
    layout: &FlatLayout,
    dtype: DType,
    device: &R::Device,
) -> CubeTensor<R> {
    let client = R::client(device);
    let out = dense_output_on(
        client.clone(),
        device.clone(),
        Shape::new([layout.total()]),
        dtype,
    );
    // The output and the chunk's tensors are bound to each launch; a chunk shares one dtype.
    let per_launch = tensors_per_launch(&client, 1, 1);
    let tensors: Vec<CubeTensor<R>> = tensors.into_iter().map(dense_input).collect();
    let mut first = 0;
    for chunk in launches(tensors, per_launch, |t| t.dtype) {
        let (from, take) = (chunk[0].dtype, chunk.len());
        let units: usize = layout.lens()[first..first + take].iter().sum();
        if units > 0 {
            let mut xs = SequenceArg::new();
            for t in chunk {
                xs.push(t.into_tensor_arg());
            }
            let dim = CubeDim::new(&client, units);
            cast_many_kernel::launch::<R>(
                &client,
                calculate_cube_count_elemwise(&client, units, dim),
                dim,
                xs,
                out.clone().into_tensor_arg(),
                layout.offsets()[first] as u32,
                units as u32,
                take,
                layout.align(),
                [from.into(), dtype.into()],
            );
        }
        first += take;
    }
    out
}
