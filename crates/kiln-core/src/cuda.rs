//! The CUDA driver, asked directly (through `cudarc`, CubeCL's own binding): whether it is
//! installed, and a device's memory. CubeCL asks for neither without panicking.

use cudarc::driver::{result, sys};

/// Whether the CUDA driver library (`libcuda.so`) loads: without it, every CUDA call panics.
pub fn driver_present() -> bool {
    // SAFETY: loading the library has no precondition; it is only looked up.
    unsafe { sys::is_culib_present() }
}

/// CUDA device `index`'s total memory in bytes; `None` without a driver or such a device.
pub fn total_bytes(index: usize) -> Option<u64> {
    if !driver_present() {
        return None;
    }
    result::init().ok()?;
    let device = result::device::get(i32::try_from(index).ok()?).ok()?;
    // SAFETY: `device` is a handle the driver just returned.
    let bytes = unsafe { result::device::total_mem(device) }.ok()?;
    Some(bytes as u64)
}
