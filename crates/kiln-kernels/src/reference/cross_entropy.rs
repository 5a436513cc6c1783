//! Softmax cross-entropy per row of `[rows, classes]` logits.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// `(loss, lse)`, both `[rows]`: `lse = log Σ exp(logits)`, `loss = lse − logits[target]`.
pub fn forward<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let max = logits.clone().max_dim(1);
    let lse = (logits.clone() - max.clone()).exp().sum_dim(1).log() + max;
    let picked = logits.gather(1, targets.unsqueeze_dim(1));
    ((lse.clone() - picked).squeeze_dim(1), lse.squeeze_dim(1))
}

/// `dlogits = (softmax − onehot(target)) · dloss`, the softmax recomputed from `lse`.
pub fn backward<B: Backend>(
    dloss: Tensor<B, 1>,
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    lse: Tensor<B, 1>,
) -> Tensor<B, 2> {
    let [rows, classes] = logits.dims();
    let probs = (logits - lse.unsqueeze_dim(1)).exp();
    let onehot = targets.one_hot::<2>(classes).float().cast(probs.dtype());
    debug_assert_eq!(onehot.dims(), [rows, classes]);
    (probs - onehot) * dloss.unsqueeze_dim(1)
}
