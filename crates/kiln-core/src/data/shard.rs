//! Which rank reads which samples of a global batch.

use std::ops::Range;

use super::DataError;

/// What to do when a global batch does not divide evenly over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardPolicy {
    /// Shards differ by at most one sample (the first `batch % world` ranks read one more)
    /// and gradients are averaged weighted by samples, so training is exactly that of the
    /// global batch on one device.
    #[default]
    Uneven,
    /// The last `batch % world` samples of each global batch are skipped, so shards are equal.
    Drop,
    /// The global batch is filled up to a multiple of the world size by repeating its first
    /// samples (as PyTorch's `DistributedSampler` does); repeated samples count twice.
    Pad,
}

impl ShardPolicy {
    /// Splits `global` (the sample indices of one global batch) into one contiguous shard per
    /// rank, in rank order.
    ///
    /// # Errors
    /// [`DataError::BatchSmallerThanWorld`] when some rank would get no sample.
    pub fn shard(self, global: &[usize], world_size: usize) -> Result<Vec<Vec<usize>>, DataError> {
        let n = global.len();
        if n < world_size || world_size == 0 {
            return Err(DataError::BatchSmallerThanWorld {
                global_batch: n,
                world_size,
                policy: self,
            });
        }
        let samples: Vec<usize> = match self {
            ShardPolicy::Uneven => global.to_vec(),
            ShardPolicy::Drop => global[..n - n % world_size].to_vec(),
            ShardPolicy::Pad => global
                .iter()
                .copied()
                .cycle()
                .take(n.div_ceil(world_size) * world_size)
                .collect(),
        };
        Ok(split_even(samples.len(), world_size)
            .into_iter()
            .map(|range| samples[range].to_vec())
            .collect())
    }
}

/// Splits `0..n` into `parts` contiguous ranges whose lengths differ by at most one, the
/// longer ones first. Some ranges are empty when `n < parts`.
pub fn split_even(n: usize, parts: usize) -> Vec<Range<usize>> {
    assert!(parts > 0, "cannot split into zero parts");
    let (base, extra) = (n / parts, n % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_even_puts_the_extra_first() {
        assert_eq!(split_even(7, 3), vec![0..3, 3..5, 5..7]);
        assert_eq!(split_even(2, 3), vec![0..1, 1..2, 2..2]);
    }

    #[test]
    fn uneven_keeps_every_sample_once() {
        let global: Vec<usize> = (10..17).collect();
        let shards = ShardPolicy::Uneven.shard(&global, 3).unwrap();
        assert_eq!(shards, vec![vec![10, 11, 12], vec![13, 14], vec![15, 16]]);
    }

    #[test]
    fn drop_trims_to_a_multiple() {
        let shards = ShardPolicy::Drop.shard(&[0, 1, 2, 3, 4], 2).unwrap();
        assert_eq!(shards, vec![vec![0, 1], vec![2, 3]]);
    }

    #[test]
    fn pad_repeats_from_the_start() {
        let shards = ShardPolicy::Pad.shard(&[0, 1, 2, 3, 4], 2).unwrap();
        assert_eq!(shards, vec![vec![0, 1, 2], vec![3, 4, 0]]);
    }

    #[test]
    fn batch_smaller_than_world_is_an_error() {
        let err = ShardPolicy::Uneven.shard(&[0, 1], 3).unwrap_err();
        assert!(err.to_string().contains("global batch of 2"), "{err}");
    }
}
