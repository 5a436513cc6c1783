//! The planner's cost model: for a workload (a model, its precision and batch) and a cluster
//! (devices, machines, links), every layout `dp × pp × tp` with its micro-batching, its memory
//! per device and its step time, and the fastest that fits. `kiln plan` prints it; it answers
//! for hardware this machine does not have, and, with a model's step [`Measured`] here, for
//! this machine's cores (what `auto` runs).

mod cluster;
mod estimate;
mod measured;
mod search;
mod workload;

pub use cluster::{CLOSE, Cluster, DEFAULT_EFFICIENCY, PRESETS, Preset, parse_bytes};
pub use estimate::{Layout, Memory, StepTime, TP_CALLS_PER_BLOCK, memory, step_time};
pub use measured::{FitError, Measured, Timing};
pub use search::strategy;
pub use search::{Candidate, Fixed, PlanError, Planned, USABLE_MEMORY, search, search_within};
pub use workload::{TransformerShape, Workload};

#[cfg(test)]
pub(crate) mod tests;
