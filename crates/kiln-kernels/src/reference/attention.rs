//! Causal multi-head attention of `[batch, q_len, d_model]` queries over `[batch, kv_len,
//! kv_heads·d_head]` keys and values (`q_len ≤ kv_len`: the queries are the last positions),
//! written out in tensors: shared key and value heads repeated for their query heads (as
//! transformers' `repeat_kv`), heads split by a reshape and a transpose, the scores masked at
//! their full `[batch, heads, q_len, kv_len]` shape, a softmax and a batched matmul. The
//! gradients of repeated heads are summed over each group.
//!
//! With `starts [batch, q_len]` (packed sequences), query `i` also ignores the keys before
//! `starts[i]`, its example's first position, clamped to the query's own position.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};

/// What masked scores are set to: `exp` of it underflows to exactly 0 next to any real score.
const MASKED: f32 = -1.0e9;

fn split<B: Backend>(t: Tensor<B, 3>, heads: usize) -> Tensor<B, 4> {
    let [batch, seq, d_model] = t.dims();
    t.reshape([batch, seq, heads, d_model / heads])
        .swap_dims(1, 2)
}

fn merge<B: Backend>(t: Tensor<B, 4>) -> Tensor<B, 3> {
    let [batch, heads, seq, d_head] = t.dims();
    t.swap_dims(1, 2).reshape([batch, seq, heads * d_head])
}

/// `t [batch, len, kv_heads·d_head]` with each head repeated for the `heads / kv_heads` query
/// heads that share it: `[batch, len, heads·d_head]`, query head `h` reading head
/// `h / (heads / kv_heads)`.
pub fn repeat_kv<B: Backend>(t: Tensor<B, 3>, heads: usize, d_head: usize) -> Tensor<B, 3> {
    let [batch, len, width] = t.dims();
    let kv_heads = width / d_head;
    if kv_heads == heads {
        return t;
    }
    t.reshape([batch, len, kv_heads, 1, d_head])
        .expand([batch, len, kv_heads, heads / kv_heads, d_head])
        .reshape([batch, len, heads * d_head])
}

/// The gradient of [`repeat_kv`]: `g [batch, len, heads·d_head]` summed over each group of
/// query heads into `[batch, len, kv_heads·d_head]`.
pub fn sum_groups<B: Backend>(g: Tensor<B, 3>, kv_heads: usize, d_head: usize) -> Tensor<B, 3> {
    let [batch, len, width] = g.dims();
    let heads = width / d_head;
    if kv_heads == heads {
        return g;
    }
    g.reshape([batch, len, kv_heads, heads / kv_heads, d_head])
        .sum_dim(3)
        .reshape([batch, len, kv_heads * d_head])
}

/// `[batch, heads, q_len, kv_len]`, true where key `j` is hidden from query `i`: after its
/// position `i + kv_len − q_len`, or before its start.
fn hidden<B: Backend>(
    shape: [usize; 4],
    starts: Option<Tensor<B, 2, Int>>,
    device: &B::Device,
) -> Tensor<B, 4, Bool> {
    let [batch, heads, q_len, kv_len] = shape;
    let offset = kv_len - q_len;
    let one: Vec<bool> = (0..q_len)
        .flat_map(|i| (0..kv_len).map(move |j| j > i + offset))
        .collect();
    let future = Tensor::from_data(TensorData::new(one.repeat(batch * heads), shape), device);
    let Some(starts) = starts else {
        return future;
    };
    let last = Tensor::<B, 1, Int>::arange(offset as i64..kv_len as i64, device).unsqueeze::<2>();
    let starts = starts.min_pair(last.expand([batch, q_len]));
    let keys = Tensor::<B, 1, Int>::arange(0..kv_len as i64, device)
        .reshape([1, 1, 1, kv_len])
        .expand(shape);
    let before = keys.lower(starts.reshape([batch, 1, q_len, 1]).expand(shape));
    future.bool_or(before)
}

/// Masked, scaled scores `[batch, heads, q_len, kv_len]` of split queries and keys.
fn scores<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    starts: Option<Tensor<B, 2, Int>>,
) -> Tensor<B, 4> {
    let [batch, heads, q_len, d_head] = q.dims();
    let mask = hidden::<B>([batch, heads, q_len, k.dims()[2]], starts, &q.device());
    q.mul_scalar((d_head as f64).powf(-0.5))
        .matmul(k.swap_dims(2, 3))
        .mask_fill(mask, MASKED)
}

/// `(out [batch, q_len, d_model], lse [batch, heads, q_len])`, `lse` the log-sum-exp of each
/// query's masked scores; `starts` as the module says.
pub fn forward<B: Backend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    heads: usize,
    starts: Option<Tensor<B, 2, Int>>,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let d_head = q.dims()[2] / heads;
    let (k, v) = (repeat_kv(k, heads, d_head), repeat_kv(v, heads, d_head));
    let scores = scores(split(q, heads), split(k, heads), starts);
    let max = scores.clone().max_dim(3);
    let lse = (scores.clone() - max.clone()).exp().sum_dim(3).log() + max;
    let weights = (scores - lse.clone()).exp();
    (merge(weights.matmul(split(v, heads))), lse.squeeze_dim(3))
}

/// `(dq, dk, dv)` from the output's gradient. With `P = exp(scores − lse)`,
/// `dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O))`: `dV = Pᵀ·dO`, `dQ = scale·dS·K`, `dK = scale·dSᵀ·Q`.
pub fn backward<B: Backend>(
    dout: Tensor<B, 3>,
    [q, k, v]: [Tensor<B, 3>; 3],
    out: Tensor<B, 3>,
    lse: Tensor<B, 3>,
    heads: usize,
    starts: Option<Tensor<B, 2, Int>>,
) -> [Tensor<B, 3>; 3] {
    let d_head = q.dims()[2] / heads;
    let kv_heads = k.dims()[2] / d_head;
    let scale = (d_head as f64).powf(-0.5);
    let (k, v) = (repeat_kv(k, heads, d_head), repeat_kv(v, heads, d_head));
    let (q, k, v) = (split(q, heads), split(k, heads), split(v, heads));
    let (dout, out) = (split(dout, heads), split(out, heads));
    let p = (scores(q.clone(), k.clone(), starts) - lse.unsqueeze_dim::<4>(3)).exp();
    let dv = p.clone().swap_dims(2, 3).matmul(dout.clone());
    let delta = (dout.clone() * out).sum_dim(3);
    let ds = p * (dout.matmul(v.swap_dims(2, 3)) - delta);
    let dq = ds.clone().matmul(k).mul_scalar(scale);
    let dk = ds.swap_dims(2, 3).matmul(q).mul_scalar(scale);
    let group = |g| sum_groups(merge(g), kv_heads, d_head);
    [merge(dq), group(dk), group(dv)]
}
