//! The process's allocator: mimalloc, counted, and told to keep freed pages a while.
//!
//! Every tensor op of a CPU backend allocates its output. The AD model's are 0.1–2 MB: glibc
//! serves those from fresh `mmap`s or trims them back to the kernel when freed, so each step
//! paid page faults and zeroing for its whole working set again (a fifth of the AD step in
//! `perf`). mimalloc keeps the pages. Counted: each rank's peak memory in the reports comes
//! from here.

/// The allocator of every `kiln` process.
#[global_allocator]
static ALLOCATOR: kiln_core::memory::Counted<mimalloc::MiMalloc> =
    kiln_core::memory::Counted::new(mimalloc::MiMalloc);

/// mimalloc's `mi_option_purge_delay` (v3's option enum; `libmimalloc-sys` names no constant
/// for it): milliseconds before freed pages go back to the system.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed pages stay with the process, in milliseconds. mimalloc's default, 10 ms,
/// returns an LLM step's large buffers (the head's logits and their gradient, 65 MB each at
/// 512 tokens) between one use and the next, and every step then faults and zeroes them
/// again. The delay has to outlast a step, since a buffer freed late in one step is wanted
/// again early in the next: a second did for 512 tokens at AVX2 speed (the 100 M model's
/// LoRA step 8–15 % faster at 512 tokens, 17 % at 2048), but not once steps took about a
/// second or longer (30 s against 1 s: the step at 4 × 64 tokens on one thread 7–9 % faster,
/// 930–954 against 1020–1029 ms). The peak is unchanged; the process only returns memory later.
const PURGE_DELAY_MS: std::ffi::c_long = 30_000;

/// Applies the purge delay, unless the user set `MIMALLOC_PURGE_DELAY` (a default, which the
/// environment overrides).
pub fn keep_freed_pages() {
    // SAFETY: setting an option's default is one of mimalloc's documented runtime calls; it
    // takes any value and touches no allocation.
    unsafe { libmimalloc_sys::mi_option_set_default(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    // SAFETY: as above, a read.
    let delay = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
    tracing::debug!("mimalloc keeps freed pages {delay} ms");
}
