//! Crossing threads: rank threads hand tensors and panics to other threads, and both need
//! care on the way.

use super::RankError;
use crate::collective::CollectiveError;

/// Waits for `device` to finish the work this thread queued, before its results are handed to
/// another thread: devices may queue each thread's work separately (CubeCL keeps a stream per
/// thread). Free on CPU backends.
pub(crate) fn sync_device<B: burn::tensor::backend::Backend>(
    device: &B::Device,
) -> Result<(), RankError> {
    B::sync(device).map_err(|e| RankError::Device(format!("{e:?}")))
}

/// A caught panic as the rank's error. A collective call that failed inside a forward or a
/// backward (a tensor-parallel layer's) unwinds with the [`CollectiveError`] itself, which
/// names the rank to blame; any other panic is this rank's own.
pub(crate) fn panic_error(payload: Box<dyn std::any::Any + Send>) -> RankError {
    match payload.downcast::<CollectiveError>() {
        Ok(error) => RankError::Collective(*error),
        Err(payload) => RankError::Panicked(panic_message(payload.as_ref())),
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
