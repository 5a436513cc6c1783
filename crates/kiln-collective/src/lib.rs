//! Kiln's lowest layer: who takes part in a run ([`World`]: processes, devices, ranks and
//! their mesh), how ranks talk ([`Collective`]: in one process, or across processes and
//! machines through MPI with the `mpi` feature), and the statistics of repeated timings that
//! the link probe and the planner share.
//!
//! It knows no model, strategy or plan: kiln-core builds those on top, and re-exports these
//! modules under its own paths (`kiln_core::world`, `kiln_core::collective`,
//! `kiln_core::stats`).

pub mod collective;
pub mod stats;
pub mod world;

pub use collective::{Collective, CollectiveError, ReduceOp};
pub use world::{World, WorldError};
