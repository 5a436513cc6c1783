//! The planner `auto` plans with, measured on this machine: a model's step timed on its
//! devices and fitted to the cost model ([`measure`]), the collectives' link probed
//! ([`probe_links`]), and the model's memory fitted over shards and stages ([`memory_fit`]),
//! built into planners ([`planner`], [`device_planner`], [`cpu_planner`]).
//!
//! It builds and steps real strategies, so it is a crate above kiln-core: the build keeps every
//! strategy, and the plan it feeds ([`kiln_core::plan`], whose `auto` takes a planner as a
//! [`Planner`](kiln_core::plan::Planner) value), from reaching up into it.

mod construct;
pub mod measure;
pub mod memory_fit;
mod probe;

pub use construct::{cpu_planner, device_planner, planner};
pub use measure::{MeasureError, TIMED_RANKS};
pub use probe::probe_links;
