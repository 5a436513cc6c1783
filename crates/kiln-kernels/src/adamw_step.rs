//! The scalars of one AdamW step.

use serde::{Deserialize, Serialize};

/// Hyper-parameters and step count of one AdamW update, Burn's `AdamW` formula:
/// `p ← p·(1 − lr·wd) − lr · m̂ / (√v̂ + ε)` with bias-corrected moments `m̂`, `v̂`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWStep {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta_1: f32,
    /// Second-moment decay.
    pub beta_2: f32,
    /// Added to `√v̂`.
    pub epsilon: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// The step being taken, from 1.
    pub time: u32,
}

impl AdamWStep {
    /// `1 / (1 − β₁ᵗ)`.
    pub fn bias_correction_1(&self) -> f32 {
        1.0 / (1.0 - self.beta_1.powi(self.time as i32))
    }

    /// `1 / (1 − β₂ᵗ)`.
    pub fn bias_correction_2(&self) -> f32 {
        1.0 / (1.0 - self.beta_2.powi(self.time as i32))
    }
}
