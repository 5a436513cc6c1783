//! [`GuardConfigError`]: a guard's setting that cannot work, from the performance configuration
//! or the loss scale's.

/// A [`PerformanceConfig`](super::PerformanceConfig) that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GuardConfigError {
    /// A loss-scale setting that cannot work.
    #[error("loss scale: {what}, got {value}")]
    LossScale {
        /// What the setting must be.
        what: &'static str,
        /// The value given.
        value: f64,
    },
    /// A clipping threshold that is not a positive number.
    #[error("clip_norm must be a positive finite number, got {0}; leave it out to not clip")]
    ClipNorm(f64),
}
