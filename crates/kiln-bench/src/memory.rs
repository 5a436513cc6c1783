//! The process's host memory, as the system counts it: the peak resident set, and a sampler of
//! the peak of anonymous memory alone.
//!
//! The resident set also counts the pages of files the process maps and has read. A loader
//! that memory-maps a checkpoint therefore shows the file's pages it touched in its resident
//! set, though the kernel drops them whenever memory is short; what the process itself holds
//! is its anonymous memory (`RssAnon`). The system keeps the peak of the first (`VmHWM`) but
//! not of the second, which [`AnonPeak`] samples.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// The peak resident set of this process in bytes (`VmHWM` of `/proc/self/status`): every
/// thread of the process together, and file pages it has mapped. `None` where the system does
/// not say (not Linux).
pub fn peak_host_bytes() -> Option<u64> {
    status_kib("VmHWM:").map(|kib| kib * 1024)
}

/// The resident set of this process now, in bytes (`VmRSS`).
pub fn host_bytes() -> Option<u64> {
    status_kib("VmRSS:").map(|kib| kib * 1024)
}

/// The anonymous memory this process holds now, in bytes (`RssAnon`): its heap and stacks,
/// without mapped files.
pub fn anon_bytes() -> Option<u64> {
    status_kib("RssAnon:").map(|kib| kib * 1024)
}

fn status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The largest [`anon_bytes`] seen by a thread sampling it every `every` until stopped: a
/// lower bound of the true peak, close to it when `every` is short against the time an
/// allocation is held.
pub struct AnonPeak {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    sampler: Option<JoinHandle<()>>,
}

impl AnonPeak {
    /// Starts sampling.
    pub fn start(every: Duration) -> Self {
        let peak = Arc::new(AtomicU64::new(anon_bytes().unwrap_or(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (peak, stop) = (peak.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(now) = anon_bytes() {
                        peak.fetch_max(now, Ordering::Relaxed);
                    }
                    std::thread::sleep(every);
                }
            })
        };
        Self {
            peak,
            stop,
            sampler: Some(sampler),
        }
    }

    /// Stops sampling; the peak in bytes (0 where the system does not say).
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(sampler) = self.sampler.take() {
            sampler.join().ok();
        }
        if let Some(now) = anon_bytes() {
            self.peak.fetch_max(now, Ordering::Relaxed);
        }
        self.peak.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampler_sees_an_allocation_held_for_a_while() {
        let sampler = AnonPeak::start(Duration::from_millis(1));
        let before = anon_bytes().unwrap();
        // 256 MiB, written so that its pages are resident, held for 50 ms, then freed.
        let held = vec![1u8; 256 << 20];
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(held[12345], 1);
        drop(held);
        let peak = sampler.finish();
        assert!(
            peak >= before + (200 << 20),
            "peak {peak} vs {before} before a 256 MiB allocation"
        );
        assert!(peak_host_bytes().unwrap() >= peak);
    }
}
