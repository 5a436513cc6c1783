//! Kiln: train one Burn model on many devices through pluggable parallelism strategies.
//!
//! This facade re-exports the workspace crates: [`core`] (World, Collective, strategies),
//! [`planner`] (the planner `auto` measures on this machine), [`kernels`] (CubeCL kernels as a
//! Burn backend extension), [`nn`] (layers, LoRA / QLoRA and reference models) and [`ad`]
//! (Algorithm Distillation on Dark Room).

pub use kiln_ad as ad;
pub use kiln_core as core;
pub use kiln_kernels as kernels;
pub use kiln_nn as nn;
pub use kiln_planner as planner;

pub use kiln_core::prelude;
