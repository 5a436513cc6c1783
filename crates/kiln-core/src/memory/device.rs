//! Memory accounting on devices with memory of their own (CUDA, wgpu): how many bytes of the
//! device each rank holds, and held at its most.
//!
//! CubeCL's memory manager counts the bytes in use on each of a device's streams (a stream is
//! a thread's: a rank's tensors are allocated on the stream of the thread that runs its
//! operations), but keeps no high-water mark. So while a rank runs, a [`Watch`] reads its
//! stream's bytes in use from a thread of its own every [`POLL`], and keeps the most it saw.
//! The bytes are counted when an operation is queued, not when the device runs it, so the
//! watch sees the program's memory as the host builds it, and its peak is a lower bound of the
//! true one: a buffer that lived for less than a poll between two readings can be missed. For
//! a training step, whose activations stay from the forward pass into the backward, that is a
//! few temporaries. Reading takes the device's lock, so a watched rank steps a little slower:
//! watches run only where the process counts its memory ([`counting`](super::counting)).

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::counted::counting;
use super::slots::{SLOTS, slot};

/// How often a [`Watch`] reads its stream's bytes.
pub const POLL: Duration = Duration::from_micros(20);

/// Reads the bytes in use on one stream of a device; `None` when the device cannot say.
pub type Reader = Box<dyn Fn() -> Option<u64> + Send + 'static>;

/// A device with memory of its own, of a kind this build has (CUDA, wgpu): the one place that
/// lists them.
enum Own {
    #[cfg(feature = "cuda")]
    Cuda(burn::backend::cuda::CudaDevice),
    #[cfg(feature = "wgpu")]
    Wgpu(burn::backend::wgpu::WgpuDevice),
}

/// `device` as a device with memory of its own; `None` for the CPU's devices.
fn own<D: Any>(device: &D) -> Option<Own> {
    let device = device as &dyn Any;
    #[cfg(feature = "cuda")]
    if let Some(device) = device.downcast_ref::<burn::backend::cuda::CudaDevice>() {
        return Some(Own::Cuda(device.clone()));
    }
    #[cfg(feature = "wgpu")]
    if let Some(device) = device.downcast_ref::<burn::backend::wgpu::WgpuDevice>() {
        return Some(Own::Wgpu(device.clone()));
    }
    let _ = device;
    None
}

/// A reader of the bytes the calling thread's stream holds on `device`, where `device` has
/// memory of its own (a CUDA or wgpu device, in a build with that feature); `None` for the
/// CPU's devices, whose tensors the counting allocator sees.
pub fn stream_reader<D: Any>(device: &D) -> Option<Reader> {
    own(device).map(|device| match device {
        #[cfg(feature = "cuda")]
        Own::Cuda(device) => cube_reader::<burn_cubecl::cubecl::cuda::CudaRuntime>(&device),
        #[cfg(feature = "wgpu")]
        Own::Wgpu(device) => cube_reader::<burn_cubecl::cubecl::wgpu::WgpuRuntime>(&device),
    })
}

/// Whether `device` has memory of its own, which [`rank_peak`] watches rather than counts.
pub fn has_own_memory<D: Any>(device: &D) -> bool {
    own(device).is_some()
}

/// The reader of the calling thread's stream on a CubeCL device.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn cube_reader<R: burn_cubecl::cubecl::Runtime>(device: &R::Device) -> Reader {
    let mut client = R::client(device);
    let stream = burn_cubecl::cubecl::stream_id::StreamId::current();
    // SAFETY: the client only reads the stream's memory counts (the query takes no tensors and
    // queues no work); CubeCL marks choosing a stream unsafe for the ordering of work on it.
    unsafe { client.set_stream(stream) };
    Box::new(move || client.memory_usage().ok().map(|usage| usage.bytes_in_use))
}

/// The device's total memory in bytes, where the device has memory of its own and says
/// (CUDA's driver does; wgpu's adapters do not).
pub fn total_bytes<D: Any>(device: &D) -> Option<u64> {
    match own(device)? {
        #[cfg(feature = "cuda")]
        Own::Cuda(device) => crate::cuda::total_bytes(device.index),
        #[cfg(feature = "wgpu")]
        Own::Wgpu(_) => None,
    }
}

/// The device's free memory in bytes now, where the device has memory of its own and says
/// (CUDA's driver does; wgpu's adapters do not).
pub fn free_bytes<D: Any>(device: &D) -> Option<u64> {
    match own(device)? {
        #[cfg(feature = "cuda")]
        Own::Cuda(device) => crate::cuda::free_bytes(device.index),
        #[cfg(feature = "wgpu")]
        Own::Wgpu(_) => None,
    }
}

/// Reads a stream's bytes every [`POLL`] on a thread of its own, keeping the most it saw, until
/// dropped.
pub struct Watch {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The stream's thread: a watch stays with the thread it was started on.
    owner: std::thread::ThreadId,
}

impl Watch {
    /// Starts watching what `read` reads, from its first reading.
    pub fn start(read: Reader) -> Self {
        let first = read().unwrap_or(0);
        let peak = Arc::new(AtomicU64::new(first));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (peak, stop) = (peak.clone(), stop.clone());
            std::thread::Builder::new()
                .name("kiln-memory-watch".into())
                .spawn(move || {
                    while !stop.load(Relaxed) {
                        if let Some(bytes) = read() {
                            peak.fetch_max(bytes, Relaxed);
                        }
                        std::thread::sleep(POLL);
                    }
                })
                .ok()
        };
        Self {
            peak,
            stop,
            thread,
            owner: std::thread::current().id(),
        }
    }

    /// The most bytes read so far.
    pub fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Each rank slot's watch, when its rank runs on a device with memory of its own.
static WATCHES: Mutex<[Option<Watch>; SLOTS]> = Mutex::new([const { None }; SLOTS]);

fn watches() -> std::sync::MutexGuard<'static, [Option<Watch>; SLOTS]> {
    // A watch is a counter: one left behind by a panic is still right.
    WATCHES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Rank `rank`'s most bytes on `device` since its watch started, where `device` has memory of
/// its own and the process counts its memory; `None` otherwise. Called on the thread that runs
/// the rank's operations: the first call there starts the rank's watch (a rank's earlier watch,
/// on another thread, stops).
pub fn rank_peak<D: Any>(rank: usize, device: &D) -> Option<u64> {
    if !counting() {
        return None;
    }
    let mut watches = watches();
    let watch = &mut watches[slot(rank)];
    let here = std::thread::current().id();
    if watch.as_ref().is_none_or(|w| w.owner != here) {
        *watch = Some(Watch::start(stream_reader(device)?));
        stop_watches_at_exit();
    }
    watch.as_ref().map(Watch::peak)
}

/// Has every rank's watch stopped before the process exits, once a watch has started.
///
/// A watch reads its device through the device's runtime, and nothing else stops it: the
/// watches live in a static, which is never dropped. As the process exits, the CUDA driver
/// shuts down (`CUDA_ERROR_DEINITIALIZED`), and a reading after that fails inside CubeCL,
/// whose threads panic and print it after a run that went well. Handlers registered with
/// `atexit` run in the reverse order of their registration and before the libraries' own
/// destructors, so this one, registered after the device's runtime started (the watch's
/// reader made its client), runs while the runtime still works.
fn stop_watches_at_exit() {
    extern "C" fn stop_all() {
        // Taken under the lock, joined after it (joining waits out a reading).
        let stopped: Vec<Watch> = watches().iter_mut().filter_map(Option::take).collect();
        drop(stopped);
    }
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `stop_all` is a plain function that neither unwinds (taking a poisoned lock
        // recovers it, and a watch's join ignores its thread's panic) nor calls `exit`.
        if unsafe { libc::atexit(stop_all) } != 0 {
            tracing::warn!("could not register the memory watches' stop at exit");
        }
    });
}

/// Rank `rank`'s most bytes on its device so far, read from any thread, where
/// [`rank_peak`] started its watch; `None` otherwise.
pub fn watched_peak(rank: usize) -> Option<u64> {
    watches()[slot(rank)].as_ref().map(Watch::peak)
}

/// Stops rank `rank`'s watch: its next [`rank_peak`] starts again from the bytes held then.
pub fn restart_rank_peak(rank: usize) {
    let stopped = watches()[slot(rank)].take();
    // Joined here, after the lock is released: joining waits out a reading.
    drop(stopped);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    #[test]
    fn a_watch_keeps_the_most_it_read_while_the_bytes_rise_and_fall() {
        let bytes = Arc::new(AtomicU64::new(100));
        let read: Reader = {
            let bytes = bytes.clone();
            Box::new(move || Some(bytes.load(Relaxed)))
        };
        let watch = Watch::start(read);
        assert_eq!(watch.peak(), 100, "from its first reading");
        bytes.store(5000, Relaxed);
        // However busy the machine, the watch reads it within seconds.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while watch.peak() < 5000 && std::time::Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        assert_eq!(watch.peak(), 5000);
        bytes.store(10, Relaxed);
        std::thread::sleep(POLL * 50);
        assert_eq!(
            watch.peak(),
            5000,
            "the most it read stays when the bytes fall"
        );
    }

    #[test]
    fn the_cpu_has_no_device_memory_to_watch() {
        let device = burn::backend::flex::FlexDevice;
        assert!(stream_reader(&device).is_none());
        assert!(!has_own_memory(&device));
        assert!(total_bytes(&device).is_none());
        assert_eq!(rank_peak(3, &device), None);
    }
}
