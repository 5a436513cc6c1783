//! Softmax cross-entropy's forward, one cube per row: the row's max and `Σ exp` by shared-memory
//! tree reductions (no plane operations), writing only the loss and the log-sum-exp, in f32
//! whatever the logits' dtype (no cast of the logits before, nor of their gradient after). The
//! logits' rows are read where they are, pitched or not.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::layout::{dense_input, dense_output, row_input};
use super::reduce::{UNITS, block_max, block_sum};

#[cube(launch)]
fn cross_entropy_kernel<F: Float, I: Int>(
    logits: &Tensor<F>,
    targets: &Tensor<I>,
    loss: &mut Tensor<f32>,
    lse: &mut Tensor<f32>,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let classes = logits.shape(1);
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS as usize;
    // Rows may be pitched (see `row_input`).
    let base = row * logits.stride(0);
    let mut max = f32::min_value();
    let mut i = unit;
    while i < classes {
        max = f32::max(max, f32::cast_from(logits[base + i]));
        i += UNITS;
    }
    let max = block_max(max);
    let mut sum = 0.0f32;
    let mut i = unit;
    while i < classes {
        sum += f32::exp(f32::cast_from(logits[base + i]) - max);
        i += UNITS;
    }
    let lse_row = max + f32::ln(block_sum(sum));
    if unit == 0 {
        let target = usize::cast_from(targets[row]);
        // An out-of-range class has no probability: NaN, which the non-finite check reports
        // (the square root of a negative number, so no compiler folds it into a constant).
        let value = if target < classes {
            lse_row - f32::cast_from(logits[base + target])
        } else {
            f32::sqrt(-1.0f32 - f32::abs(lse_row))
        };
        loss[row] = value;
        lse[row] = lse_row;
    }
}

/// `(loss, lse)`.
pub(crate) fn forward<R: CubeRuntime>(
    logits: CubeTensor<R>,
    targets: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let logits = row_input(logits);
    let targets = dense_input(targets);
    let rows = logits.meta.shape()[0];
    let (client, dtype) = (logits.client.clone(), logits.dtype);
    let loss = dense_output(&logits, Shape::new([rows]), DType::F32);
    let lse = dense_output(&logits, Shape::new([rows]), DType::F32);
    if rows > 0 {
        let dtypes = [dtype.into(), targets.dtype.into()];
        cross_entropy_kernel::launch::<R>(
            &client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            logits.into_tensor_arg(),
            targets.into_tensor_arg(),
            loss.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            dtypes,
        );
    }
    (loss, lse)
}
