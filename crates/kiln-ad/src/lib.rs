//! Algorithm Distillation (Laskin et al., 2022) on Dark Room, trained through Kiln's strategies.
//!
//! The pipeline reads top-down: [`source`] records learning histories of tabular Q-learning
//! on the training goals → [`dataset`] cuts them into windows of consecutive steps →
//! [`model::AdTransformer`] learns to predict the source's next action from the window (any
//! Kiln strategy trains it) → [`eval`] lets the frozen model act on held-out goals for many
//! episodes with its context carried across them, next to a random policy and the source.

pub mod checkpoint;
pub mod config;
pub mod dataset;
pub mod env;
pub mod error;
pub mod eval;
pub mod goals;
pub mod history;
pub mod model;
pub mod pipeline;
pub mod plot;
pub mod report;
pub mod source;
pub mod train;

pub use error::AdError;
