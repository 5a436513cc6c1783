//! Output buffers the kernels write in full, handed out without being zeroed first.
//!
//! `vec![0.0; n]` asks the allocator for zeroed memory, which on reused pages is a `memset`
//! of the whole output before the kernel writes it again: 2 % of a LoRA step on one thread
//! (the SwiGLU, cross-entropy and AdamW outputs, tens of megabytes a step).

use std::mem::MaybeUninit;

/// A buffer of `len` values, every one written by `fill`.
///
/// # Safety
/// `fill` must write every element of the slice it is given (a panic inside it is fine:
/// the buffer is then dropped unread).
pub(crate) unsafe fn written(len: usize, fill: impl FnOnce(&mut [MaybeUninit<f32>])) -> Vec<f32> {
    let mut out = Vec::with_capacity(len);
    fill(&mut out.spare_capacity_mut()[..len]);
    // SAFETY: the caller's contract: `fill` initialised all `len` elements.
    unsafe { out.set_len(len) };
    out
}
