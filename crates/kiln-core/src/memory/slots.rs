//! The slots counts are kept in: one per rank a process may drive, and one for threads no rank
//! owns. The counting allocator and the device watches both index them.

/// Slots for ranks, plus one for untagged threads: as many as one process may drive.
pub(super) const SLOTS: usize = crate::world::MAX_LOCAL_RANKS + 1;

/// Bytes allocated and not yet freed: now, and at their most since the peak last restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Bytes held now.
    pub live: u64,
    /// Most bytes held at once.
    pub peak: u64,
}

/// The slot of rank `rank` (slot 0 is the untagged threads').
pub(super) fn slot(rank: usize) -> usize {
    1 + rank % (SLOTS - 1)
}
