//! Kernel launches and host synchronisations, counted on any CubeCL runtime.
//!
//! On a GPU the cost of a small training step is mostly on the host: each kernel launch is a
//! dispatch, and each read of a value back to the host waits for every queued kernel. Both are
//! the same count on every CubeCL runtime (lavapipe, CUDA, …), so they can be measured on a
//! machine without a GPU. CubeCL, built with its `tracing` feature (kiln-kernels turns it on),
//! opens a trace-level span for each: `launch_inner` for a launch, and `block_on` for every
//! blocking read of a tensor to the host (`into_data`, `into_scalar`, and Burn's own reads).
//! [`install`] makes a subscriber that counts those two spans, process-wide, and nothing else.
//!
//! [`record`] also keeps every launch's kernel name and cube count (the span's `kernel.name` and
//! `count` fields), for [`Launch`]-level reports: which kernels a step runs, and whether a large
//! reduction runs on enough cubes to fill a GPU.
//!
//! Explicit `Backend::sync` calls block in Burn without such a span; Kiln's strategies call
//! them only where a thread hands tensors to another (a rank's model at the end), not inside a
//! step.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::Registry;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static HOST_SYNCS: AtomicU64 = AtomicU64::new(0);
static RECORDING: AtomicBool = AtomicBool::new(false);
static LOG: Mutex<Vec<Launch>> = Mutex::new(Vec::new());

/// One kernel launch, as CubeCL's span describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The kernel's name: its Rust path and type parameters, as CubeCL prints them.
    pub kernel: String,
    /// The cubes launched (the product of the static cube count), or `None` for a count read
    /// from a device buffer.
    pub cubes: Option<u64>,
}

impl Launch {
    /// The kernel's name without its module path and type parameters (`reduce_kernel` for
    /// `cubek_reduce::launch::reduce_kernel<f32, ..>`).
    pub fn short_name(&self) -> &str {
        let base = self.kernel.split('<').next().unwrap_or(&self.kernel);
        base.rsplit("::").next().unwrap_or(base).trim()
    }
}

/// Reads a launch span's fields: `kernel.name` (Display) and `count` (`CubeCount`'s Debug,
/// `(x, y, z)` for a static count, `binding` for a dynamic one).
#[derive(Default)]
struct LaunchFields {
    kernel: String,
    cubes: Option<u64>,
}

impl Visit for LaunchFields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "kernel.name" => self.kernel = format!("{value:?}"),
            "count" => self.cubes = cube_count(&format!("{value:?}")),
            _ => {}
        }
    }
}

/// The cubes of a `CubeCount` printed as `(x, y, z)`.
fn cube_count(debug: &str) -> Option<u64> {
    let inner = debug.trim().strip_prefix('(')?.strip_suffix(')')?;
    inner
        .split(',')
        .map(|n| n.trim().parse::<u64>().ok())
        .try_fold(1u64, |product, n| Some(product * n?))
}

/// Starts (or stops) keeping every launch's kernel and cube count; [`take_log`] hands them
/// over. Counting goes on either way.
pub fn record(on: bool) {
    RECORDING.store(on, Ordering::Relaxed);
}

/// The launches kept since the last call, oldest first.
pub fn take_log() -> Vec<Launch> {
    std::mem::take(&mut *LOG.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}

/// Launches and host synchronisations so far (or between two readings: see
/// [`Counts::since`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Kernel launches.
    pub launches: u64,
    /// Blocking reads of device values by the host.
    pub host_syncs: u64,
}

impl Counts {
    /// The counts so far, over every thread.
    pub fn now() -> Self {
        Self {
            launches: LAUNCHES.load(Ordering::Relaxed),
            host_syncs: HOST_SYNCS.load(Ordering::Relaxed),
        }
    }

    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: Counts) -> Counts {
        Counts {
            launches: self.launches - earlier.launches,
            host_syncs: self.host_syncs - earlier.host_syncs,
        }
    }
}

/// The launches and host synchronisations of one call of `step` on `device`, the launches the
/// device still held queued afterwards (a fusion stream's) included: the device is synchronised
/// after `step`, and that synchronisation is not counted as the step's.
///
/// # Errors
/// `step`'s error, or a device that fails to synchronise.
pub fn measure_step<B: burn::tensor::backend::Backend, T, E>(
    device: &B::Device,
    step: impl FnOnce() -> Result<T, E>,
) -> Result<Counts, Box<dyn std::error::Error>>
where
    E: Into<Box<dyn std::error::Error>>,
{
    let before = Counts::now();
    step().map_err(Into::into)?;
    let stepped = Counts::now();
    B::sync(device).map_err(|e| format!("the device did not synchronise: {e:?}"))?;
    Ok(Counts {
        launches: Counts::now().since(before).launches,
        host_syncs: stepped.since(before).host_syncs,
    })
}

/// Which of CubeCL's spans a callsite is.
fn counted(metadata: &Metadata<'_>) -> Option<&'static AtomicU64> {
    match (metadata.target(), metadata.name()) {
        ("cubecl_runtime::client", "launch_inner") => Some(&LAUNCHES),
        ("cubecl_common::future", "block_on") => Some(&HOST_SYNCS),
        _ => None,
    }
}

struct CountLayer;

impl<S: Subscriber> Layer<S> for CountLayer {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        // Only the two spans are enabled: every other callsite stays free.
        if counted(metadata).is_some() {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        counted(metadata).is_some()
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        if let Some(counter) = counted(attrs.metadata()) {
            counter.fetch_add(1, Ordering::Relaxed);
            if std::ptr::eq(counter, &LAUNCHES) && RECORDING.load(Ordering::Relaxed) {
                let mut fields = LaunchFields::default();
                attrs.record(&mut fields);
                LOG.lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .push(Launch {
                        kernel: fields.kernel,
                        cubes: fields.cubes,
                    });
            }
        }
    }
}

/// Makes the process's tracing subscriber one that counts launches and host
/// synchronisations. Call it before the first tensor is made: CubeCL's callsites cache
/// whether anyone listens.
///
/// # Errors
/// When the process already has a global subscriber.
pub fn install() -> Result<(), tracing::subscriber::SetGlobalDefaultError> {
    tracing::subscriber::set_global_default(Registry::default().with(CountLayer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cube_counts_are_read_from_the_span() {
        assert_eq!(cube_count("(16, 1, 1)"), Some(16));
        assert_eq!(cube_count("(4, 3, 2)"), Some(24));
        assert_eq!(cube_count("binding"), None);
    }

    #[test]
    fn short_names_drop_paths_and_parameters() {
        let launch = Launch {
            kernel: "cubek_reduce::launch::reduce_kernel<f32, f32>".into(),
            cubes: Some(1),
        };
        assert_eq!(launch.short_name(), "reduce_kernel");
    }
}
