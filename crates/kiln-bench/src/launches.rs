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
//! Explicit `Backend::sync` calls block in Burn without such a span; Kiln's strategies call
//! them only where a thread hands tensors to another (a rank's model at the end), not inside a
//! step.

use std::sync::atomic::{AtomicU64, Ordering};

use tracing::span::{Attributes, Id};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::Registry;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static HOST_SYNCS: AtomicU64 = AtomicU64::new(0);

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
