//! The planner's cost model: for a workload (a model, its precision and batch) and a cluster
//! (devices, machines, links), every layout `dp × pp × tp` with its micro-batching and stage
//! split, its memory per device and its step time, and the fastest that fits. `kiln plan`
//! prints it; it answers for hardware this machine does not have, and, with a model's step
//! [`Measured`] here, for this machine's cores (what `auto` runs).

mod cluster;
mod estimate;
mod layout;
mod measured;
mod search;
mod stage_cost;
mod stages;
mod workload;

pub use cluster::{
    CLOSE, Cluster, DEFAULT_EFFICIENCY, LimitError, PRESETS, Preset, USABLE_MEMORY, parse_bytes,
    parse_limits, size,
};
pub use estimate::{
    TP_CALLS_PER_BLOCK, memory, memory_by_stage, memory_with, step_time, step_time_with,
};
pub use layout::{Layout, Memory, StageSplit, StepTime};
pub use measured::{FitError, Measured, Timing};
pub use search::strategy;
pub use search::{Candidate, Fixed, PlanError, Planned, search, search_within};
pub use stages::{blocks, even};
pub use workload::{TransformerShape, Workload};

#[cfg(test)]
pub(crate) mod tests;
