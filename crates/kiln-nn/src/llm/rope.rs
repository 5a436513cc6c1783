//! Rotary position embeddings as Hugging Face's LLaMA computes them: half-split rotation
//! (`rotate_half`), the base `rope_theta`, and LLaMA 3's frequency rescaling.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::{LlmConfig, RopeScaling};

/// The rotary frequencies of one head width; applies the rotation at any positions.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    inv_freq: Vec<f32>,
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
        }
    }

    /// Rotates `x` `[batch, seq, heads, head_dim]` for positions `start..start + seq`.
    pub fn apply<B: Backend>(&self, x: Tensor<B, 4>, start: usize) -> Tensor<B, 4> {
        let [_, seq, _, dim] = x.dims();
        let half = dim / 2;
        let (mut cos, mut sin) = (Vec::with_capacity(seq * dim), Vec::with_capacity(seq * dim));
        for p in start..start + seq {
            // cat(freqs, freqs), as Hugging Face lays the two halves out.
            for i in 0..dim {
                let angle = p as f32 * self.inv_freq[i % half];
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        let device = x.device();
        let table = |v: Vec<f32>| {
            Tensor::<B, 2>::from_data(TensorData::new(v, [seq, dim]), &device)
                .reshape([1, seq, 1, dim])
                .cast(x.dtype())
        };
        let (cos, sin) = (table(cos), table(sin));
        let first = x.clone().narrow(3, 0, half);
        let second = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![second.neg(), first], 3);
        x * cos + rotated * sin
    }
}
