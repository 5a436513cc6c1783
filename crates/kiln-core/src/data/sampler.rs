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
        })
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
}
