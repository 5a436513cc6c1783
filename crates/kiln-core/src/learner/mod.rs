//! Kiln's strategies under burn-train's `SupervisedTraining`: [`KilnLearning`] is a
//! `TrainingStrategy::Custom`, and [`StrategyOptimizer`] the `Learner`'s optimizer that goes
//! with it. See [`KilnLearning`] for how the two fit Burn's `Learner`, and the book's Learner
//! page for a whole example.

mod feed;
mod optimizer;
mod strategy;

pub use optimizer::{SendStrategy, StrategyOptimizer};
pub use strategy::{BuildStrategy, KilnLearning};
