//! Softmax cross-entropy per row of `[rows, classes]` logits, computed in f32 whatever their
//! dtype: the loss and the log-sum-exp are f32, and the logits' gradient is in their dtype.

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor};

/// `(loss, lse)`, both `[rows]` in f32: `lse = log Σ exp(logits)`, `loss = lse −
/// logits[target]`.
pub fn forward<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let logits = logits.cast(FloatDType::F32);
    let max = logits.clone().max_dim(1);
    let lse = (logits.clone() - max.clone()).exp().sum_dim(1).log() + max;
    let picked = logits.gather(1, targets.unsqueeze_dim(1));
    ((lse.clone() - picked).squeeze_dim(1), lse.squeeze_dim(1))
}

/// `dlogits = (softmax − onehot(target)) · dloss` in the logits' dtype, the softmax recomputed
/// in f32 from `lse` (`dloss` and `lse` f32).
pub fn backward<B: Backend>(
    dloss: Tensor<B, 1>,
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    lse: Tensor<B, 1>,
) -> Tensor<B, 2> {
    let [rows, classes] = logits.dims();
    let dtype = logits.dtype();
    let f32 = |t: Tensor<B, 1>| t.cast(FloatDType::F32);
    let probs = (logits.cast(FloatDType::F32) - f32(lse).unsqueeze_dim(1)).exp();
    let onehot = targets.one_hot::<2>(classes).float().cast(FloatDType::F32);
    debug_assert_eq!(onehot.dims(), [rows, classes]);
    ((probs - onehot) * f32(dloss).unsqueeze_dim(1)).cast(dtype)
}
