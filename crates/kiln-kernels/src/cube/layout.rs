//! The memory layout every kernel relies on: dense row-major inputs and outputs.
//!
//! The kernels index their tensors as dense row-major buffers (`y[row·d + i]`). Two things can
//! break that, and this module is the one place that rules them out:
//! - **Pitched outputs.** CubeCL's CUDA runtime allocates a tensor requested with the
//!   "optimized" layout (burn-cubecl's `empty_device_dtype`) with padded rows: a `[rows, d]`
//!   tensor whose row is not a multiple of the alignment gets `strides[0] > d`. Written densely,
//!   such an output scrambles every row after the first. wgpu never pitches, so lavapipe cannot
//!   show the bug; the workspace's `clippy.toml` forbids the pitched allocators instead.
//! - **Strided inputs.** Slices and transposes are views with other strides; Burn's
//!   `into_contiguous` copies them (and pitched tensors) into dense buffers.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::client::ComputeClient;
use cubecl::zspace::metadata::Metadata;

use crate::FlatLayout;

/// An uninitialised dense row-major tensor on `like`'s device.
pub(crate) fn dense_output<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: Shape,
    dtype: DType,
) -> CubeTensor<R> {
    dense_output_on(like.client.clone(), like.device.clone(), shape, dtype)
}

/// An uninitialised dense row-major tensor on `device`.
pub(crate) fn dense_output_on<R: CubeRuntime>(
    client: ComputeClient<R>,
    device: R::Device,
    shape: Shape,
    dtype: DType,
) -> CubeTensor<R> {
    let out = empty_device_contiguous_dtype(client, device, shape, dtype);
    debug_assert!(
        out.is_contiguous(),
        "a dense allocation came back with strides {:?} for shape {:?}",
        out.meta.strides(),
        out.meta.shape()
    );
    out
}

/// The matrix `t` with contiguous rows: itself when each row is contiguous (dense, or pitched:
/// rows further apart than their length, as CUDA allocates them), a dense copy otherwise. For
/// kernels that index a row as `row · stride(0) + i`, so that a pitched input costs no copy.
pub(crate) fn row_input<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let (shape, strides) = (t.meta.shape(), t.meta.strides());
    let rows_contiguous = shape.num_dims() == 2 && strides[1] == 1 && strides[0] >= shape[1];
    if rows_contiguous { t } else { dense_input(t) }
}

/// The vector `t` as it is, for kernels that index it as `i · stride(0)`: a broadcast scalar
/// (stride 0, as a mean's gradient arrives) or a strided view costs no copy. Only a tensor of
/// another rank is made dense.
pub(crate) fn vector_input<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    if t.meta.shape().num_dims() == 1 {
        t
    } else {
        dense_input(t)
    }
}

/// The segments of the dense vector `flat` that `layout` lays out, each a view of its handle:
/// its binding spans the segment and its padding (so that the binding starts and ends at the
/// device's offset alignment, as Burn's slice wants both ends), its shape only the segment.
/// Kernels index by shape and reads copy the shape's bytes, so the padding is never seen.
/// Burn's slice copies instead of viewing a segment whose length is not a multiple of the
/// alignment (a bias of 5 values), one launch each.
pub(crate) fn flat_segments<R: CubeRuntime>(
    flat: CubeTensor<R>,
    layout: &FlatLayout,
) -> Vec<CubeTensor<R>> {
    let flat = dense_input(flat);
    let size = flat.dtype.size() as u64;
    let visible = flat.handle.size_in_used();
    let alignment = flat.client.properties().memory.alignment;
    debug_assert_eq!(
        visible,
        layout.total() as u64 * size,
        "the flat buffer is the layout's"
    );
    (0..layout.len())
        .map(|i| {
            let (start, len) = (layout.offsets()[i] as u64, layout.lens()[i] as u64);
            let end = start + len + layout.padding(i) as u64;
            let (first, last) = (start * size, end * size);
            let aligned =
                first.is_multiple_of(alignment) && (visible - last).is_multiple_of(alignment);
            if len == 0 || !aligned {
                // An empty segment, or a layout not aligned for this device: Burn's slice.
                let range = start as usize..(start + len) as usize;
                return burn_cubecl::kernel::slice(flat.clone(), std::slice::from_ref(&range));
            }
            CubeTensor::new(
                flat.client.clone(),
                flat.handle
                    .clone()
                    .offset_start(first)
                    .offset_end(visible - last),
                Metadata::new([len as usize], [1usize]),
                flat.device.clone(),
                flat.dtype,
            )
        })
        .collect()
}

/// `t` as a dense row-major tensor: itself when it already is one, a copy otherwise.
pub(crate) fn dense_input<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let t = into_contiguous(t);
    debug_assert!(
        t.is_contiguous(),
        "into_contiguous left strides {:?} for shape {:?}",
        t.meta.strides(),
        t.meta.shape()
    );
    t
}
