//! Cutting a quantised weight into the shards of tensor parallelism, and joining the shards
//! again, without re-quantising: the codes and scales of a shard are exactly the whole
//! weight's.
//!
//! A `[k, n]` weight is stored column by column, each column in blocks of [`BLOCK`] rows of
//! `k`. Columns (output features) therefore split anywhere; rows (input features, the
//! reduction dimension) split only between blocks, since each block has one scale.

use std::ops::Range;

use super::format::{BLOCK, HostQuantized, blocks, words_per_column};

/// A row split that would cut a quantisation block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "rows {start}..{end} of a {k}-row 4-bit weight cut its {BLOCK}-value quantisation blocks; \
     split at multiples of {BLOCK}"
)]
pub struct BlockSplitError {
    /// First row of the part.
    pub start: usize,
    /// End of the part.
    pub end: usize,
    /// Rows of the weight.
    pub k: usize,
}

impl HostQuantized {
    /// The columns `cols` (output features) of the weight.
    ///
    /// # Panics
    /// When `cols` is not within `0..n`.
    pub fn columns(&self, cols: Range<usize>) -> Self {
        assert!(cols.end <= self.n, "columns {cols:?} of {}", self.n);
        let (words, nblocks) = (words_per_column(self.k), blocks(self.k));
        Self {
            format: self.format,
            k: self.k,
            n: cols.len(),
            packed: self.packed[cols.start * words..cols.end * words].to_vec(),
            scales: self.scales[cols.start * nblocks..cols.end * nblocks].to_vec(),
        }
    }

    /// The rows `rows` (input features) of the weight: whole blocks, so `rows` starts at a
    /// multiple of [`BLOCK`] and ends at one or at `k`.
    ///
    /// # Errors
    /// [`BlockSplitError`] for a range that cuts a block.
    pub fn rows(&self, rows: Range<usize>) -> Result<Self, BlockSplitError> {
        let error = BlockSplitError {
            start: rows.start,
            end: rows.end,
            k: self.k,
        };
        let on_block = |r: usize| r.is_multiple_of(BLOCK);
        if rows.end > self.k || !on_block(rows.start) || !(on_block(rows.end) || rows.end == self.k)
        {
            return Err(error);
        }
        let k = rows.len();
        let (words, nblocks) = (words_per_column(self.k), blocks(self.k));
        let (part_words, part_blocks) = (words_per_column(k), blocks(k));
        let (first_word, first_block) = (
            rows.start / super::format::CODES_PER_WORD,
            rows.start / BLOCK,
        );
        let mut packed = Vec::with_capacity(self.n * part_words);
        let mut scales = Vec::with_capacity(self.n * part_blocks);
        for col in 0..self.n {
            let w = col * words + first_word;
            packed.extend_from_slice(&self.packed[w..w + part_words]);
            let b = col * nblocks + first_block;
            scales.extend_from_slice(&self.scales[b..b + part_blocks]);
        }
        Ok(Self {
            format: self.format,
            k,
            n: self.n,
            packed,
            scales,
        })
    }

    /// The weight whose columns are `parts`' side by side: the inverse of [`Self::columns`].
    ///
    /// # Panics
    /// When `parts` is empty or the parts differ in rows or format.
    pub fn concat_columns(parts: &[Self]) -> Self {
        let first = &parts[0];
        assert!(
            parts
                .iter()
                .all(|p| p.k == first.k && p.format == first.format),
            "parts of different weights"
        );
        Self {
            format: first.format,
            k: first.k,
            n: parts.iter().map(|p| p.n).sum(),
            packed: parts
                .iter()
                .flat_map(|p| p.packed.iter().copied())
                .collect(),
            scales: parts
                .iter()
                .flat_map(|p| p.scales.iter().copied())
                .collect(),
        }
    }

    /// The weight whose rows are `parts`' one after another: the inverse of [`Self::rows`].
    ///
    /// # Panics
    /// When `parts` is empty, the parts differ in columns or format, or a part but the last
    /// does not end on a block.
    pub fn concat_rows(parts: &[Self]) -> Self {
        let first = &parts[0];
        assert!(
            parts
                .iter()
                .all(|p| p.n == first.n && p.format == first.format),
            "parts of different weights"
        );
        assert!(
            parts[..parts.len() - 1]
                .iter()
                .all(|p| p.k.is_multiple_of(BLOCK)),
            "a part before the last ends inside a block"
        );
        let k = parts.iter().map(|p| p.k).sum();
        let mut packed = Vec::with_capacity(first.n * words_per_column(k));
        let mut scales = Vec::with_capacity(first.n * blocks(k));
        for col in 0..first.n {
            for p in parts {
                let (words, nblocks) = (words_per_column(p.k), blocks(p.k));
                packed.extend_from_slice(&p.packed[col * words..(col + 1) * words]);
                scales.extend_from_slice(&p.scales[col * nblocks..(col + 1) * nblocks]);
            }
        }
        Self {
            format: first.format,
            k,
            n: first.n,
            packed,
            scales,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{QuantFormat, ScaleDtype};

    fn weight(k: usize, n: usize) -> HostQuantized {
        let values: Vec<f32> = (0..k * n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        HostQuantized::quantize(&values, k, n, QuantFormat::Nf4, ScaleDtype::F32)
    }

    #[test]
    fn shards_decode_to_the_slices_of_the_whole_and_join_back() {
        let (k, n) = (200, 6);
        let whole = weight(k, n);
        let dense = whole.dequantize();
        let left = whole.columns(0..2);
        let right = whole.columns(2..6);
        for row in 0..k {
            for col in 0..n {
                let part = if col < 2 { &left } else { &right };
                let c = if col < 2 { col } else { col - 2 };
                assert_eq!(part.dequantize()[row * part.n + c], dense[row * n + col]);
            }
        }
        assert_eq!(HostQuantized::concat_columns(&[left, right]), whole);

        let top = whole.rows(0..128).unwrap();
        let bottom = whole.rows(128..200).unwrap();
        assert_eq!(top.dequantize(), dense[..128 * n]);
        assert_eq!(bottom.dequantize(), dense[128 * n..]);
        assert_eq!(HostQuantized::concat_rows(&[top, bottom]), whole);
    }

    #[test]
    fn a_row_split_inside_a_block_is_refused() {
        let whole = weight(128, 2);
        let error = whole.rows(0..96).unwrap_err();
        assert_eq!(
            error,
            BlockSplitError {
                start: 0,
                end: 96,
                k: 128
            }
        );
        assert!(error.to_string().contains("multiples of 64"), "{error}");
        assert!(whole.rows(32..128).is_err());
    }
}
