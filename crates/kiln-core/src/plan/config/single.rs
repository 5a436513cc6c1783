//! The settings of `single`.

/// Configuration of [`Single`](crate::strategy::Single).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SingleConfig {
    /// Micro-batches per global batch (1 means no accumulation).
    pub grad_accumulation: usize,
    /// Intra-op threads of its one rank; `None` uses every core.
    pub threads_per_rank: Option<usize>,
}

impl Default for SingleConfig {
    fn default() -> Self {
        Self {
            grad_accumulation: 1,
            threads_per_rank: None,
        }
    }
}
