//! A linear layer's epilogue in one pass over the matmul's output: the bias, a residual or a
//! ReLU, where Burn's broadcast add, residual add and ReLU take a launch each.

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::elementwise::grid;
use super::layout::{dense_input, dense_output, row_input};
use crate::Epilogue;

/// `out = epilogue(y + bias)` over `[rows, n]`: one unit per element, the arithmetic in the
/// storage type as Burn's adds do it (so f32 results equal theirs bit for bit). `y` and the
/// residual may have pitched rows.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn epilogue_kernel<F: Float>(
    y: &Tensor<F>,
    bias: &Tensor<F>,
    residual: &Tensor<F>,
    out: &mut Tensor<F>,
    #[comptime] has_bias: bool,
    #[comptime] has_residual: bool,
    #[comptime] relu: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i >= out.len() {
        terminate!();
    }
    let n = out.shape(1);
    let row = i / n;
    let col = i % n;
    let mut v = y[row * y.stride(0) + col];
    if comptime!(has_bias) {
        v += bias[col];
    }
    if comptime!(has_residual) {
        v += residual[row * residual.stride(0) + col];
    }
    if comptime!(relu) {
        let f = f32::cast_from(v);
        // As the ReLU kernel: `max(v, 0)` would turn a NaN into 0; Burn's ReLU keeps it.
        if !(f > 0.0 || f32::is_nan(f)) {
            v = F::cast_from(0.0f32);
        }
    }
    out[i] = v;
}

/// `epilogue(y + b)` for the matmul's output `y [rows, n]`: `y` itself when there is nothing
/// to do, one launch otherwise.
pub(crate) fn epilogue<R: CubeRuntime>(
    y: CubeTensor<R>,
    b: Option<CubeTensor<R>>,
    epilogue: Epilogue<CubeTensor<R>>,
) -> CubeTensor<R> {
    if b.is_none() && matches!(epilogue, Epilogue::None) {
        return y;
    }
    let y = row_input(y);
    let out = dense_output(&y, y.meta.shape().clone(), y.dtype);
    let len = out.meta.shape().num_elements();
    if len == 0 {
        return out;
    }
    let relu = matches!(epilogue, Epilogue::Relu);
    // Placeholders are never read: their flags are false at compile time.
    let (bias, has_bias) = match b {
        Some(b) => (dense_input(b), true),
        None => (y.clone(), false),
    };
    let (residual, has_residual) = match epilogue {
        Epilogue::Residual(r) => (row_input(r), true),
        _ => (y.clone(), false),
    };
    let (count, dim) = grid(&out, len);
    let dtype = y.dtype;
    epilogue_kernel::launch::<R>(
        &out.client.clone(),
        count,
        dim,
        y.into_tensor_arg(),
        bias.into_tensor_arg(),
        residual.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        has_bias,
        has_residual,
        relu,
        dtype.into(),
    );
    out
}
