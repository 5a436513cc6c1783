//! The counting allocator: every allocation carries, in a small header, the slot of the
//! thread that made it, so that freeing it (on any thread) gives its bytes back to that slot.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

use super::slots::{Counts, SLOTS};

/// A global allocator that counts the bytes allocated and not yet freed by each rank (the
/// threads a strategy tags with [`count_thread_as`](super::count_thread_as)), and their peak,
/// around another allocator `A` that does the allocating.
///
/// ```no_run
/// #[global_allocator]
/// static ALLOCATOR: kiln_core::memory::Counted<mimalloc::MiMalloc> =
///     kiln_core::memory::Counted::new(mimalloc::MiMalloc);
/// # fn main() {}
/// ```
///
/// It counts only in a process started with the environment variable [`SWITCH`] set to `1`
/// (read at the first allocation, and fixed from then on: a block's layout depends on it);
/// otherwise every call goes straight to `A`, for the cost of one relaxed load. Counting
/// costs: the AD model's step took 3 to 4 % longer, even counting large blocks only.
///
/// Only blocks of at least [`COUNTED_FROM`] bytes are counted (tensors' buffers, where the
/// memory is): each grows by a header of 16 bytes (or its alignment, when larger) holding its
/// slot, and its allocation and free add one or two relaxed atomic operations on the rank's
/// own counters. Smaller blocks go straight to `A`, uncounted: counting every block cost the
/// AD model's step 5 %, which allocates thousands of small ones. (A process-wide counter,
/// shared by every thread, cost a 2-rank transformer step 3 to 5 % more in contention, so
/// there is none.)
pub struct Counted<A> {
    inner: A,
}

impl<A> Counted<A> {
    /// Counts the allocations `inner` makes.
    pub const fn new(inner: A) -> Self {
        Self { inner }
    }
}

/// A slot's bytes now and at their most. Each slot has cache lines of its own: ranks counting
/// on one shared line cost a 2-rank step 5 % (measured), in false sharing alone.
#[repr(align(128))]
pub(super) struct Slot {
    live: AtomicU64,
    peak: AtomicU64,
}

impl Slot {
    const fn new() -> Self {
        Self {
            live: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    fn claim(&self, bytes: usize) {
        let now = self.live.fetch_add(bytes as u64, Relaxed) + bytes as u64;
        // Read first: a new peak is rare, and a read costs less than a write.
        if now > self.peak.load(Relaxed) {
            self.peak.fetch_max(now, Relaxed);
        }
    }

    fn release(&self, bytes: usize) {
        self.live.fetch_sub(bytes as u64, Relaxed);
    }

    pub(super) fn counts(&self) -> Counts {
        Counts {
            live: self.live.load(Relaxed),
            peak: self.peak.load(Relaxed),
        }
    }

    /// Starts the peak again from the bytes live now.
    pub(super) fn restart_peak(&self) {
        self.peak.store(self.live.load(Relaxed), Relaxed);
    }
}

/// Slot 0 is every thread no strategy tagged; rank `r`'s is `1 + r % (SLOTS - 1)`.
pub(super) static RANKS: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];

thread_local! {
    /// The slot of this thread's allocations.
    pub(super) static THREAD_SLOT: Cell<usize> = const { Cell::new(0) };
}

/// The smallest block that is counted.
pub const COUNTED_FROM: usize = 4096;

/// The environment variable that turns counting on (`1`) for the process's whole life.
pub const SWITCH: &str = "KILN_COUNT_MEMORY";
const SWITCH_C: &std::ffi::CStr = c"KILN_COUNT_MEMORY";

/// Whether blocks of `size` bytes are counted (and carry a header): the switch is on, and
/// they are large enough. The switch is read first, so the process's first allocation (before
/// `main`, while it has one thread and nothing has changed its environment) fixes it.
fn counted(size: usize) -> bool {
    switched_on() && size >= COUNTED_FROM
}

/// Not yet read, off, on.
pub(super) static SWITCHED: AtomicU8 = AtomicU8::new(0);

/// Whether this process counts its memory: its global allocator is a [`Counted`] (the only
/// reader of the switch) and the switch is on.
pub fn counting() -> bool {
    SWITCHED.load(Relaxed) == 2
}

fn switched_on() -> bool {
    match SWITCHED.load(Relaxed) {
        1 => false,
        2 => true,
        _ => {
            // SAFETY: a NUL-terminated name; `getenv` neither allocates nor keeps the pointer.
            let value = unsafe { libc::getenv(SWITCH_C.as_ptr()) };
            // SAFETY: `getenv` returns null or a NUL-terminated string.
            let on =
                !value.is_null() && unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes() == b"1";
            // Read at the process's first allocation, on its only thread.
            SWITCHED.store(if on { 2 } else { 1 }, Relaxed);
            on
        }
    }
}

/// Bytes in front of an allocation of `layout`: room for the slot, keeping the alignment.
fn header(layout: Layout) -> usize {
    layout.align().max(16)
}

/// The layout asked of the inner allocator, and the header's size.
fn outer(layout: Layout) -> Option<(Layout, usize)> {
    let header = header(layout);
    let size = layout.size().checked_add(header)?;
    Some((Layout::from_size_align(size, layout.align()).ok()?, header))
}

/// The slot written just before an allocation's first byte.
unsafe fn slot_of(ptr: *mut u8) -> usize {
    // SAFETY: every allocation has a header of at least 16 bytes in front of `ptr`, whose
    // last 8 hold the slot (written unaligned: the block may be aligned to less than 8).
    unsafe { (ptr.sub(8) as *const u64).read_unaligned() as usize }
}

impl<A: GlobalAlloc> Counted<A> {
    /// Writes the header of a block `base` the inner allocator returned (or null) and counts
    /// its `size` bytes against the calling thread's slot.
    unsafe fn finish(&self, base: *mut u8, header: usize, size: usize) -> *mut u8 {
        if base.is_null() {
            return base;
        }
        let slot = THREAD_SLOT.try_with(Cell::get).unwrap_or(0);
        // SAFETY: the block has `header + size` bytes; the slot goes in the header's last 8.
        let ptr = unsafe { base.add(header) };
        unsafe { (ptr.sub(8) as *mut u64).write_unaligned(slot as u64) };
        RANKS[slot].claim(size);
        ptr
    }
}

// SAFETY: every block handed out lies `header` bytes into a block of the inner allocator with
// the same alignment, and is given back to it with the layout it was asked with.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counted<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !counted(layout.size()) {
            return unsafe { self.inner.alloc(layout) };
        }
        let Some((outer, header)) = outer(layout) else {
            return std::ptr::null_mut();
        };
        unsafe { self.finish(self.inner.alloc(outer), header, layout.size()) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !counted(layout.size()) {
            return unsafe { self.inner.alloc_zeroed(layout) };
        }
        let Some((outer, header)) = outer(layout) else {
            return std::ptr::null_mut();
        };
        unsafe { self.finish(self.inner.alloc_zeroed(outer), header, layout.size()) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !counted(layout.size()) {
            return unsafe { self.inner.dealloc(ptr, layout) };
        }
        // Allocated with this layout, so its outer layout exists; unwinding out of an
        // allocator is undefined, hence no panic.
        let Some((outer, header)) = outer(layout) else {
            std::process::abort()
        };
        let slot = unsafe { slot_of(ptr) };
        RANKS[slot].release(layout.size());
        unsafe { self.inner.dealloc(ptr.sub(header), outer) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match (counted(layout.size()), counted(new_size)) {
            (false, false) => return unsafe { self.inner.realloc(ptr, layout, new_size) },
            (true, true) => {}
            // Across the threshold the block gains or loses its header: move it.
            _ => {
                let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
                    return std::ptr::null_mut();
                };
                let moved = unsafe { self.alloc(new_layout) };
                if !moved.is_null() {
                    let kept = layout.size().min(new_size);
                    unsafe { std::ptr::copy_nonoverlapping(ptr, moved, kept) };
                    unsafe { self.dealloc(ptr, layout) };
                }
                return moved;
            }
        }
        let Some((outer, header)) = outer(layout) else {
            std::process::abort()
        };
        // The inner allocator's contract: the new size, rounded to the alignment, fits.
        let new_outer = match new_size.checked_add(header) {
            Some(size) => Layout::from_size_align(size, layout.align()).ok(),
            None => None,
        };
        let Some(new_outer) = new_outer.map(|l| l.size()) else {
            return std::ptr::null_mut();
        };
        let slot = unsafe { slot_of(ptr) };
        // The header moves with the block: the slot stays the allocating thread's.
        let base = unsafe { self.inner.realloc(ptr.sub(header), outer, new_outer) };
        if base.is_null() {
            return base;
        }
        RANKS[slot].release(layout.size());
        RANKS[slot].claim(new_size);
        unsafe { base.add(header) }
    }
}
