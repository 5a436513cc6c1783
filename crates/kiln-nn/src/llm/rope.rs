//! Rotary position embeddings as Hugging Face's LLaMA computes them: half-split rotation
//! (`rotate_half`), the base `rope_theta`, and LLaMA 3's frequency rescaling; and the
//! [`Positions`] of a batch's tokens, which the attention reads: their rotations and the first
//! key each token sees (its example's start in packed rows, the start of its sliding window).

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use kiln_core::data::dense_tensor;
use kiln_kernels::{KernelBackend, ops};

use super::{LlmConfig, PackedRows, RopeScaling};

/// The rotary frequencies of one head width, and the attention's sliding window if any: what
/// the positions of a batch's tokens are built from ([`Rope::positions`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    inv_freq: Vec<f32>,
    window: Option<usize>,
}

impl Rope {
    /// The frequencies `config` names.
    pub fn new(config: &LlmConfig) -> Self {
        let dim = config.head_dim;
        let base = config.rope_theta;
        let mut inv_freq: Vec<f64> = (0..dim / 2)
            .map(|i| 1.0 / base.powf((2 * i) as f64 / dim as f64))
            .collect();
        if let Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) = config.rope_scaling
        {
            let context = original_max_position_embeddings as f64;
            let (low_wavelen, high_wavelen) =
                (context / low_freq_factor, context / high_freq_factor);
            for f in &mut inv_freq {
                let wavelen = 2.0 * std::f64::consts::PI / *f;
                *f = if wavelen > low_wavelen {
                    *f / factor
                } else if wavelen < high_wavelen {
                    *f
                } else {
                    // Between the two: a smooth ramp from scaled to kept.
                    let smooth = (context / wavelen - low_freq_factor)
                        / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * *f / factor + smooth * *f
                };
            }
        }
        Self {
            inv_freq: inv_freq.into_iter().map(|f| f as f32).collect(),
            window: config.sliding_window,
        }
    }

    /// The rotation tables of positions `positions` in `dtype` on `device`: Hugging Face's
    /// `cat(freqs, freqs)` layout, the sine table carrying `rotate_half`'s minus sign over the
    /// first half. Built once per forward and shared by every layer's queries and keys.
    fn tables<B: Backend>(
        &self,
        positions: Range<usize>,
        device: &B::Device,
        dtype: DType,
    ) -> Positions<B> {
        let (seq, half) = (positions.len(), self.inv_freq.len());
        let dim = 2 * half;
        let (mut cos, mut sin) = (Vec::with_capacity(seq * dim), Vec::with_capacity(seq * dim));
        let (mut cos_half, mut sin_half) = (vec![0.0f32; half], vec![0.0f32; half]);
        for p in positions {
            for (f, (c, s)) in self
                .inv_freq
                .iter()
                .zip(cos_half.iter_mut().zip(&mut sin_half))
            {
                (*s, *c) = (p as f32 * f).sin_cos();
            }
            cos.extend_from_slice(&cos_half);
            cos.extend_from_slice(&cos_half);
            sin.extend(sin_half.iter().map(|s| -s));
            sin.extend_from_slice(&sin_half);
        }
        // Built in the hidden states' dtype on the host: a cast on the device would be a launch.
        let table = |v: Vec<f32>| {
            let data = TensorData::new(v, [seq, dim]).convert_dtype(dtype);
            Tensor::<B, 2>::from_data(data, (device, dtype))
        };
        Positions {
            cos: table(cos),
            sin: table(sin),
            starts: None,
        }
    }

    /// The positions of `batch` rows of queries at `queries` (`0..seq` in training; the
    /// positions after a cache when generating), whose keys are the positions `0..queries.end`:
    /// the same in every row, or in `packed` rows (training only) each example's own from 0 (a
    /// table row per token, gathered from the tables of `0..seq`: two launches a forward), its
    /// queries seeing only its own keys. Under a sliding window of `w`, a query at `p` sees
    /// no key before `p + 1 − w` either (built on the host, or one more launch when packed).
    pub fn positions<B: Backend>(
        &self,
        batch: usize,
        queries: Range<usize>,
        packed: Option<&PackedRows<B>>,
        device: &B::Device,
        dtype: DType,
    ) -> Positions<B> {
        let window = self.window_starts(batch, queries.clone(), device);
        let Some(packed) = packed else {
            let Positions { cos, sin, .. } = self.tables(queries, device, dtype);
            return Positions {
                cos,
                sin,
                starts: window,
            };
        };
        debug_assert_eq!(queries.start, 0, "packed rows are trained from their start");
        let tables = self.tables(queries, device, dtype);
        let [rows, len] = packed.positions.dims();
        let tokens = packed.positions.clone().reshape([rows * len]);
        let starts = match window {
            Some(window) => window.max_pair(packed.starts.clone()),
            None => packed.starts.clone(),
        };
        Positions {
            cos: tables.cos.select(0, tokens.clone()),
            sin: tables.sin.select(0, tokens),
            starts: Some(starts),
        }
    }

    /// Each query's first key under the sliding window, `[batch, queries]`; `None` when no
    /// query's window excludes a key.
    fn window_starts<B: Backend>(
        &self,
        batch: usize,
        queries: Range<usize>,
        device: &B::Device,
    ) -> Option<Tensor<B, 2, Int>> {
        let window = self.window.filter(|&w| queries.end > w)?;
        let n = queries.len();
        let row = queries.map(|p| (p + 1).saturating_sub(window) as i64);
        let starts: Vec<i64> = row.collect::<Vec<_>>().repeat(batch);
        Some(dense_tensor(TensorData::new(starts, [batch, n]), device))
    }
}

/// The positions of a batch's tokens on a device ([`Rope::tables`], [`Rope::positions`]): the
/// rotation tables of their positions, and in packed rows each token's example's first
/// position, before which its query sees nothing.
#[derive(Debug, Clone)]
pub struct Positions<B: Backend> {
    /// `[seq, head_dim]`, or `[batch·seq, head_dim]` in packed rows.
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    /// `[batch, seq]` in packed rows.
    starts: Option<Tensor<B, 2, Int>>,
}

impl<B: KernelBackend> Positions<B> {
    /// Rotates `x` `[batch, seq, heads, head_dim]` at the tables' positions: Hugging Face's
    /// `x·cos + rotate_half(x)·sin` through Kiln's [`ops::rope`].
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        ops::rope(x, self.cos.clone(), self.sin.clone())
            .expect("the tables are built for x's positions and head width")
    }

    /// Causal attention of `q` over `k`, `v` (see [`ops::causal_attention`]), within each
    /// packed example when the rows are packed.
    pub fn attend(
        &self,
        q: Tensor<B, 3>,
        k: Tensor<B, 3>,
        v: Tensor<B, 3>,
        heads: usize,
    ) -> Tensor<B, 3> {
        match &self.starts {
            Some(starts) => ops::packed_causal_attention(q, k, v, heads, starts.clone()),
            None => ops::causal_attention(q, k, v, heads),
        }
        .unwrap_or_else(|e| panic!("{e}"))
    }
}
