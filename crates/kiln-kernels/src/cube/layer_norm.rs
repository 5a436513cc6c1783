//! LayerNorm, one cube per row: the mean and then the variance around it by shared-memory tree
//! reductions (two passes, as Burn's `var_mean_bias` computes them), then each unit normalises
//! the values it summed. The backward is two launches. In the first, the first `rows` cubes
//! compute `dx` a row each (two reductions, `Σg` and `Σg·x̂`), and the cubes after them sum
//! `dy·x̂` and `dy` down chunks of 64 rows or more for 32 adjacent columns each (8 lanes a
//! column), into f32 partials; the second adds each column's partials (at most ~10k of them). A unit per column over every row
//! would be one launch, but a few dozen busy units for a 64-wide norm: milliseconds on a GPU.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::column_sum::SMALL;
use super::layout::{dense_input, dense_output};
use super::reduce::{UNITS, block_sum};

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn layer_norm_kernel<F: Float>(
    x: &Tensor<F>,
    gamma: &Tensor<F>,
    beta: &Tensor<F>,
    y: &mut Tensor<F>,
    mean: &mut Tensor<F>,
    rstd: &mut Tensor<F>,
    eps: f32,
    #[define(F)] _dtype: StorageType,
) {
    let d = x.shape(1);
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS as usize;
    let base = row * d;
    let count = f32::cast_from(d);
    let mut sum = 0.0f32;
    let mut i = unit;
    while i < d {
        sum += f32::cast_from(x[base + i]);
        i += UNITS;
    }
    let mu = block_sum(sum) / count;
    let mut sq = 0.0f32;
    let mut i = unit;
    while i < d {
        let c = f32::cast_from(x[base + i]) - mu;
        sq += c * c;
        i += UNITS;
    }
    let r = 1.0f32 / f32::sqrt(block_sum(sq) / count + eps);
    let mut i = unit;
    while i < d {
        let xhat = (f32::cast_from(x[base + i]) - mu) * r;
        y[base + i] = F::cast_from(xhat * f32::cast_from(gamma[i]) + f32::cast_from(beta[i]));
        i += UNITS;
    }
    if unit == 0 {
        mean[row] = F::cast_from(mu);
        rstd[row] = F::cast_from(r);
    }
}

/// Columns of a column-sum cube: `UNITS / COLUMNS` lanes go down the rows of each.
const COLUMNS: usize = 32;
/// The fewest rows one column-sum cube sums.
const CHUNK_ROWS: usize = 64;

/// Rows per chunk of a `[rows, d]` backward: [`CHUNK_ROWS`], or more where that would leave the
/// second launch, which runs on one cube, more than [`SMALL`] partials to add (at batch 256 of
/// the AD model, 480 chunks of 128 columns did).
fn chunk_rows(rows: usize, d: usize) -> usize {
    let most_chunks = (SMALL / (2 * d).max(1)).max(1);
    CHUNK_ROWS.max(rows.div_ceil(most_chunks))
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn layer_norm_backward_kernel<F: Float>(
    dy: &Tensor<F>,
    x: &Tensor<F>,
    gamma: &Tensor<F>,
    mean: &Tensor<F>,
    rstd: &Tensor<F>,
    dx: &mut Tensor<F>,
    partials: &mut Tensor<f32>,
    chunk_rows: u32,
    #[define(F)] _dtype: StorageType,
) {
    let rows = x.shape(0);
    let chunk_rows = chunk_rows as usize;
    let d = x.shape(1);
    let cube = CUBE_POS_X as usize;
    let unit = UNIT_POS as usize;
    // Every branch below is the same for all units of a cube, so each barrier in it is
    // reached by all of them.
    if cube < rows {
        // dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·γ.
        let base = cube * d;
        let mu = f32::cast_from(mean[cube]);
        let r = f32::cast_from(rstd[cube]);
        let mut sum_g = 0.0f32;
        let mut sum_gx = 0.0f32;
        let mut i = unit;
        while i < d {
            let g = f32::cast_from(dy[base + i]) * f32::cast_from(gamma[i]);
            sum_g += g;
            sum_gx += g * (f32::cast_from(x[base + i]) - mu) * r;
            i += UNITS;
        }
        let count = f32::cast_from(d);
        let mean_g = block_sum(sum_g) / count;
        let mean_gx = block_sum(sum_gx) / count;
        let mut i = unit;
        while i < d {
            let g = f32::cast_from(dy[base + i]) * f32::cast_from(gamma[i]);
            let xhat = (f32::cast_from(x[base + i]) - mu) * r;
            dx[base + i] = F::cast_from(r * (g - mean_g - xhat * mean_gx));
            i += UNITS;
        }
    } else {
        // `Σ dy·x̂` and `Σ dy` over one chunk of rows for `COLUMNS` adjacent columns (adjacent
        // units read adjacent values), each column's lanes summed in shared memory.
        let blocks = d.div_ceil(COLUMNS);
        let at = cube - rows;
        let chunk = at / blocks;
        let col = (at % blocks) * COLUMNS + unit % COLUMNS;
        let lane = unit / COLUMNS;
        let lanes = UNITS / COLUMNS;
        let end = usize::min(rows, (chunk + 1) * chunk_rows);
        let mut sum_dg = 0.0f32;
        let mut sum_db = 0.0f32;
        if col < d {
            let mut row = chunk * chunk_rows + lane;
            while row < end {
                let i = row * d + col;
                let g = f32::cast_from(dy[i]);
                let xhat =
                    (f32::cast_from(x[i]) - f32::cast_from(mean[row])) * f32::cast_from(rstd[row]);
                sum_dg += g * xhat;
                sum_db += g;
                row += lanes;
            }
        }
        let mut shared = SharedMemory::<f32>::new(2 * UNITS);
        shared[unit] = sum_dg;
        shared[UNITS + unit] = sum_db;
        sync_cube();
        if lane == 0 && col < d {
            let mut dg = 0.0f32;
            let mut db = 0.0f32;
            for l in 0..lanes {
                dg += shared[l * COLUMNS + unit];
                db += shared[UNITS + l * COLUMNS + unit];
            }
            partials[(2 * chunk) * d + col] = dg;
            partials[(2 * chunk + 1) * d + col] = db;
        }
    }
}

/// `dγ` and `dβ`: each column's partial sums over the chunks, in chunk order.
#[cube(launch)]
fn column_total_kernel<F: Float>(
    partials: &Tensor<f32>,
    dgamma: &mut Tensor<F>,
    dbeta: &mut Tensor<F>,
    #[define(F)] _dtype: StorageType,
) {
    let d = dgamma.len();
    let chunks = partials.len() / (2 * d);
    let col = ABSOLUTE_POS;
    if col >= d {
        terminate!();
    }
    let mut dg = 0.0f32;
    let mut db = 0.0f32;
    for chunk in 0..chunks {
        dg += partials[(2 * chunk) * d + col];
        db += partials[(2 * chunk + 1) * d + col];
    }
    dgamma[col] = F::cast_from(dg);
    dbeta[col] = F::cast_from(db);
}

/// `(y, mean, rstd)`.
pub(crate) fn forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    gamma: CubeTensor<R>,
    beta: CubeTensor<R>,
    eps: f32,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let x = dense_input(x);
    let gamma = dense_input(gamma);
    let beta = dense_input(beta);
    let [rows, d] = x.meta.shape().dims::<2>();
    let (client, dtype) = (x.client.clone(), x.dtype);
    let y = dense_output(&x, Shape::new([rows, d]), dtype);
    let mean = dense_output(&x, Shape::new([rows]), dtype);
    let rstd = dense_output(&x, Shape::new([rows]), dtype);
    if rows > 0 {
        layer_norm_kernel::launch::<R>(
            &client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            x.into_tensor_arg(),
            gamma.into_tensor_arg(),
            beta.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            mean.clone().into_tensor_arg(),
            rstd.clone().into_tensor_arg(),
            eps,
            dtype.into(),
        );
    }
    (y, mean, rstd)
}

/// `(dx, dgamma, dbeta)` in two launches: `dx` and the column sums' partials, then their totals.
pub(crate) fn backward<R: CubeRuntime>(
    dy: CubeTensor<R>,
    x: CubeTensor<R>,
    gamma: CubeTensor<R>,
    mean: CubeTensor<R>,
    rstd: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let dy = dense_input(dy);
    let x = dense_input(x);
    let gamma = dense_input(gamma);
    let mean = dense_input(mean);
    let rstd = dense_input(rstd);
    let [rows, d] = x.meta.shape().dims::<2>();
    let (client, dtype) = (x.client.clone(), x.dtype);
    let dx = dense_output(&x, Shape::new([rows, d]), dtype);
    let dgamma = dense_output(&x, Shape::new([d]), dtype);
    let dbeta = dense_output(&x, Shape::new([d]), dtype);
    if d == 0 {
        return (dx, dgamma, dbeta);
    }
    // At least one chunk, so that an empty batch's sums are written (as zeros).
    let chunk_rows = chunk_rows(rows, d);
    let chunks = rows.div_ceil(chunk_rows).max(1);
    let partials = dense_output(&x, Shape::new([chunks, 2, d]), DType::F32);
    let cubes = rows + chunks * d.div_ceil(COLUMNS);
    layer_norm_backward_kernel::launch::<R>(
        &client,
        CubeCount::Static(cubes as u32, 1, 1),
        CubeDim::new_1d(UNITS as u32),
        dy.into_tensor_arg(),
        x.into_tensor_arg(),
        gamma.into_tensor_arg(),
        mean.into_tensor_arg(),
        rstd.into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        partials.clone().into_tensor_arg(),
        chunk_rows as u32,
        dtype.into(),
    );
    column_total_kernel::launch::<R>(
        &client,
        CubeCount::Static(d.div_ceil(UNITS) as u32, 1, 1),
        CubeDim::new_1d(UNITS as u32),
        partials.into_tensor_arg(),
        dgamma.clone().into_tensor_arg(),
        dbeta.clone().into_tensor_arg(),
        dtype.into(),
    );
    (dx, dgamma, dbeta)
}
