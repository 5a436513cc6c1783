//! Memory accounting: how many bytes each rank holds, and held at its most.
//!
//! A process whose global allocator is [`Counted`] (the `kiln` binary's is), started with
//! `KILN_COUNT_MEMORY=1` ([`SWITCH`]), counts every allocation against the rank whose thread
//! made it: the strategies tag their ranks' threads
//! (the rank's own and its intra-op pool's) with [`count_thread_as`]. A block freed on another
//! thread is still given back to the rank that allocated it, so a rank's count is exact: its
//! parameters, gradients, optimizer state, activations and buffers, whatever thread frees them.
//! Without a `Counted` allocator, or the switch, nothing is counted and every query answers
//! `None`.
//!
//! Devices with memory of their own (CUDA, wgpu) keep a rank's tensors out of the process's
//! memory: there, with the same switch, [`device`] watches the bytes CubeCL holds for the
//! rank. [`rank_peak`] answers for either.

mod counted;
pub mod device;
mod slots;

pub use counted::{COUNTED_FROM, Counted, SWITCH, counting};
use counted::{RANKS, THREAD_SLOT};
pub use slots::Counts;
use slots::slot;

/// Counts the calling thread's allocations, from now on, as rank `rank`'s.
pub fn count_thread_as(rank: usize) {
    THREAD_SLOT.with(|s| s.set(slot(rank)));
}

/// Counts the calling thread's allocations as no rank's again.
pub fn count_thread_as_none() {
    THREAD_SLOT.with(|s| s.set(0));
}

/// Rank `rank`'s bytes (in this process), when the process counts.
pub fn rank(rank: usize) -> Option<Counts> {
    counting().then(|| RANKS[slot(rank)].counts())
}

/// Starts rank `rank`'s peak again from what it holds now (say, when the rank starts), on
/// the host and on its device.
pub fn restart_rank_peak(rank: usize) {
    RANKS[slot(rank)].restart_peak();
    device::restart_rank_peak(rank);
}

/// Rank `rank`'s most bytes held at once, where its tensors live: on `device` when it has
/// memory of its own ([`device::rank_peak`]; call it on the thread that runs the rank's
/// operations), else in the process ([`rank`]). `None` when the process does not count.
pub fn rank_peak<D: std::any::Any>(rank_number: usize, device: &D) -> Option<u64> {
    device::rank_peak(rank_number, device).or_else(|| rank(rank_number).map(|c| c.peak))
}

/// The process's high-water mark of resident memory (Linux's `VmHWM`), in bytes: what the
/// operating system saw, an independent bound on the ranks' counted peaks together. `None`
/// where `/proc` does not say.
pub fn peak_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests;
