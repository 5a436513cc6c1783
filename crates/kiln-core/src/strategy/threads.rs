//! Bounding each rank's intra-op parallelism.
//!
//! CPU backends parallelise ops on rayon's *current* pool. Ranks that are threads of one
//! process would otherwise all queue onto the one global pool; each rank runs inside a pool
//! of its own, sized so that ranks together use the machine's cores once.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rayon::{ThreadPool, ThreadPoolBuilder};

use super::ConfigError;

/// How long a dropped pool waits for its threads to exit. They exit as soon as their last op
/// returns, which the rank's own work has waited for: this bounds only a thread stuck in an
/// op that never returns, left running rather than waited on forever.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// A rank's thread pool whose threads have exited once it is dropped.
///
/// Rayon lets a dropped pool's threads exit in their own time, and a thread that exits frees
/// its thread-locals then: gemm keeps a packing buffer the size of a core's L2 cache in every
/// thread that multiplies. Those bytes count as the rank's memory, so a rank of the same
/// number started just after (the next candidate of a calibration, the next strategy of a
/// process) began its peak with them: the planner's counted calibrations of the MLP read
/// 512 KiB, two thirds of its step, too high in 3 of 82 timings. Waiting for the threads
/// makes a rank's peak its own.
pub(crate) struct RankPool {
    /// `None` once dropped.
    pool: Option<ThreadPool>,
    /// The pool's threads: rayon starts them all as the pool is built.
    threads: Vec<JoinHandle<()>>,
    rank: usize,
}

impl RankPool {
    /// Runs `op` inside the pool: its parallel ops on the pool's threads.
    pub(crate) fn install<R: Send>(&self, op: impl FnOnce() -> R + Send) -> R {
        self.pool
            .as_ref()
            .expect("a pool is live until dropped")
            .install(op)
    }
}

impl Drop for RankPool {
    fn drop(&mut self) {
        drop(self.pool.take());
        let threads = std::mem::take(&mut self.threads);
        let deadline = Instant::now() + EXIT_GRACE;
        let me = std::thread::current().id();
        for thread in threads {
            // A pool dropped by one of its own threads cannot wait for that one.
            if thread.thread().id() == me {
                continue;
            }
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(50));
            }
            match thread.is_finished() {
                // A thread that panicked has already reported through the rank's work.
                true => drop(thread.join()),
                false => tracing::warn!(
                    rank = self.rank,
                    "a thread of rank {}'s pool is still busy {EXIT_GRACE:?} after its pool \
                     closed; left to finish on its own",
                    self.rank
                ),
            }
        }
    }
}

/// A pool for `rank` with `threads` threads, or the machine's cores shared evenly among
/// `ranks` (every rank on the machine, in this process and the run's others) when `threads`
/// is `None`.
pub(crate) fn rank_pool(
    rank: usize,
    ranks: usize,
    threads: Option<usize>,
) -> Result<RankPool, ConfigError> {
    let threads = match threads {
        Some(n) => {
            crate::plan::check_threads(n)?;
            n
        }
        None => {
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            (cores / ranks.max(1)).max(1)
        }
    };
    let mut spawned = Vec::new();
    let pool = ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("kiln-rank{rank}-{i}"))
        // What the rank computes is counted as its memory.
        .start_handler(move |_| crate::memory::count_thread_as(rank))
        .spawn_handler(|thread| {
            let mut builder = std::thread::Builder::new();
            if let Some(name) = thread.name() {
                builder = builder.name(name.to_owned());
            }
            if let Some(size) = thread.stack_size() {
                builder = builder.stack_size(size);
            }
            spawned.push(builder.spawn(|| thread.run())?);
            Ok(())
        })
        .build()
        .map_err(|e| ConfigError::ThreadPool {
            rank,
            reason: e.to_string(),
        })?;
    Ok(RankPool {
        pool: Some(pool),
        threads: spawned,
        rank,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts, when a thread exits, that its thread-local went.
    struct Local(&'static AtomicUsize);

    impl Drop for Local {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    static GONE: AtomicUsize = AtomicUsize::new(0);

    thread_local! {
        static LOCAL: Local = const { Local(&GONE) };
    }

    #[test]
    fn a_pool_has_1_to_1024_threads() {
        for threads in [0, 1025, usize::MAX] {
            let e = rank_pool(0, 1, Some(threads)).err().unwrap();
            assert!(
                e.to_string().contains(&format!(
                    "threads_per_rank is {threads}; it must be 1 to 1024"
                )),
                "{e}"
            );
        }
        assert!(rank_pool(0, 1, Some(3)).is_ok());
    }

    #[test]
    fn a_dropped_pool_s_threads_have_freed_their_thread_locals() {
        let threads = 4;
        for _ in 0..20 {
            let before = GONE.load(Ordering::SeqCst);
            let pool = rank_pool(0, 1, Some(threads)).unwrap();
            // Every thread of the pool touches its thread-local, as gemm its buffer.
            pool.install(|| {
                rayon::broadcast(|_| LOCAL.with(|_| ()));
            });
            drop(pool);
            assert_eq!(GONE.load(Ordering::SeqCst) - before, threads);
        }
    }
}
