//! The settings of `data_parallel`.

/// Configuration of [`DataParallel`](crate::strategy::DataParallel).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataParallelConfig {
    /// Micro-batches per device and global batch (1 means no accumulation).
    pub grad_accumulation: usize,
    /// Intra-op threads per device; `None` shares the cores evenly.
    pub threads_per_rank: Option<usize>,
}

impl Default for DataParallelConfig {
    fn default() -> Self {
        Self {
            grad_accumulation: 1,
            threads_per_rank: None,
        }
    }
}
