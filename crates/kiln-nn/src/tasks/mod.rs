//! Synthetic tasks, generated from a seed, for the reference models: no download, the same
//! data on every rank and in every process.

mod fibonacci;
mod teacher;

pub use fibonacci::{FibonacciTask, SequenceBatch, SequenceBatcher, SequenceItem};
pub use teacher::{ClassificationBatch, ClassificationBatcher, ClassificationItem, TeacherTask};
