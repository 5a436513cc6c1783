//! Statistics of repeated timings, and the warm-up before them: what the planner's step
//! timings, the collectives' link probes and the benchmarks read the same way.

/// Runs a timing makes before it starts the clock: fresh threads start with cold allocator
/// arenas and caches.
pub const WARMUP: usize = 2;

/// `values` in increasing order.
fn sorted(values: &[f64]) -> Vec<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
}

/// The median of sorted `values` (0 for none).
fn median_of_sorted(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The median of `values` (0 for none).
pub fn median(values: &[f64]) -> f64 {
    median_of_sorted(&sorted(values))
}

/// The interquartile range of `values` over their median (0 for fewer than four).
pub fn spread(values: &[f64]) -> f64 {
    let sorted = sorted(values);
    let n = sorted.len();
    if n < 4 {
        return 0.0;
    }
    (sorted[3 * n / 4] - sorted[n / 4]) / median_of_sorted(&sorted).max(f64::MIN_POSITIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread_read_sorted_values() {
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        // Quartiles 2 and 4 around a median of 2.5.
        assert!((spread(&[4.0, 1.0, 3.0, 2.0]) - 0.8).abs() < 1e-12);
        assert_eq!(spread(&[1.0, 2.0, 3.0]), 0.0);
    }
}
