//! Causal multi-head attention, one unit per (batch, head, query): the query's scores against
//! its visible keys with an online softmax (a running maximum and sum, as flash attention
//! keeps them), the output accumulated in registers, and one log-sum-exp saved per query. The
//! scores are never written to memory. The backward is one launch: the first units compute a
//! query's `dq`, the rest a key's `dk` and `dv`, each recomputing the probabilities from the
//! saved log-sum-exp. `d_head` is a compile-time constant, so each unit's own rows live in
//! registers, and the rows a unit loops over are the same for every lane of a warp at each
//! step (one broadcast load, not 32 rows).
//!
//! Layouts: `q [batch, q_len, heads·d_head]`, `k`, `v [batch, kv_len, kv_heads·d_head]` with
//! `q_len ≤ kv_len` (the queries are the last positions: query `i` sees keys
//! `0 ..= i + kv_len − q_len`), `lse [batch, heads, q_len]`. Grouped-query attention: query
//! head `h` reads key and value head `h / group`, `group = heads / kv_heads`, in place; a key's
//! unit in the backward sums its `dk` and `dv` over the group's query heads, so the repeated
//! keys are never written and their gradients never summed by another launch.
//!
//! Packed sequences (`packed`, a compile-time flag) give each query its first key, `starts
//! [batch, q_len]` clamped to the query's own position: a query's unit starts its loop there,
//! and a key's unit stops at the first query whose start lies past the key (starts never
//! decrease along a sequence, so no later query sees it either).

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::elementwise::grid;
use super::layout::{dense_input, dense_output};

/// The first key query `i` of sequence `b` sees: its start clamped to its own position `last`,
/// or 0 without starts.
#[cube]
fn first_key<I: Int>(
    starts: &Tensor<I>,
    b: usize,
    i: usize,
    last: usize,
    #[comptime] packed: bool,
) -> usize {
    let mut first = 0usize;
    if comptime!(packed) {
        first = usize::min(usize::cast_from(starts[b * starts.shape(1) + i]), last);
    }
    first
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn attention_forward_kernel<F: Float, I: Int>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    starts: &Tensor<I>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<F>,
    heads: u32,
    scale: f32,
    #[comptime] d_head: usize,
    #[comptime] packed: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let heads = heads as usize;
    let q_len = q.shape(1);
    let kv_len = k.shape(1);
    let width = heads * d_head;
    let kv_width = k.shape(2);
    let group = heads / (kv_width / d_head);
    let idx = ABSOLUTE_POS;
    if idx >= q.shape(0) * heads * q_len {
        terminate!();
    }
    // idx = (b·heads + h)·q_len + i, which is also the query's place in `lse`.
    let i = idx % q_len;
    let h = (idx / q_len) % heads;
    let b = idx / (q_len * heads);
    let q_base = (b * q_len + i) * width + h * d_head;
    let kv_head = (h / group) * d_head;
    let mut qs = Array::<f32>::new(d_head);
    let mut acc = Array::<f32>::new(d_head);
    #[unroll]
    for c in 0..d_head {
        qs[c] = f32::cast_from(q[q_base + c]) * scale;
        acc[c] = 0.0;
    }
    let mut max = f32::min_value();
    let mut sum = 0.0f32;
    let visible = i + kv_len - q_len + 1;
    let first = first_key(starts, b, i, visible - 1, packed);
    for j in first..visible {
        let k_base = (b * kv_len + j) * kv_width + kv_head;
        let mut s = 0.0f32;
        #[unroll]
        for c in 0..d_head {
            s += qs[c] * f32::cast_from(k[k_base + c]);
        }
        let new_max = f32::max(max, s);
        let correction = f32::exp(max - new_max);
        let p = f32::exp(s - new_max);
        sum = sum * correction + p;
        #[unroll]
        for c in 0..d_head {
            acc[c] = acc[c] * correction + p * f32::cast_from(v[k_base + c]);
        }
        max = new_max;
    }
    #[unroll]
    for c in 0..d_head {
        out[q_base + c] = F::cast_from(acc[c] / sum);
    }
    lse[idx] = F::cast_from(max + f32::ln(sum));
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn attention_backward_kernel<F: Float, I: Int>(
    dout: &Tensor<F>,
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    out: &Tensor<F>,
    lse: &Tensor<F>,
    starts: &Tensor<I>,
    dq: &mut Tensor<F>,
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
    heads: u32,
    scale: f32,
    #[comptime] d_head: usize,
    #[comptime] packed: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let heads = heads as usize;
    let batch = q.shape(0);
    let q_len = q.shape(1);
    let kv_len = k.shape(1);
    let offset = kv_len - q_len;
    let width = heads * d_head;
    let kv_width = k.shape(2);
    let kv_heads = kv_width / d_head;
    let group = heads / kv_heads;
    let queries = batch * heads * q_len;
    let idx = ABSOLUTE_POS;
    if idx >= queries + batch * kv_heads * kv_len {
        terminate!();
    }
    let mut acc = Array::<f32>::new(d_head);
    #[unroll]
    for c in 0..d_head {
        acc[c] = 0.0;
    }
    if idx < queries {
        // dq_i = scale·Σ_j p_ij·(dout_i·v_j − D_i)·k_j, D_i = dout_i·out_i. The unit's own rows
        // (q_i, pre-scaled, and dout_i) live in registers: read from memory at every key, each
        // lane of a warp would read a row of its own (32 rows per load), where the keys' rows
        // are the same for every lane (one row per load, broadcast).
        let i = idx % q_len;
        let h = (idx / q_len) % heads;
        let b = idx / (q_len * heads);
        let q_base = (b * q_len + i) * width + h * d_head;
        let mut qs = Array::<f32>::new(d_head);
        let mut dos = Array::<f32>::new(d_head);
        let mut delta = 0.0f32;
        #[unroll]
        for c in 0..d_head {
            qs[c] = f32::cast_from(q[q_base + c]) * scale;
            dos[c] = f32::cast_from(dout[q_base + c]);
            delta += dos[c] * f32::cast_from(out[q_base + c]);
        }
        let l = f32::cast_from(lse[idx]);
        let kv_head = (h / group) * d_head;
        let first = first_key(starts, b, i, i + offset, packed);
        for j in first..i + offset + 1 {
            let k_base = (b * kv_len + j) * kv_width + kv_head;
            let mut s = 0.0f32;
            let mut dp = 0.0f32;
            #[unroll]
            for c in 0..d_head {
                s += qs[c] * f32::cast_from(k[k_base + c]);
                dp += dos[c] * f32::cast_from(v[k_base + c]);
            }
            let ds = f32::exp(s - l) * (dp - delta);
            #[unroll]
            for c in 0..d_head {
                acc[c] += ds * f32::cast_from(k[k_base + c]);
            }
        }
        #[unroll]
        for c in 0..d_head {
            dq[q_base + c] = F::cast_from(scale * acc[c]);
        }
    } else {
        // dv_j = Σ_i p_ij·dout_i and dk_j = scale·Σ_i p_ij·(dout_i·v_j − D_i)·q_i over the
        // queries that see key j (i + offset ≥ j, and a start at or before j), of every query
        // head sharing the key's head. The key's rows live in registers, and the lanes of a
        // warp (consecutive keys) walk the queries in step from the lowest key's first query,
        // each skipping those it does not see: every query row is then one broadcast load for
        // the warp, where lanes starting at their own first query read 32 rows per load (which
        // made this branch 13 ms of a 231 ms LLM step on an H200, 2026-11-30).
        let key = idx - queries;
        let j = key % kv_len;
        let g_head = (key / kv_len) % kv_heads;
        let b = key / (kv_len * kv_heads);
        let k_base = (b * kv_len + j) * kv_width + g_head * d_head;
        let mut ks = Array::<f32>::new(d_head);
        let mut vs = Array::<f32>::new(d_head);
        let mut acc_v = Array::<f32>::new(d_head);
        #[unroll]
        for c in 0..d_head {
            ks[c] = f32::cast_from(k[k_base + c]) * scale;
            vs[c] = f32::cast_from(v[k_base + c]);
            acc_v[c] = 0.0;
        }
        let first = usize::max(j, offset) - offset;
        // The warp's lowest key in this key's sequence and head (a warp is 32 aligned units).
        let lowest = j - usize::min(idx % 32, j);
        let start = usize::max(lowest, offset) - offset;
        // The queries past the key's example: with starts, the first whose start lies after j.
        let mut end = q_len;
        if comptime!(packed) {
            let mut i = first;
            while i < q_len {
                if first_key(starts, b, i, i + offset, packed) > j {
                    end = i;
                    i = q_len;
                }
                i += 1;
            }
        }
        for h in g_head * group..(g_head + 1) * group {
            for i in start..end {
                if i >= first {
                    let q_base = (b * q_len + i) * width + h * d_head;
                    let l = f32::cast_from(lse[(b * heads + h) * q_len + i]);
                    let mut s = 0.0f32;
                    let mut dp = 0.0f32;
                    let mut delta = 0.0f32;
                    #[unroll]
                    for c in 0..d_head {
                        let g = f32::cast_from(dout[q_base + c]);
                        s += ks[c] * f32::cast_from(q[q_base + c]);
                        dp += g * vs[c];
                        delta += g * f32::cast_from(out[q_base + c]);
                    }
                    let p = f32::exp(s - l);
                    let ds = p * (dp - delta);
                    #[unroll]
                    for c in 0..d_head {
                        acc_v[c] += p * f32::cast_from(dout[q_base + c]);
                        acc[c] += ds * f32::cast_from(q[q_base + c]);
                    }
                }
            }
        }
        #[unroll]
        for c in 0..d_head {
            dk[k_base + c] = F::cast_from(scale * acc[c]);
            dv[k_base + c] = F::cast_from(acc_v[c]);
        }
    }
}

/// What the kernels' indexing assumes, which `ops::causal_attention` checks with a clear error
/// before any backend is called: a direct caller of the backend methods gets this assertion.
fn check_shapes(q_len: usize, kv_len: usize, width: usize, kv_width: usize, heads: usize) {
    let whole = heads > 0 && width.is_multiple_of(heads) && kv_width > 0;
    debug_assert!(
        q_len <= kv_len
            && whole
            && kv_width.is_multiple_of(width / heads)
            && heads.is_multiple_of(kv_width / (width / heads)),
        "causal attention of {q_len} queries over {kv_len} keys, width {width} in {heads} heads, \
         keys {kv_width} wide"
    );
}

/// The starts the kernels read, and whether there are any: a one-element placeholder (never
/// read, allocated without a launch) stands in for none.
fn starts_arg<R: CubeRuntime>(
    like: &CubeTensor<R>,
    starts: Option<CubeTensor<R>>,
) -> (CubeTensor<R>, bool) {
    match starts {
        Some(starts) => (dense_input(starts), true),
        None => (dense_output(like, Shape::new([1]), DType::I32), false),
    }
}

/// `(out, lse)`.
pub(crate) fn forward<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    heads: usize,
    starts: Option<CubeTensor<R>>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (q, k, v) = (dense_input(q), dense_input(k), dense_input(v));
    let (starts, packed) = starts_arg(&q, starts);
    let [batch, q_len, width] = q.meta.shape().dims::<3>();
    check_shapes(q_len, k.meta.shape()[1], width, k.meta.shape()[2], heads);
    let d_head = width / heads;
    let dtype = q.dtype;
    let out = dense_output(&q, Shape::new([batch, q_len, width]), dtype);
    let lse = dense_output(&q, Shape::new([batch, heads, q_len]), dtype);
    let units = batch * heads * q_len;
    if units > 0 {
        let (count, dim) = grid(&q, units);
        attention_forward_kernel::launch::<R>(
            &q.client.clone(),
            count,
            dim,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            starts.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            heads as u32,
            (d_head as f32).powf(-0.5),
            d_head,
            packed,
            [dtype.into(), starts.dtype.into()],
        );
    }
    (out, lse)
}

/// `[dq, dk, dv]` in one launch.
pub(crate) fn backward<R: CubeRuntime>(
    dout: CubeTensor<R>,
    [q, k, v]: [CubeTensor<R>; 3],
    out: CubeTensor<R>,
    lse: CubeTensor<R>,
    heads: usize,
    starts: Option<CubeTensor<R>>,
) -> [CubeTensor<R>; 3] {
    let (q, k, v) = (dense_input(q), dense_input(k), dense_input(v));
    let (starts, packed) = starts_arg(&q, starts);
    let (dout, out, lse) = (dense_input(dout), dense_input(out), dense_input(lse));
    let [batch, q_len, width] = q.meta.shape().dims::<3>();
    let [_, kv_len, kv_width] = k.meta.shape().dims::<3>();
    check_shapes(q_len, kv_len, width, kv_width, heads);
    let d_head = width / heads;
    let kv_heads = kv_width / d_head;
    let dtype = q.dtype;
    let dq = dense_output(&q, Shape::new([batch, q_len, width]), dtype);
    let dk = dense_output(&q, Shape::new([batch, kv_len, kv_width]), dtype);
    let dv = dense_output(&q, Shape::new([batch, kv_len, kv_width]), dtype);
    let units = batch * (heads * q_len + kv_heads * kv_len);
    if units > 0 {
        let (count, dim) = grid(&q, units);
        attention_backward_kernel::launch::<R>(
            &q.client.clone(),
            count,
            dim,
            dout.into_tensor_arg(),
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            out.into_tensor_arg(),
            lse.into_tensor_arg(),
            starts.clone().into_tensor_arg(),
            dq.clone().into_tensor_arg(),
            dk.clone().into_tensor_arg(),
            dv.clone().into_tensor_arg(),
            heads as u32,
            (d_head as f32).powf(-0.5),
            d_head,
            packed,
            [dtype.into(), starts.dtype.into()],
        );
    }
    [dq, dk, dv]
}
