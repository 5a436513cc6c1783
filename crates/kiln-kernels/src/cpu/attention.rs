//! Causal multi-head attention on `[batch, rows, d_model]` rows, forward and backward, with no
//! `[batch, heads, seq, seq]` tensor (scores or mask) and no head split or merge copies of the
//! inputs.
//!
//! Queries may be fewer than keys: they are then the last `q_len` of the `kv_len` positions
//! (a decoder extending a cached prefix), and query `i` sees keys `0..=i + kv_len − q_len`.
//! Packed sequences give each query its first key too (its example's first position): a block
//! of queries then computes only the keys from the earliest start among its rows, so short
//! packed examples cost a fraction of a full causal block.
//!
//! Keys and values may have fewer heads than queries (grouped-query attention): query head `h`
//! reads key and value head `h / (heads / kv_heads)` where it lies, and the backward sums the
//! group's gradients into it, so the shared heads are never repeated into copies.
//!
//! Both passes work one head of one sequence per task (so a single long sequence still keeps
//! every core busy), a block of [`ROWS`] query rows at a time, every product through `gemm` on
//! strided views of the rows as they lie ([`super::matmul`]): the scores `Q·Kᵀ` of the keys
//! the block's last row sees, the causal softmax row by row, then `P·V`. A task writes its
//! head's columns into a buffer of its own, copied into place once every task is done.
//!
//! The forward saves one log-sum-exp per query and head; the backward recomputes the
//! probabilities from it (FlashAttention's recipe).

use rayon::prelude::*;

use super::matmul::{View, ViewMut, matmul};
use super::simd::{Kernel, dot, exp, sum, vectorized};

/// The shape every function here works on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub batch: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub heads: usize,
    /// Key and value heads, dividing `heads`.
    pub kv_heads: usize,
    pub d_head: usize,
}

impl Dims {
    fn d_model(&self) -> usize {
        self.heads * self.d_head
    }

    /// The width of a key or value row.
    fn kv_model(&self) -> usize {
        self.kv_heads * self.d_head
    }

    /// The columns of query head `head` in a query row.
    fn q_cols(&self, head: usize) -> std::ops::Range<usize> {
        head * self.d_head..(head + 1) * self.d_head
    }

    /// The columns of the key and value head query head `head` reads, in their rows.
    fn kv_cols(&self, head: usize) -> std::ops::Range<usize> {
        let kv_head = head / (self.heads / self.kv_heads);
        kv_head * self.d_head..(kv_head + 1) * self.d_head
    }

    fn scale(&self) -> f32 {
        (self.d_head as f32).powf(-0.5)
    }

    /// How many keys come before the first query.
    fn offset(&self) -> usize {
        self.kv_len - self.q_len
    }
}

/// Query rows per block: a block's scores `[ROWS, keys]` stay in cache, and it reads only the
/// keys its last row sees, so the causal mask's upper triangle costs at most half a block per
/// row.
const ROWS: usize = 64;

/// Exponentiates `scores` in place against `max`; returns their sum.
#[inline(always)]
fn exp_sum(scores: &mut [f32], max: f32) -> f32 {
    for s in scores.iter_mut() {
        *s = exp(*s - max);
    }
    sum(scores)
}

/// Where [`scatter_heads`] puts a query head's part.
#[derive(Clone, Copy)]
enum Rows {
    /// Its own columns of `[batch, len, d_model]` query rows.
    Queries,
    /// The columns of the key and value head it reads, in `[batch, len, kv_model]` rows,
    /// summed over the heads that share it (in head order).
    KeysValues,
}

/// Adds each task's `[len, d_head]` head (tasks in `(sequence, head)` order) into its columns
/// of fresh rows.
fn scatter_heads(parts: &[&[f32]], len: usize, dims: Dims, into: Rows) -> Vec<f32> {
    let dh = dims.d_head;
    let width = match into {
        Rows::Queries => dims.d_model(),
        Rows::KeysValues => dims.kv_model(),
    };
    let mut rows = vec![0.0; dims.batch * len * width];
    rows.par_chunks_mut(len * width)
        .zip(parts.par_chunks(dims.heads))
        .for_each(|(rows, heads)| {
            for (h, part) in heads.iter().enumerate() {
                let cols = match into {
                    Rows::Queries => dims.q_cols(h),
                    Rows::KeysValues => dims.kv_cols(h),
                };
                for (row, src) in rows.chunks_exact_mut(width).zip(part.chunks_exact(dh)) {
                    for (dst, &src) in row[cols.clone()].iter_mut().zip(src) {
                        *dst += src;
                    }
                }
            }
        });
    rows
}

/// Each query's first key, `[batch, q_len]`, already clamped to the query's own position; `None`
/// starts every query at key 0.
pub(crate) type Starts<'a> = Option<&'a [usize]>;

/// The first key query `i` of a sequence sees.
#[inline(always)]
fn start(starts: Starts<'_>, i: usize) -> usize {
    starts.map_or(0, |s| s[i])
}

/// The starts of sequence `b`.
fn sequence(starts: Starts<'_>, b: usize, q_len: usize) -> Starts<'_> {
    starts.map(|s| &s[b * q_len..(b + 1) * q_len])
}

/// `(out [batch, q_len, d_model], lse [batch, heads, q_len])`.
pub(crate) fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    starts: Starts<'_>,
    dims: Dims,
) -> (Vec<f32>, Vec<f32>) {
    let (q_block, kv_block) = (dims.q_len * dims.d_model(), dims.kv_len * dims.kv_model());
    let mut lse = vec![0.0; dims.batch * dims.heads * dims.q_len];
    let heads: Vec<Vec<f32>> = lse
        .par_chunks_mut(dims.q_len)
        .enumerate()
        .map(|(task, lse)| {
            let (b, head) = (task / dims.heads, task % dims.heads);
            let mut out = vec![0.0; dims.q_len * dims.d_head];
            vectorized(ForwardHead {
                qkv: [
                    &q[b * q_block..(b + 1) * q_block],
                    &k[b * kv_block..(b + 1) * kv_block],
                    &v[b * kv_block..(b + 1) * kv_block],
                ],
                head,
                starts: sequence(starts, b, dims.q_len),
                out: &mut out,
                lse,
                dims,
            });
            out
        })
        .collect();
    let heads: Vec<&[f32]> = heads.iter().map(Vec::as_slice).collect();
    (scatter_heads(&heads, dims.q_len, dims, Rows::Queries), lse)
}

/// One head of one sequence of the forward.
struct ForwardHead<'a> {
    qkv: [&'a [f32]; 3],
    head: usize,
    starts: Starts<'a>,
    out: &'a mut [f32],
    lse: &'a mut [f32],
    dims: Dims,
}

impl Kernel for ForwardHead<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let Self {
            qkv,
            head,
            starts,
            out,
            lse,
            dims,
        } = self;
        forward_head(qkv, head, starts, out, lse, dims);
    }
}

/// Head `head` of a sequence's rows into `out [q_len, d_head]` and `lse
/// [q_len]`, a block of query rows at a time: `S = Q·Kᵀ·scale`, each row's softmax over the
/// keys it sees (the rest zeroed), then `O = P·V`, over the keys from the block's earliest
/// start to those its last row sees.
#[inline(always)]
fn forward_head(
    [q, k, v]: [&[f32]; 3],
    head: usize,
    starts: Starts<'_>,
    out: &mut [f32],
    lse: &mut [f32],
    dims: Dims,
) {
    let (dh, d_model, kv_model) = (dims.d_head, dims.d_model(), dims.kv_model());
    let (cols, kv_cols, offset) = (dims.q_cols(head), dims.kv_cols(head), dims.offset());
    let mut probs = vec![0.0f32; ROWS.min(dims.q_len) * dims.kv_len];
    for first in (0..dims.q_len).step_by(ROWS) {
        let rows = first..(first + ROWS).min(dims.q_len);
        let keys = block_keys(&rows, starts, offset);
        let width = keys.len();
        let p = &mut probs[..rows.len() * width];
        matmul(
            ViewMut::rows(p, width, 0..rows.len(), 0..width),
            View::rows(q, d_model, rows.clone(), cols.clone()),
            View::rows(k, kv_model, keys.clone(), kv_cols.clone()).t(),
            dims.scale(),
            false,
        );
        for (r, p) in p.chunks_exact_mut(width).enumerate() {
            let i = rows.start + r;
            let seen = start(starts, i) - keys.start..i + offset + 1 - keys.start;
            let row = &mut p[seen.clone()];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let total = exp_sum(row, max);
            let inv = 1.0 / total;
            for p in row.iter_mut() {
                *p *= inv;
            }
            p[..seen.start].fill(0.0);
            p[seen.end..].fill(0.0);
            lse[i] = max + total.ln();
        }
        matmul(
            ViewMut::rows(out, dh, rows.clone(), 0..dh),
            View::rows(p, width, 0..rows.len(), 0..width),
            View::rows(v, kv_model, keys.clone(), kv_cols.clone()),
            1.0,
            false,
        );
    }
}

/// The keys a block of query rows sees: from the earliest of their starts to the last row's
/// own position.
#[inline(always)]
fn block_keys(
    rows: &std::ops::Range<usize>,
    starts: Starts<'_>,
    offset: usize,
) -> std::ops::Range<usize> {
    let first = rows.clone().map(|i| start(starts, i)).min().unwrap_or(0);
    first..rows.end + offset
}

/// Inputs of the backward: the forward's inputs and results, and the output's gradient.
pub(crate) struct Saved<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub out: &'a [f32],
    pub lse: &'a [f32],
    pub dout: &'a [f32],
    pub starts: Starts<'a>,
}

/// `(dq [batch, q_len, d_model], dk, dv [batch, kv_len, kv_model])`.
pub(crate) fn backward(saved: &Saved<'_>, dims: Dims) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (q_block, kv_block) = (dims.q_len * dims.d_model(), dims.kv_len * dims.kv_model());
    let (q_part, kv_part) = (dims.q_len * dims.d_head, dims.kv_len * dims.d_head);
    let parts: Vec<[Vec<f32>; 3]> = (0..dims.batch * dims.heads)
        .into_par_iter()
        .map(|task| {
            let (b, head) = (task / dims.heads, task % dims.heads);
            let qs = b * q_block..(b + 1) * q_block;
            let kvs = b * kv_block..(b + 1) * kv_block;
            let sequence = Saved {
                q: &saved.q[qs.clone()],
                k: &saved.k[kvs.clone()],
                v: &saved.v[kvs],
                out: &saved.out[qs.clone()],
                lse: &saved.lse[task * dims.q_len..(task + 1) * dims.q_len],
                dout: &saved.dout[qs],
                starts: sequence(saved.starts, b, dims.q_len),
            };
            let [mut dq, mut dk, mut dv] = [q_part, kv_part, kv_part].map(|n| vec![0.0; n]);
            vectorized(BackwardHead {
                saved: sequence,
                head,
                grads: [&mut dq, &mut dk, &mut dv],
                dims,
            });
            [dq, dk, dv]
        })
        .collect();
    let [dq, dk, dv] = [0, 1, 2].map(|i| {
        let heads: Vec<&[f32]> = parts.iter().map(|p| p[i].as_slice()).collect();
        match i {
            0 => scatter_heads(&heads, dims.q_len, dims, Rows::Queries),
            _ => scatter_heads(&heads, dims.kv_len, dims, Rows::KeysValues),
        }
    });
    (dq, dk, dv)
}

/// One head of one sequence of the backward.
struct BackwardHead<'a> {
    saved: Saved<'a>,
    head: usize,
    grads: [&'a mut [f32]; 3],
    dims: Dims,
}

impl Kernel for BackwardHead<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        backward_head(&self.saved, self.head, self.grads, self.dims);
    }
}

/// Head `head` of one sequence into `dq [q_len, d_head]`, `dk` and `dv [kv_len, d_head]`, a
/// block of query rows at a time. With `P` the probabilities recomputed from the
/// log-sum-exp, `dP = dO·Vᵀ`, `D_i = Σ_j P_ij·dP_ij` (`= dO_i·O_i`) and
/// `dS = P ∘ (dP − D)·scale`: `dQ = dS·K`, `dK += dSᵀ·Q`, `dV += Pᵀ·dO` over the blocks, each
/// over the keys it sees ([`block_keys`]).
#[inline(always)]
fn backward_head(s: &Saved<'_>, head: usize, [dq, dk, dv]: [&mut [f32]; 3], dims: Dims) {
    let (dh, d_model, kv_model) = (dims.d_head, dims.d_model(), dims.kv_model());
    let (cols, kv_cols, offset) = (dims.q_cols(head), dims.kv_cols(head), dims.offset());
    let scale = dims.scale();
    let block = ROWS.min(dims.q_len) * dims.kv_len;
    let (mut probs, mut dscores) = (vec![0.0f32; block], vec![0.0f32; block]);
    let lse = s.lse;
    for first in (0..dims.q_len).step_by(ROWS) {
        let rows = first..(first + ROWS).min(dims.q_len);
        let keys = block_keys(&rows, s.starts, offset);
        let width = keys.len();
        let (p, ds) = (
            &mut probs[..rows.len() * width],
            &mut dscores[..rows.len() * width],
        );
        let (q, k) = (
            View::rows(s.q, d_model, rows.clone(), cols.clone()),
            View::rows(s.k, kv_model, keys.clone(), kv_cols.clone()),
        );
        let (v, dout) = (
            View::rows(s.v, kv_model, keys.clone(), kv_cols.clone()),
            View::rows(s.dout, d_model, rows.clone(), cols.clone()),
        );
        matmul(
            ViewMut::rows(p, width, 0..rows.len(), 0..width),
            q,
            k.t(),
            scale,
            false,
        );
        matmul(
            ViewMut::rows(ds, width, 0..rows.len(), 0..width),
            dout,
            v.t(),
            1.0,
            false,
        );
        for (r, (p, ds)) in p
            .chunks_exact_mut(width)
            .zip(ds.chunks_exact_mut(width))
            .enumerate()
        {
            let i = rows.start + r;
            let seen = start(s.starts, i) - keys.start..i + offset + 1 - keys.start;
            // The forward's log-sum-exp shifts the scores; the row is normalised by its own
            // sum, so that its probabilities are those of the scores recomputed here (whose
            // rounding differs from the forward's) and a row of one key has P = 1 exactly.
            let l = lse[i];
            for p in &mut p[seen.clone()] {
                *p = exp(*p - l);
            }
            let total = sum(&p[seen.clone()]);
            for p in &mut p[seen.clone()] {
                *p /= total;
            }
            // D_i as Σ_j P_ij·dP_ij, which equals dO_i·O_i: from the same products as dP,
            // so that dS sums to zero over the row as the softmax's Jacobian does.
            let delta = dot(&p[seen.clone()], &ds[seen.clone()]);
            for (p, ds) in p[seen.clone()].iter().zip(&mut ds[seen.clone()]) {
                *ds = p * (*ds - delta) * scale;
            }
            for t in [&mut *p, &mut *ds] {
                t[..seen.start].fill(0.0);
                t[seen.end..].fill(0.0);
            }
        }
        let (p, ds) = (
            View::rows(p, width, 0..rows.len(), 0..width),
            View::rows(ds, width, 0..rows.len(), 0..width),
        );
        matmul(
            ViewMut::rows(dq, dh, rows.clone(), 0..dh),
            ds,
            k,
            1.0,
            false,
        );
        matmul(
            ViewMut::rows(dk, dh, keys.clone(), 0..dh),
            ds.t(),
            q,
            1.0,
            true,
        );
        matmul(ViewMut::rows(dv, dh, keys, 0..dh), p.t(), dout, 1.0, true);
    }
}
