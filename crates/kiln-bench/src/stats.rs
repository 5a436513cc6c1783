//! The few statistics a benchmark on a noisy machine needs (the median is kiln-core's, as the
//! planner's timings read it).

use serde::{Deserialize, Serialize};

/// Median, minimum and maximum of repeated measurements.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The middle value (the mean of the two middle values for an even count).
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl Summary {
    /// Summarises `values`; `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Self {
            min: *sorted.first()?,
            max: *sorted.last()?,
            median: kiln_core::stats::median(&sorted),
        })
    }
}

/// The order of `n` variants in round `round`: every round starts one later, so each variant
/// runs early, late and next to every other one, and slow drifts of the machine hit all alike.
pub fn rotation(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (k + round) % n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_rotation() {
        let s = Summary::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 10.0));
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(rotation(3, 1).collect::<Vec<_>>(), vec![1, 2, 0]);
        assert_eq!(rotation(3, 3).collect::<Vec<_>>(), vec![0, 1, 2]);
    }
}
