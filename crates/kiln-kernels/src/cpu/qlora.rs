//! QLoRA's 4-bit weight decoded on the CPU in one pass: each block's 16 code values are scaled
//! once into a table, and every code of the block is a lookup into it, written straight into
//! the f32 weight. The reference decodes through Burn's tensor ops (eight shifts and masks, a
//! stack, a gather from the code book, the scales repeated to the weight's size, a multiply),
//! each a full-size temporary: on the CPU that decode cost more than the matmul it fed.

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, f16};
use rayon::prelude::*;

use crate::quant::format::CODES_PER_WORD;
use crate::quant::{BLOCK, QuantizedPrimitive};

/// `deq(W)ᵀ`, `[n, k]` in f32: the weight in its stored order (a row per output column), or
/// `None` for a layout this loop does not read (the reference decodes those).
pub(super) fn dequantize_nk(w: &QuantizedPrimitive<burn::backend::Flex>) -> Option<FlexTensor> {
    let packed = w.packed.to_contiguous();
    let packed = packed.as_slice::<i32>()?;
    let codebook = w.codebook.to_contiguous();
    let codebook: [f32; 16] = codebook.as_slice::<f32>()?.try_into().ok()?;
    let scales = w.scales.to_contiguous();
    let scales: Vec<f32> = match scales.dtype() {
        DType::F32 => scales.as_slice::<f32>()?.to_vec(),
        DType::F16 => scales
            .as_slice::<f16>()?
            .iter()
            .map(|s| s.to_f32())
            .collect(),
        _ => return None,
    };
    let (k, n) = (w.k, w.n);
    let words = k.div_ceil(CODES_PER_WORD);
    let blocks = k.div_ceil(BLOCK);
    if packed.len() != n * words || scales.len() != n * blocks {
        return None;
    }
    let mut out = vec![0.0f32; n * k];
    out.par_chunks_mut(k).enumerate().for_each(|(row, out)| {
        let packed = &packed[row * words..(row + 1) * words];
        let scales = &scales[row * blocks..(row + 1) * blocks];
        for (block, &scale) in scales.iter().enumerate() {
            let table = codebook.map(|c| c * scale);
            let start = block * BLOCK;
            let end = (start + BLOCK).min(k);
            // A block is BLOCK / CODES_PER_WORD whole words (the last may be cut by k).
            for (w, &word) in packed[start / CODES_PER_WORD..end.div_ceil(CODES_PER_WORD)]
                .iter()
                .enumerate()
            {
                let base = start + w * CODES_PER_WORD;
                let word = word as u32;
                for j in 0..CODES_PER_WORD.min(end - base) {
                    out[base + j] = table[((word >> (4 * j)) & 0xF) as usize];
                }
            }
        }
    });
    Some(super::tensor(out, [n, k]))
}
