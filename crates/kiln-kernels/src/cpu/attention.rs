//! Causal multi-head attention on `[batch, rows, d_model]` rows, forward and backward, one
//! pass per head, with no `[batch, heads, seq, seq]` tensor (scores or mask) and no head split
//! or merge copies of the tensors.
//!
//! Queries may be fewer than keys: they are then the last `q_len` of the `kv_len` positions
//! (a decoder extending a cached prefix), and query `i` sees keys `0..=i + kv_len − q_len`.
//!
//! The forward works a query row at a time: scores, the causal mask, the softmax and the
//! weighted sum, each head gathered from its columns into small padded buffers. Every inner
//! loop is a register tile: eight lanes of keys (for scores) or of head dimensions (for
//! weighted sums) accumulate in a `[f32; 8]` that LLVM keeps in one vector register, and the
//! buffers are padded to multiples of eight so that no tile needs a tail. A query alone gives
//! the same bits as in the full sequence, which generating with a cache relies on.
//!
//! The forward saves one log-sum-exp per query and head; the backward recomputes the
//! probabilities from it (FlashAttention's recipe) a block of query rows at a time, with
//! matrix products on strided views of the rows ([`super::matmul`]).

use rayon::prelude::*;

use super::matmul::{View, ViewMut, matmul};
use super::simd::{Kernel, dot, exp, sum, vectorized};

/// The lanes of one register tile.
const LANES: usize = 8;

/// Keys per group of tiles in [`dots`]: four tiles.
const GROUP: usize = 4 * LANES;

fn padded(n: usize) -> usize {
    n.div_ceil(LANES) * LANES
}

/// The shape every function here works on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub batch: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub heads: usize,
    pub d_head: usize,
}

impl Dims {
    fn d_model(&self) -> usize {
        self.heads * self.d_head
    }

    fn scale(&self) -> f32 {
        (self.d_head as f32).powf(-0.5)
    }

    /// How many keys come before the first query.
    fn offset(&self) -> usize {
        self.kv_len - self.q_len
    }
}

/// One head's columns of a sequence's rows, zero-padded: `rows` is `[len, dh_pad]` (`d_head`
/// up to a multiple of 8) and, when asked for, `columns` is its transpose `[d_head, len_pad]`
/// (`len` up to a multiple of 32, [`dots`]' groups).
struct Head {
    rows: Vec<f32>,
    columns: Vec<f32>,
    dh_pad: usize,
    len_pad: usize,
}

impl Head {
    fn new(len: usize, d_head: usize, transposed: bool) -> Self {
        let (dh_pad, len_pad) = (padded(d_head), len.div_ceil(GROUP) * GROUP);
        Self {
            rows: vec![0.0; len * dh_pad],
            columns: if transposed {
                vec![0.0; d_head * len_pad]
            } else {
                Vec::new()
            },
            dh_pad,
            len_pad,
        }
    }

    /// Gathers head `head` (`d_head` columns) of `block`'s rows of `d_model`.
    #[inline(always)]
    fn load(&mut self, block: &[f32], head: usize, d_head: usize, d_model: usize) {
        let src_rows = block.chunks_exact(d_model);
        for (j, (row, dst)) in src_rows
            .zip(self.rows.chunks_exact_mut(self.dh_pad))
            .enumerate()
        {
            let src = &row[head * d_head..(head + 1) * d_head];
            dst[..d_head].copy_from_slice(src);
            if !self.columns.is_empty() {
                for (column, &v) in self.columns.chunks_exact_mut(self.len_pad).zip(src) {
                    column[j] = v;
                }
            }
        }
    }
}

/// `out[j] = q·k_j` for the first `count` keys (and up to the next multiple of 32, which the
/// caller ignores): groups of four tiles of eight keys, four independent accumulators so that
/// the multiply-adds do not wait on each other, the head dimension reduced in registers.
#[inline(always)]
fn dots(q: &[f32], keys: &Head, count: usize, out: &mut [f32]) {
    let groups = out[..count.div_ceil(GROUP) * GROUP].chunks_exact_mut(GROUP);
    for (group, out) in groups.enumerate() {
        let mut acc = [[0.0f32; LANES]; 4];
        for (&q, column) in q.iter().zip(keys.columns.chunks_exact(keys.len_pad)) {
            let keys = &column[group * GROUP..(group + 1) * GROUP];
            for (acc, keys) in acc.iter_mut().zip(keys.chunks_exact(LANES)) {
                for (a, &k) in acc.iter_mut().zip(keys) {
                    *a += q * k;
                }
            }
        }
        for (out, acc) in out.chunks_exact_mut(LANES).zip(&acc) {
            out.copy_from_slice(acc);
        }
    }
}

/// `out = Σ w_j · rows_j` over padded rows (`out.len()` = their padded width), in tiles of
/// eight dimensions accumulated in registers, four rows at a time into four accumulators so
/// that the multiply-adds do not wait on each other.
#[inline(always)]
fn weighted<'a>(w: impl Iterator<Item = &'a f32> + Clone, rows: &[f32], out: &mut [f32]) {
    #[inline(always)]
    fn add(acc: &mut [f32; LANES], w: f32, row: &[f32]) {
        for (a, &r) in acc.iter_mut().zip(row) {
            *a += w * r;
        }
    }
    let width = out.len();
    for (tile, out) in out.chunks_exact_mut(LANES).enumerate() {
        let mut acc = [[0.0f32; LANES]; 4];
        let lanes = tile * LANES..(tile + 1) * LANES;
        let mut terms = w.clone().zip(rows.chunks_exact(width));
        'rows: loop {
            for acc in acc.iter_mut() {
                let Some((&w, row)) = terms.next() else {
                    break 'rows;
                };
                add(acc, w, &row[lanes.clone()]);
            }
        }
        let [a, b, c, d] = acc;
        for (i, out) in out.iter_mut().enumerate() {
            *out = (a[i] + b[i]) + (c[i] + d[i]);
        }
    }
}

/// Exponentiates `scores` in place against `max`; returns their sum.
#[inline(always)]
fn exp_sum(scores: &mut [f32], max: f32) -> f32 {
    for s in scores.iter_mut() {
        *s = exp(*s - max);
    }
    sum(scores)
}

/// `(out [batch, q_len, d_model], lse [batch, heads, q_len])`.
pub(crate) fn forward(q: &[f32], k: &[f32], v: &[f32], dims: Dims) -> (Vec<f32>, Vec<f32>) {
    let d_model = dims.d_model();
    let (q_block, kv_block) = (dims.q_len * d_model, dims.kv_len * d_model);
    let mut out = vec![0.0; q.len()];
    let mut lse = vec![0.0; dims.batch * dims.heads * dims.q_len];
    out.par_chunks_mut(q_block)
        .zip(lse.par_chunks_mut(dims.heads * dims.q_len))
        .zip(q.par_chunks(q_block))
        .zip(k.par_chunks(kv_block).zip(v.par_chunks(kv_block)))
        .for_each(|(((out, lse), q), (k, v))| {
            vectorized(ForwardSequence {
                qkv: [q, k, v],
                out,
                lse,
                dims,
            });
        });
    (out, lse)
}

/// One sequence of the forward, every head.
struct ForwardSequence<'a> {
    qkv: [&'a [f32]; 3],
    out: &'a mut [f32],
    lse: &'a mut [f32],
    dims: Dims,
}

impl Kernel for ForwardSequence<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        forward_sequence(self.qkv, self.out, self.lse, self.dims);
    }
}

#[inline(always)]
fn forward_sequence([q, k, v]: [&[f32]; 3], out: &mut [f32], lse: &mut [f32], dims: Dims) {
    let (dh, d_model) = (dims.d_head, dims.d_model());
    let mut keys = Head::new(dims.kv_len, dh, true);
    let mut values = Head::new(dims.kv_len, dh, false);
    let mut p = vec![0.0f32; keys.len_pad];
    let mut q_scaled = vec![0.0f32; dh];
    let mut o = vec![0.0f32; keys.dh_pad];
    for (h, lse) in lse.chunks_exact_mut(dims.q_len).enumerate() {
        keys.load(k, h, dh, d_model);
        values.load(v, h, dh, d_model);
        let cols = h * dh..(h + 1) * dh;
        let rows = q.chunks_exact(d_model).zip(out.chunks_exact_mut(d_model));
        for (i, ((q, out), lse)) in rows.zip(lse.iter_mut()).enumerate() {
            let count = i + dims.offset() + 1;
            for (s, &q) in q_scaled.iter_mut().zip(&q[cols.clone()]) {
                *s = q * dims.scale();
            }
            dots(&q_scaled, &keys, count, &mut p);
            let p = &mut p[..count];
            let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let total = exp_sum(p, max);
            weighted(p.iter(), &values.rows, &mut o);
            let inv = 1.0 / total;
            for (out, &o) in out[cols.clone()].iter_mut().zip(&o) {
                *out = o * inv;
            }
            *lse = max + total.ln();
        }
    }
}

/// Inputs of the backward: the forward's inputs and results, and the output's gradient.
pub(crate) struct Saved<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub out: &'a [f32],
    pub lse: &'a [f32],
    pub dout: &'a [f32],
}

/// `(dq [batch, q_len, d_model], dk, dv [batch, kv_len, d_model])`.
pub(crate) fn backward(saved: &Saved<'_>, dims: Dims) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let d_model = dims.d_model();
    let (q_block, kv_block) = (dims.q_len * d_model, dims.kv_len * d_model);
    let mut dq = vec![0.0; saved.q.len()];
    let (mut dk, mut dv) = (vec![0.0; saved.k.len()], vec![0.0; saved.k.len()]);
    dq.par_chunks_mut(q_block)
        .zip(dk.par_chunks_mut(kv_block))
        .zip(dv.par_chunks_mut(kv_block))
        .enumerate()
        .for_each(|(b, ((dq, dk), dv))| {
            let qs = b * q_block..(b + 1) * q_block;
            let kvs = b * kv_block..(b + 1) * kv_block;
            let lse = b * dims.heads * dims.q_len..(b + 1) * dims.heads * dims.q_len;
            let sequence = Saved {
                q: &saved.q[qs.clone()],
                k: &saved.k[kvs.clone()],
                v: &saved.v[kvs],
                out: &saved.out[qs.clone()],
                lse: &saved.lse[lse],
                dout: &saved.dout[qs],
            };
            vectorized(BackwardSequence {
                saved: sequence,
                grads: [dq, dk, dv],
                dims,
            });
        });
    (dq, dk, dv)
}

/// One sequence of the backward, every head.
struct BackwardSequence<'a> {
    saved: Saved<'a>,
    grads: [&'a mut [f32]; 3],
    dims: Dims,
}

impl Kernel for BackwardSequence<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        backward_sequence(&self.saved, self.grads, self.dims);
    }
}

/// Query rows per block of the backward: a block's scores `[ROWS, keys]` stay in cache, and
/// it reads only the keys its last row sees, so the causal mask's upper triangle costs at most
/// half a block per row.
const ROWS: usize = 64;

/// One sequence, every head, a block of query rows at a time, every product through `gemm`
/// on strided views of the rows as they lie (no head gathered). With `P` the probabilities
/// recomputed from the log-sum-exp, `dP = dO·Vᵀ`, `D_i = Σ_j P_ij·dP_ij` (`= dO_i·O_i`) and
/// `dS = P ∘ (dP − D)·scale`: `dQ = dS·K`, `dK += dSᵀ·Q`, `dV += Pᵀ·dO` over the blocks.
#[inline(always)]
fn backward_sequence(s: &Saved<'_>, [dq, dk, dv]: [&mut [f32]; 3], dims: Dims) {
    let (dh, d_model, offset) = (dims.d_head, dims.d_model(), dims.offset());
    let scale = dims.scale();
    let mut probs = vec![0.0f32; ROWS * dims.kv_len];
    let mut dscores = vec![0.0f32; ROWS * dims.kv_len];
    for (h, lse) in s.lse.chunks_exact(dims.q_len).enumerate() {
        let cols = h * dh..(h + 1) * dh;
        for first in (0..dims.q_len).step_by(ROWS) {
            let rows = first..(first + ROWS).min(dims.q_len);
            // The keys the block's last row sees; every earlier row sees fewer.
            let keys = rows.end + offset;
            let (p, ds) = (
                &mut probs[..rows.len() * keys],
                &mut dscores[..rows.len() * keys],
            );
            let (q, k) = (
                View::rows(s.q, d_model, rows.clone(), cols.clone()),
                View::rows(s.k, d_model, 0..keys, cols.clone()),
            );
            let (v, dout) = (
                View::rows(s.v, d_model, 0..keys, cols.clone()),
                View::rows(s.dout, d_model, rows.clone(), cols.clone()),
            );
            matmul(
                ViewMut::rows(p, keys, 0..rows.len(), 0..keys),
                q,
                k.t(),
                scale,
                false,
            );
            matmul(
                ViewMut::rows(ds, keys, 0..rows.len(), 0..keys),
                dout,
                v.t(),
                1.0,
                false,
            );
            for (r, (p, ds)) in p
                .chunks_exact_mut(keys)
                .zip(ds.chunks_exact_mut(keys))
                .enumerate()
            {
                let i = rows.start + r;
                let seen = i + offset + 1;
                // The forward's log-sum-exp shifts the scores; the row is normalised by its own
                // sum, so that its probabilities are those of the scores recomputed here (whose
                // rounding differs from the forward's) and a row of one key has P = 1 exactly.
                let l = lse[i];
                for p in &mut p[..seen] {
                    *p = exp(*p - l);
                }
                let total = sum(&p[..seen]);
                for p in &mut p[..seen] {
                    *p /= total;
                }
                // D_i as Σ_j P_ij·dP_ij, which equals dO_i·O_i: from the same products as dP,
                // so that dS sums to zero over the row as the softmax's Jacobian does.
                let delta = dot(&p[..seen], &ds[..seen]);
                for (p, ds) in p[..seen].iter().zip(&mut ds[..seen]) {
                    *ds = p * (*ds - delta) * scale;
                }
                p[seen..].fill(0.0);
                ds[seen..].fill(0.0);
            }
            let (p, ds) = (
                View::rows(p, keys, 0..rows.len(), 0..keys),
                View::rows(ds, keys, 0..rows.len(), 0..keys),
            );
            matmul(
                ViewMut::rows(dq, d_model, rows.clone(), cols.clone()),
                ds,
                k,
                1.0,
                false,
            );
            matmul(
                ViewMut::rows(dk, d_model, 0..keys, cols.clone()),
                ds.t(),
                q,
                1.0,
                true,
            );
            matmul(
                ViewMut::rows(dv, d_model, 0..keys, cols.clone()),
                p.t(),
                dout,
                1.0,
                true,
            );
        }
    }
}
