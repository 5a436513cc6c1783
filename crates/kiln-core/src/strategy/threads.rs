//! Bounding each rank's intra-op parallelism.
//!
//! CPU backends parallelise ops on rayon's *current* pool. Ranks that are threads of one
//! process would otherwise all queue onto the one global pool; each rank runs inside a pool
//! of its own, sized so that ranks together use the machine's cores once.

use rayon::{ThreadPool, ThreadPoolBuilder};

use super::ConfigError;

/// A pool for `rank` with `threads` threads, or the machine's cores shared evenly among
/// `ranks` (every rank on the machine, in this process and the run's others) when `threads`
/// is `None`.
pub(crate) fn rank_pool(
    rank: usize,
    ranks: usize,
    threads: Option<usize>,
) -> Result<ThreadPool, ConfigError> {
    let threads = match threads {
        Some(0) => return Err(ConfigError::ZeroThreads),
        Some(n) => n,
        None => {
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            (cores / ranks.max(1)).max(1)
        }
    };
    ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("kiln-rank{rank}-{i}"))
        // What the rank computes is counted as its memory.
        .start_handler(move |_| crate::memory::count_thread_as(rank))
        .build()
        .map_err(|e| ConfigError::ThreadPool {
            rank,
            reason: e.to_string(),
        })
}
