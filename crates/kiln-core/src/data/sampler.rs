//! Which samples make each global batch: a seeded permutation per epoch.

use rand::{SeedableRng, rngs::StdRng, seq::SliceRandom};

use super::DataError;

/// What to do with the samples left over after the last full global batch of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Remainder {
    /// Skip them: every global batch is full.
    #[default]
    Drop,
    /// Train on them as a smaller last global batch.
    Keep,
}

/// Global batches of sample indices, the same on every rank and in every process for the
/// same seed: epoch `e` is a permutation of `0..len` drawn from `seed` and `e`, cut into
/// global batches.
///
/// # Example
/// ```
/// use kiln_core::data::{EpochSampler, Remainder};
/// let sampler = EpochSampler::new(10, 4, 7).unwrap().with_remainder(Remainder::Keep);
/// let batches = sampler.epoch(0);
/// assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), vec![4, 4, 2]);
/// ```
#[derive(Debug, Clone)]
pub struct EpochSampler {
    len: usize,
    global_batch: usize,
    seed: u64,
    shuffle: bool,
    remainder: Remainder,
    /// Each sample's length, when batches are grouped by it ([`Self::grouped_by_length`]).
    lengths: Option<Vec<usize>>,
}

impl EpochSampler {
    /// Shuffled global batches of `global_batch` samples out of `len`, remainder dropped.
    ///
    /// # Errors
    /// [`DataError::EmptyBatch`] for a batch of 0, [`DataError::TooFewSamples`] when `len` is
    /// below one global batch.
    pub fn new(len: usize, global_batch: usize, seed: u64) -> Result<Self, DataError> {
        if global_batch == 0 {
            return Err(DataError::EmptyBatch);
        }
        if len < global_batch {
            return Err(DataError::TooFewSamples { len, global_batch });
        }
        Ok(Self {
            len,
            global_batch,
            seed,
            shuffle: true,
            remainder: Remainder::Drop,
            lengths: None,
        })
    }

    /// Batches of samples of similar lengths, as transformers' `group_by_length` makes them
    /// (its `LengthGroupedSampler`): each epoch's permutation is cut into mega-batches of up
    /// to 50 global batches (fewer for a small data set, so that each epoch has four or more
    /// of them), each sorted longest first, and the longest sample of all leads the epoch's
    /// first batch, so that a batch too long for memory fails at once. Batches padded to
    /// their longest then carry little padding. `lengths` holds one length per sample.
    ///
    /// # Errors
    /// [`DataError::Lengths`] when `lengths` does not hold one length per sample.
    pub fn grouped_by_length(mut self, lengths: Vec<usize>) -> Result<Self, DataError> {
        if lengths.len() != self.len {
            return Err(DataError::Lengths {
                lengths: lengths.len(),
                len: self.len,
            });
        }
        self.lengths = Some(lengths);
        Ok(self)
    }

    /// Sets the remainder policy.
    pub fn with_remainder(mut self, remainder: Remainder) -> Self {
        self.remainder = remainder;
        self
    }

    /// Keeps the data set's order instead of shuffling (for evaluation).
    pub fn without_shuffle(mut self) -> Self {
        self.shuffle = false;
        self
    }

    /// Global batches per epoch.
    pub fn steps_per_epoch(&self) -> usize {
        match self.remainder {
            Remainder::Drop => self.len / self.global_batch,
            Remainder::Keep => self.len.div_ceil(self.global_batch),
        }
    }

    /// The global batches of epoch `epoch`.
    pub fn epoch(&self, epoch: u64) -> Vec<Vec<usize>> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            // Mixing the epoch into the seed with a large odd constant keeps epochs of
            // neighbouring seeds from sharing permutations.
            let seed = self.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            order.shuffle(&mut StdRng::seed_from_u64(seed));
        }
        if let Some(lengths) = &self.lengths {
            group_by_length(&mut order, lengths, self.global_batch);
        }
        order
            .chunks(self.global_batch)
            .take(self.steps_per_epoch())
            .map(<[usize]>::to_vec)
            .collect()
    }

    /// An endless sequence of global batches, epoch after epoch.
    pub fn batches(&self) -> impl Iterator<Item = Vec<usize>> + '_ {
        (0..).flat_map(move |epoch| self.epoch(epoch))
    }
}

/// Sorts each mega-batch of `order` (up to 50 global batches, at least four mega-batches an
/// epoch where the data allows) longest first, then swaps the longest sample of all to the
/// front, as transformers' `get_length_grouped_indices` does.
fn group_by_length(order: &mut [usize], lengths: &[usize], global_batch: usize) {
    let mult = (order.len() / (global_batch * 4)).clamp(1, 50);
    for mega in order.chunks_mut(mult * global_batch) {
        // Stable, so equal lengths keep the permutation's order.
        mega.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    }
    let longest = (0..order.len())
        .step_by(mult * global_batch)
        .max_by_key(|&start| (lengths[order[start]], std::cmp::Reverse(start)));
    if let Some(longest) = longest {
        order.swap(0, longest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_is_a_permutation() {
        let sampler = EpochSampler::new(100, 10, 3).unwrap();
        let mut seen: Vec<usize> = sampler.epoch(0).concat();
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn epochs_differ_and_repeat_for_the_same_seed() {
        let sampler = EpochSampler::new(50, 5, 3).unwrap();
        assert_ne!(sampler.epoch(0), sampler.epoch(1));
        assert_eq!(
            sampler.epoch(1),
            EpochSampler::new(50, 5, 3).unwrap().epoch(1)
        );
    }

    #[test]
    fn remainder_policies() {
        let drop = EpochSampler::new(10, 4, 0).unwrap();
        assert_eq!(drop.steps_per_epoch(), 2);
        assert!(drop.epoch(0).iter().all(|b| b.len() == 4));
        let keep = drop.with_remainder(Remainder::Keep);
        assert_eq!(keep.epoch(0).last().unwrap().len(), 2);
    }

    #[test]
    fn too_small_data_set_is_an_error() {
        assert_eq!(
            EpochSampler::new(3, 4, 0).unwrap_err(),
            DataError::TooFewSamples {
                len: 3,
                global_batch: 4
            }
        );
    }

    #[test]
    fn grouped_by_length_batches_hold_similar_lengths_and_the_longest_comes_first() {
        // 400 samples of lengths 1..=400, batches of 4: 25 mega-batches of 16.
        let lengths: Vec<usize> = (0..400).map(|i| (i * 37) % 400 + 1).collect();
        let plain = EpochSampler::new(400, 4, 9).unwrap();
        let grouped = plain.clone().grouped_by_length(lengths.clone()).unwrap();
        let spread = |batches: &[Vec<usize>]| -> usize {
            let span = |b: &Vec<usize>| {
                let l: Vec<usize> = b.iter().map(|&i| lengths[i]).collect();
                l.iter().max().unwrap() - l.iter().min().unwrap()
            };
            batches.iter().map(span).sum()
        };
        for epoch in 0..3 {
            let batches = grouped.epoch(epoch);
            let mut seen = batches.concat();
            seen.sort_unstable();
            assert_eq!(seen, (0..400).collect::<Vec<_>>(), "a permutation");
            assert_eq!(lengths[batches[0][0]], 400, "the longest leads");
            // Far less padding than random batches, and the same samples as the seed's.
            assert!(spread(&batches) * 4 < spread(&plain.epoch(epoch)));
            assert_eq!(batches, grouped.epoch(epoch), "seeded");
        }
        assert_ne!(grouped.epoch(0), grouped.epoch(1));
        assert!(matches!(
            plain.grouped_by_length(vec![1; 3]),
            Err(DataError::Lengths { .. })
        ));
    }
}
