//! The 4-bit code books and block-wise absmax quantisation, on the host.
//!
//! A weight `W` (`[k, n]`, the layout of Burn's `Linear`: `y = x·W`) is cut, column by column,
//! into blocks of [`BLOCK`] consecutive rows of `k`: the reduction dimension of `x·W`, so a matmul
//! tile that walks `k` meets one scale per column per block. Each block stores its absolute
//! maximum as the scale and every value as the index of the nearest entry of a 16-entry code
//! book normalised to `[-1, 1]`; dequantisation is `codebook[code] · scale`.

use serde::{Deserialize, Serialize};

/// Rows of `k` that share one scale.
pub const BLOCK: usize = 64;

/// Codes per packed 32-bit word.
pub const CODES_PER_WORD: usize = 8;

/// The NF4 code book of QLoRA (Dettmers et al., 2023): the 16 quantiles of a standard normal
/// distribution normalised to `[-1, 1]`, with an exact zero. The values are those published with
/// the paper (bitsandbytes), so checkpoints quantised elsewhere decode the same.
const NF4: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// Which 4-bit code book a quantised weight uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum QuantFormat {
    /// NormalFloat-4: quantiles of a normal distribution, the right grid for weights that are
    /// roughly normal (QLoRA's choice).
    #[default]
    Nf4,
    /// Symmetric int4: `q ∈ [-7, 7]`, value `q / 7 · absmax`, an evenly spaced grid.
    Int4,
}

impl QuantFormat {
    /// The 16 normalised values a code decodes to, in increasing order.
    pub fn codebook(self) -> [f32; 16] {
        match self {
            Self::Nf4 => NF4,
            // Code 0 (-8/7) is never produced: symmetric quantisation uses -7..=7 around code 8.
            Self::Int4 => std::array::from_fn(|code| (code as f32 - 8.0) / 7.0),
        }
    }

    /// The code of the entry nearest to `v` (normalised to `[-1, 1]`); ties go to the lower code.
    pub fn encode(self, v: f32) -> u8 {
        match self {
            Self::Int4 => ((v * 7.0).round().clamp(-7.0, 7.0) + 8.0) as u8,
            Self::Nf4 => {
                // Midpoints between neighbours partition [-1, 1]; count those below `v`.
                let book = NF4;
                (0..15)
                    .filter(|&i| v > 0.5 * (book[i] + book[i + 1]))
                    .count() as u8
            }
        }
    }

    /// Half the gap to the farther neighbour of `code`: the largest normalised error of a value
    /// that encodes to it, the bound the round-trip tests hold quantisation to.
    pub fn half_step(self, code: u8) -> f32 {
        let book = self.codebook();
        let c = code as usize;
        let below = if c > 0 { book[c] - book[c - 1] } else { 0.0 };
        let above = if c < 15 { book[c + 1] - book[c] } else { 0.0 };
        0.5 * below.max(above)
    }
}

/// The precision the per-block scales are stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ScaleDtype {
    /// 4 bytes per block of 64: 0.5625 bytes per parameter in all.
    #[default]
    F32,
    /// 2 bytes per block of 64: 0.53125 bytes per parameter; the scale itself is rounded to
    /// 11 significant bits.
    F16,
}

/// A weight quantised on the host: the packed codes and the scales, before they go to a device.
#[derive(Clone, Debug, PartialEq)]
pub struct HostQuantized {
    /// The code book.
    pub format: QuantFormat,
    /// Rows of the original weight (the reduction dimension).
    pub k: usize,
    /// Columns of the original weight (the output dimension).
    pub n: usize,
    /// `[n, words_per_column(k)]`: column-major codes, code `j` of a word in bits `4j..4j+4`.
    pub packed: Vec<u32>,
    /// `[n, blocks(k)]`: the absmax of each block.
    pub scales: Vec<f32>,
}

/// Packed words per column for `k` rows.
pub fn words_per_column(k: usize) -> usize {
    k.div_ceil(CODES_PER_WORD)
}

/// Scale blocks per column for `k` rows.
pub fn blocks(k: usize) -> usize {
    k.div_ceil(BLOCK)
}

impl HostQuantized {
    /// Quantises a row-major `[k, n]` weight. Scales stored as f16 are rounded before the codes
    /// are chosen, so each code is the nearest for the scale that will decode it.
    pub fn quantize(
        weight: &[f32],
        k: usize,
        n: usize,
        format: QuantFormat,
        scale: ScaleDtype,
    ) -> Self {
        assert_eq!(
            weight.len(),
            k * n,
            "a [{k}, {n}] weight has {} values",
            k * n
        );
        Self::quantize_with(k, n, format, scale, |r, col| weight[r * n + col])
    }

    /// Quantises the `[k, n]` weight whose transpose is the row-major `[n, k]` slice
    /// `weight_t`: PyTorch's `nn.Linear` layout (`[out, in]`), as checkpoints store it, read
    /// without a transposed copy.
    pub fn quantize_transposed(
        weight_t: &[f32],
        k: usize,
        n: usize,
        format: QuantFormat,
        scale: ScaleDtype,
    ) -> Self {
        assert_eq!(
            weight_t.len(),
            k * n,
            "an [{n}, {k}] weight has {} values",
            k * n
        );
        Self::quantize_with(k, n, format, scale, |r, col| weight_t[col * k + r])
    }

    /// Quantises the `[k, n]` weight whose element `(row, col)` is `at(row, col)`.
    fn quantize_with(
        k: usize,
        n: usize,
        format: QuantFormat,
        scale: ScaleDtype,
        at: impl Fn(usize, usize) -> f32,
    ) -> Self {
        let words = words_per_column(k);
        let nblocks = blocks(k);
        // Padding codes (rows past `k`) decode to exactly zero.
        let zero = format.encode(0.0) as u32;
        let pad_word = (0..CODES_PER_WORD).fold(0u32, |w, j| w | (zero << (4 * j)));
        let mut packed = vec![pad_word; n * words];
        let mut scales = vec![0.0f32; n * nblocks];
        for col in 0..n {
            for block in 0..nblocks {
                let rows = block * BLOCK..((block + 1) * BLOCK).min(k);
                let absmax = rows
                    .clone()
                    .map(|r| at(r, col).abs())
                    .fold(0.0f32, f32::max);
                let absmax = match scale {
                    ScaleDtype::F32 => absmax,
                    ScaleDtype::F16 => burn::tensor::f16::from_f32(absmax).to_f32(),
                };
                scales[col * nblocks + block] = absmax;
                let inv = if absmax > 0.0 { 1.0 / absmax } else { 0.0 };
                for r in rows {
                    let code = format.encode(at(r, col) * inv) as u32;
                    let word = &mut packed[col * words + r / CODES_PER_WORD];
                    let shift = 4 * (r % CODES_PER_WORD);
                    *word = (*word & !(0xF << shift)) | (code << shift);
                }
            }
        }
        Self {
            format,
            k,
            n,
            packed,
            scales,
        }
    }

    /// The code of element `(row, col)`.
    pub fn code(&self, row: usize, col: usize) -> u8 {
        let word = self.packed[col * words_per_column(self.k) + row / CODES_PER_WORD];
        ((word >> (4 * (row % CODES_PER_WORD))) & 0xF) as u8
    }

    /// The scale that decodes element `(row, col)`.
    pub fn scale(&self, row: usize, col: usize) -> f32 {
        self.scales[col * blocks(self.k) + row / BLOCK]
    }

    /// The row-major `[k, n]` weight these codes decode to.
    pub fn dequantize(&self) -> Vec<f32> {
        let book = self.format.codebook();
        let mut out = vec![0.0; self.k * self.n];
        for row in 0..self.k {
            for col in 0..self.n {
                out[row * self.n + col] = book[self.code(row, col) as usize] * self.scale(row, col);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    fn normal_weight(k: usize, n: usize, seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        // Box-Muller: weights are roughly normal, the case NF4 is built for; a few outliers
        // stretch some blocks' absmax the way real checkpoints do.
        (0..k * n)
            .map(|i| {
                let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-7), rng.random());
                let z = (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos();
                if i % 97 == 0 { 6.0 * z } else { 0.02 * z }
            })
            .collect()
    }

    /// Every element decodes to within the half-step of its code, scaled by its block's
    /// absmax. With f16 scales the scale itself carries a relative error of up to 2^-11, which
    /// moves a decoded value by at most that fraction of its magnitude (≤ absmax).
    fn check_round_trip(format: QuantFormat, scale: ScaleDtype) {
        let (k, n) = (200, 7); // k is not a multiple of the block or of the word
        let w = normal_weight(k, n, 3);
        let q = HostQuantized::quantize(&w, k, n, format, scale);
        let deq = q.dequantize();
        let mut worst = 0.0f32;
        for row in 0..k {
            for col in 0..n {
                let exact_absmax = (row / BLOCK * BLOCK..((row / BLOCK + 1) * BLOCK).min(k))
                    .map(|r| w[r * n + col].abs())
                    .fold(0.0f32, f32::max);
                let code = q.code(row, col);
                let scale_error = match scale {
                    ScaleDtype::F32 => 0.0,
                    ScaleDtype::F16 => exact_absmax * 2f32.powi(-11),
                };
                let bound = format.half_step(code) * q.scale(row, col) + scale_error;
                let err = (deq[row * n + col] - w[row * n + col]).abs();
                // 1e-6 relative slack for the f32 products themselves.
                assert!(
                    err <= bound * (1.0 + 1e-6) + 1e-12,
                    "{format:?}/{scale:?} ({row},{col}): {} vs {}: error {err} > {bound}",
                    deq[row * n + col],
                    w[row * n + col]
                );
                worst = worst.max(err / bound.max(1e-30));
            }
        }
        // The bound is tight: some element uses most of its half-step.
        assert!(
            worst > 0.5,
            "{format:?}: worst error only {worst} of the bound"
        );
    }

    #[test]
    fn nf4_round_trip_is_within_half_a_step() {
        check_round_trip(QuantFormat::Nf4, ScaleDtype::F32);
        check_round_trip(QuantFormat::Nf4, ScaleDtype::F16);
    }

    #[test]
    fn int4_round_trip_is_within_half_a_step() {
        check_round_trip(QuantFormat::Int4, ScaleDtype::F32);
        check_round_trip(QuantFormat::Int4, ScaleDtype::F16);
    }

    #[test]
    fn encode_picks_the_nearest_entry() {
        for format in [QuantFormat::Nf4, QuantFormat::Int4] {
            let book = format.codebook();
            for i in 0..=2000 {
                let v = -1.0 + i as f32 / 1000.0;
                let code = format.encode(v) as usize;
                let best = book
                    .iter()
                    .map(|b| (b - v).abs())
                    .fold(f32::INFINITY, f32::min);
                assert!(
                    (book[code] - v).abs() <= best + 1e-7,
                    "{format:?} {v}: code {code}"
                );
            }
            // Exact entries and zero are reproduced exactly.
            assert_eq!(book[format.encode(0.0) as usize], 0.0);
            assert_eq!(book[format.encode(1.0) as usize], 1.0);
            assert_eq!(book[format.encode(-1.0) as usize], -1.0);
        }
    }

    #[test]
    fn a_zero_block_decodes_to_zero() {
        let q = HostQuantized::quantize(&[0.0; 70], 70, 1, QuantFormat::Int4, ScaleDtype::F32);
        assert!(q.dequantize().iter().all(|&v| v == 0.0));
    }
}
