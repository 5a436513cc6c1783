//! Adapter hyper-parameters.

use burn::config::Config;

/// Rank, scale and dropout of a low-rank adapter.
#[derive(Config, Debug, PartialEq)]
pub struct LoraConfig {
    /// The rank `r` of `A·B`.
    #[config(default = 8)]
    pub rank: usize,
    /// `α`: the adapter's output is scaled by `α / r`, so changing `r` does not change the
    /// initial learning dynamics (the LoRA paper's convention).
    #[config(default = 16.0)]
    pub alpha: f32,
    /// Dropout on the adapter's input only (the base path sees `x` unchanged).
    #[config(default = 0.0)]
    pub dropout: f64,
}

impl LoraConfig {
    /// `α / r`.
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank as f32
    }
}
