//! What a run fixes of `auto`'s layout before the planner lays out the rest: the layout of the
//! checkpoint it resumes from, else what its precision rules out.

use std::path::Path;

use kiln_core::checkpoint::{Checkpoint, CheckpointError};
use kiln_core::optim::Precision;
use kiln_core::plan::cost::Fixed;
use kiln_core::strategy::StrategyKind;

/// What a run of `strategy` in `precision` that resumes from `resume` (if any) fixes of
/// `auto`'s layout, and why ([`Fixed::of_run`]); `None` when nothing. The checkpoint's
/// manifest is read only when `strategy` is `auto`: a named strategy's plan is checked against
/// the checkpoint as it stands.
///
/// # Errors
/// A checkpoint whose manifest cannot be read or names a layout this Kiln does not know.
pub fn auto_fixed(
    strategy: StrategyKind,
    resume: Option<&Path>,
    precision: Precision,
) -> Result<Option<(Fixed, String)>, CheckpointError> {
    let resumed = match resume {
        Some(path) if strategy == StrategyKind::Auto => Some(Checkpoint::layout_at(path)?),
        _ => None,
    };
    Ok(Fixed::of_run(resumed, precision))
}
