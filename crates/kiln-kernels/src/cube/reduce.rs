//! The cube-wide sum the row kernels share: a tree in shared memory with `sync_cube`, so it
//! runs where plane (warp) operations do not (lavapipe).

use cubecl::prelude::*;

/// Units per cube of the row kernels; a power of two for the tree.
pub(crate) const UNITS: usize = 256;
/// `log2(UNITS)`: the levels of the tree.
const LEVELS: usize = 8;

/// The sum of `value` over the cube's units, returned to every unit.
#[cube]
pub(crate) fn block_sum(value: f32) -> f32 {
    block_reduce(value, false)
}

/// The maximum of `value` over the cube's units, returned to every unit.
#[cube]
pub(crate) fn block_max(value: f32) -> f32 {
    block_reduce(value, true)
}

#[cube]
fn block_reduce(value: f32, #[comptime] max: bool) -> f32 {
    let mut shared = SharedMemory::<f32>::new(UNITS);
    let unit = UNIT_POS as usize;
    shared[unit] = value;
    sync_cube();
    #[unroll]
    for level in 0..LEVELS {
        let stride = UNITS >> (level + 1);
        if unit < stride {
            let (a, b) = (shared[unit], shared[unit + stride]);
            shared[unit] = if comptime!(max) {
                f32::max(a, b)
            } else {
                a + b
            };
        }
        sync_cube();
    }
    let total = shared[0];
    // Every unit has read the total before the memory is reused by a later call.
    sync_cube();
    total
}
