//! The allocator used directly (this test binary's global allocator is not a `Counted`): each
//! test counts against ranks of its own, since the counters are the process's.

use std::alloc::{GlobalAlloc, Layout, System};

use super::*;

static COUNTED: Counted<System> = Counted::new(System);

/// Rank `r`'s counts, whether or not this process's own allocator counts; the switch on.
fn counts(r: usize) -> Counts {
    switch_on();
    RANKS[slot(r)].counts()
}

/// As if the process had started with `KILN_COUNT_MEMORY=1`.
fn switch_on() {
    counted::SWITCHED.store(2, std::sync::atomic::Ordering::Relaxed);
}

#[test]
fn a_block_counts_against_the_rank_that_allocated_it_wherever_it_is_freed() {
    switch_on();
    count_thread_as(7);
    let before = counts(7);
    let layout = Layout::from_size_align(10_000, 64).unwrap();
    let block = unsafe { COUNTED.alloc(layout) };
    assert!(!block.is_null());
    assert!(counting(), "the switch is on");
    assert_eq!(block as usize % 64, 0, "the alignment asked for");
    unsafe { block.write_bytes(1, 10_000) };
    assert_eq!(counts(7).live, before.live + 10_000);
    // Freed by a thread that counts as another rank: still rank 7's bytes that go.
    let address = block as usize;
    std::thread::spawn(move || {
        count_thread_as(8);
        unsafe { COUNTED.dealloc(address as *mut u8, layout) };
    })
    .join()
    .unwrap();
    let after = counts(7);
    assert_eq!(after.live, before.live);
    assert!(after.peak >= before.live + 10_000);
    assert_eq!(counts(8).live, 0);
    count_thread_as_none();
}

#[test]
fn growing_and_shrinking_keeps_the_contents_and_counts_large_blocks_only() {
    switch_on();
    count_thread_as(9);
    let layout = Layout::from_size_align(10, 1).unwrap();
    let block = unsafe { COUNTED.alloc_zeroed(layout) };
    let zeros = unsafe { std::slice::from_raw_parts(block, 10) };
    assert!(zeros.iter().all(|&b| b == 0));
    assert_eq!(counts(9).live, 0, "a small block is not counted");
    unsafe { block.write_bytes(5, 10) };
    // Past the threshold (the block moves and gains its header), within it, and back.
    let grown = unsafe { COUNTED.realloc(block, layout, 5000) };
    assert_eq!(counts(9).live, 5000);
    let big = Layout::from_size_align(5000, 1).unwrap();
    let grown = unsafe { COUNTED.realloc(grown, big, 9000) };
    assert_eq!(
        counts(9),
        Counts {
            live: 9000,
            peak: 9000
        }
    );
    let kept = unsafe { std::slice::from_raw_parts(grown, 10) };
    assert!(kept.iter().all(|&b| b == 5));
    let bigger = Layout::from_size_align(9000, 1).unwrap();
    let shrunk = unsafe { COUNTED.realloc(grown, bigger, 4096) };
    assert_eq!(
        counts(9),
        Counts {
            live: 4096,
            peak: 9000
        }
    );
    restart_rank_peak(9);
    assert_eq!(counts(9).peak, 4096);
    let page = Layout::from_size_align(4096, 1).unwrap();
    let small = unsafe { COUNTED.realloc(shrunk, page, 3) };
    assert_eq!(counts(9).live, 0);
    let kept = unsafe { std::slice::from_raw_parts(small, 3) };
    assert!(kept.iter().all(|&b| b == 5));
    unsafe { COUNTED.dealloc(small, Layout::from_size_align(3, 1).unwrap()) };
    assert_eq!(counts(9).live, 0);
    count_thread_as_none();
}
