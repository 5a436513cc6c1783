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

/// CUDA device `index`'s free memory in bytes, as its driver reports it now
/// (`cuMemGetInfo`, in the device's primary context); `None` without a driver or such a device.
pub fn free_bytes(index: usize) -> Option<u64> {
    if !driver_present() {
        return None;
    }
    result::init().ok()?;
    let device = result::device::get(i32::try_from(index).ok()?).ok()?;
    // SAFETY: `device` is a handle the driver just returned; the primary context it retains
    // is the one CubeCL's runtime uses, released again below.
    unsafe {
        let context = result::primary_ctx::retain(device).ok()?;
        let free = result::ctx::set_current(context)
            .ok()
            .and_then(|()| result::mem_get_info().ok())
            .map(|(free, _total)| free as u64);
        let _ = result::primary_ctx::release(device);
        free
    }
}
