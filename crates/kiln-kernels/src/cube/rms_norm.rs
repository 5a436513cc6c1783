//! RMSNorm, one cube per row: a shared-memory tree reduction for `Σx²` (no plane operations),
//! then each unit normalises the values it summed. The backward reduces `Σ g·x̂` the same way
//! and sums `dγ` down the rows with the column sum (`column_sum`), on many cubes.

use burn::tensor::Shape;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::column_sum::column_sum;
use super::layout::{dense_input, dense_output};
use super::reduce::{UNITS, block_sum};

#[cube(launch)]
fn rms_norm_kernel<F: Float>(
    x: &Tensor<F>,
    gamma: &Tensor<F>,
    y: &mut Tensor<F>,
    rstd: &mut Tensor<F>,
    eps: f32,
    #[define(F)] _dtype: StorageType,
) {
    let d = x.shape(1);
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS as usize;
    let base = row * d;
    let mut sum = 0.0f32;
    let mut i = unit;
    while i < d {
        let v = f32::cast_from(x[base + i]);
        sum += v * v;
        i += UNITS;
    }
    let total = block_sum(sum);
    let r = 1.0f32 / f32::sqrt(total / f32::cast_from(d) + eps);
    let mut i = unit;
    while i < d {
        y[base + i] = F::cast_from(f32::cast_from(x[base + i]) * r * f32::cast_from(gamma[i]));
        i += UNITS;
    }
    if unit == 0 {
        rstd[row] = F::cast_from(r);
    }
}

#[cube(launch)]
fn rms_norm_dx_kernel<F: Float>(
    dy: &Tensor<F>,
    x: &Tensor<F>,
    gamma: &Tensor<F>,
    rstd: &Tensor<F>,
    dx: &mut Tensor<F>,
    #[define(F)] _dtype: StorageType,
) {
    let d = x.shape(1);
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS as usize;
    let base = row * d;
    let r = f32::cast_from(rstd[row]);
    let mut sum = 0.0f32;
    let mut i = unit;
    while i < d {
        let g = f32::cast_from(dy[base + i]) * f32::cast_from(gamma[i]);
        sum += g * f32::cast_from(x[base + i]) * r;
        i += UNITS;
    }
    let proj = block_sum(sum) / f32::cast_from(d);
    let mut i = unit;
    while i < d {
        let g = f32::cast_from(dy[base + i]) * f32::cast_from(gamma[i]);
        let xhat = f32::cast_from(x[base + i]) * r;
        dx[base + i] = F::cast_from(r * (g - xhat * proj));
        i += UNITS;
    }
}

/// `(y, rstd)`.
pub(crate) fn forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    gamma: CubeTensor<R>,
    eps: f32,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let x = dense_input(x);
    let gamma = dense_input(gamma);
    let [rows, d] = x.meta.shape().dims::<2>();
    let (client, dtype) = (x.client.clone(), x.dtype);
    let y = dense_output(&x, Shape::new([rows, d]), dtype);
    let rstd = dense_output(&x, Shape::new([rows]), dtype);
    if rows > 0 {
        rms_norm_kernel::launch::<R>(
            &client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            x.into_tensor_arg(),
            gamma.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            rstd.clone().into_tensor_arg(),
            eps,
            dtype.into(),
        );
    }
    (y, rstd)
}

/// `(dx, dgamma)`.
pub(crate) fn backward<R: CubeRuntime>(
    dy: CubeTensor<R>,
    x: CubeTensor<R>,
    gamma: CubeTensor<R>,
    rstd: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let dy = dense_input(dy);
    let x = dense_input(x);
    let rstd = dense_input(rstd);
    let dx = input_grad(dy.clone(), x.clone(), gamma, rstd.clone());
    // dγ = Σ_rows dy·x·rstd, down the rows on many cubes.
    let dgamma = column_sum(dy, Some((x, rstd)), 1.0);
    (dx, dgamma)
}

/// `dx` alone, in one launch.
pub(crate) fn input_grad<R: CubeRuntime>(
    dy: CubeTensor<R>,
    x: CubeTensor<R>,
    gamma: CubeTensor<R>,
    rstd: CubeTensor<R>,
) -> CubeTensor<R> {
    let dy = dense_input(dy);
    let x = dense_input(x);
    let gamma = dense_input(gamma);
    let rstd = dense_input(rstd);
    let [rows, d] = x.meta.shape().dims::<2>();
    let (client, dtype) = (x.client.clone(), x.dtype);
    let dx = dense_output(&x, Shape::new([rows, d]), dtype);
    if rows > 0 {
        rms_norm_dx_kernel::launch::<R>(
            &client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            dy.into_tensor_arg(),
            x.into_tensor_arg(),
            gamma.into_tensor_arg(),
            rstd.into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            dtype.into(),
        );
    }
    dx
}
