//! The planner `auto` plans with, measured on this machine: a model's step timed on its
//! devices and fitted to the cost model ([`measure`]), the collectives' link probed, and the
//! model's memory fitted over shards and stages ([`memory_fit`]). It builds and steps real
//! strategies, so it stands above them; the plan it feeds ([`crate::plan`]) stands below.

pub mod measure;
pub mod memory_fit;
