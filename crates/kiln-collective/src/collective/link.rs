//! What a link between ranks costs: the latency and bandwidth a probe of a collective
//! measures, and the planner's cost model reads.

/// A link between ranks: what a collective costs before any byte moves, and its bytes per
/// second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Seconds.
    pub latency: f64,
    /// Bytes per second.
    pub bandwidth: f64,
}

impl Link {
    /// The link of a probe: `latency`, and the bandwidth that moved `bytes` in the time a
    /// collective of them took (`large` seconds) beyond one of a few values (`small`). Where
    /// the two are too close for the probe's noise (a fast link), the extra time is taken as
    /// a tenth of the large call's, so that the bandwidth stays a finite number (one a plan's
    /// JSON can hold) and high.
    pub fn probed(latency: f64, small: f64, large: f64, bytes: f64) -> Self {
        let extra = (large - small).max(0.1 * large).max(f64::MIN_POSITIVE);
        Self {
            latency,
            bandwidth: (bytes / extra).min(f64::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probed_link_is_finite_however_close_its_timings() {
        let bytes = 4.0 * (1 << 20) as f64;
        let link = Link::probed(1e-5, 1e-5, 1e-3 + 1e-5, bytes);
        assert!((link.bandwidth - bytes / 1e-3).abs() < 1e-3 * link.bandwidth);
        // A large call timed no slower than the small one (noise): a tenth of its time.
        for (small, large) in [(2e-3, 1e-3), (1e-3, 1e-3), (0.0, 0.0)] {
            let link = Link::probed(small, small, large, bytes);
            assert!(
                link.bandwidth.is_finite() && link.bandwidth > 0.0,
                "{link:?}"
            );
        }
        assert!((Link::probed(0.0, 2e-3, 1e-3, bytes).bandwidth - bytes / 1e-4).abs() < 1.0);
    }
}
