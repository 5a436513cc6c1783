//! Algorithm Distillation (Laskin et al., 2022) on Dark Room, trained through Kiln's strategies.
//!
//! The pipeline reads top-down: [`source`] records learning histories of tabular Q-learning
//! on the training goals of [`goals`] → [`dataset`] cuts them into windows of consecutive steps
//! → [`model::AdTransformer`] learns to predict the source's next action from each window (any
//! Kiln strategy trains it, see [`train`]) → [`eval`] lets the frozen model act on held-out
//! goals for many episodes with its context carried across them, next to a random policy and
//! the source → [`report`] checks in-context learning and [`plot`] draws it.
//! [`run::run`] does all of it in one call; [`checkpoint`] saves and loads a run.
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use kiln_ad::config::AdConfig;
//! use kiln_ad::run::{LogProgress, RunOptions, run};
//!
//! let config = AdConfig::default();
//! let mut log = LogProgress::new(config.train.steps);
//! let plan = config.plan(1)?; // one rank; `auto` would say which strategy and why
//! let done = run::<Autodiff<Flex>>(
//!     &config,
//!     &plan,
//!     vec![Default::default()],
//!     RunOptions::default(),
//!     &mut log,
//! )?;
//! println!("{:.1} ms per training step", done.train.ms_per_step);
//! # Ok::<(), kiln_ad::AdError>(())
//! ```

pub mod checkpoint;
pub mod config;
pub mod dataset;
pub mod env;
pub mod error;
pub mod eval;
pub mod goals;
pub mod history;
pub mod model;
pub mod plan;
pub mod plot;
pub mod report;
pub mod run;
pub mod sharded;
pub mod source;
pub mod stages;
pub mod train;

pub use error::AdError;
