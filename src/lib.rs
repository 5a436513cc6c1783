//! Kiln: train one Burn model on many devices through pluggable parallelism strategies.
//!
//! This facade re-exports the workspace crates: [`core`] (World, Collective, strategies)
//! and [`nn`] (layers and reference models).

pub use kiln_core as core;
pub use kiln_nn as nn;

pub use kiln_core::prelude;
