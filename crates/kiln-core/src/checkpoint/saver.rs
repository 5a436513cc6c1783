//! Saving a run's steps into its folder: what a program's [`FitHooks`](crate::fit::FitHooks)
//! call, periodically and at the end.

use std::path::PathBuf;

use burn::module::Module;
use burn::tensor::backend::Backend;

use super::{CheckpointError, CheckpointFolder, RunInfo};
use crate::optim::OptimizerState;

/// Saves the steps of one run into its [`CheckpointFolder`], each with the same job files
/// beside the model and the optimizer state.
#[derive(Debug, Clone)]
pub struct Saver {
    folder: CheckpointFolder,
    kind: String,
    run: RunInfo,
    files: Vec<(String, Vec<u8>)>,
    last: Option<(usize, PathBuf)>,
}

impl Saver {
    /// Saves a model its job calls `kind`, trained by `run`, into `folder`.
    pub fn new(folder: CheckpointFolder, kind: &str, run: RunInfo) -> Self {
        Self {
            folder,
            kind: kind.to_string(),
            run,
            files: Vec::new(),
            last: None,
        }
    }

    /// Also writes the job's file `name` into every step (the AD job's `config.toml`).
    pub fn with_file(mut self, name: &str, bytes: Vec<u8>) -> Self {
        self.files.push((name.to_string(), bytes));
        self
    }

    /// Records the run's inputs in every step's manifest
    /// ([`CheckpointFolder::with_inputs`]).
    pub fn with_inputs(
        mut self,
        inputs: std::collections::BTreeMap<String, super::FileDigest>,
    ) -> Self {
        self.folder = self.folder.with_inputs(inputs);
        self
    }

    /// The folder saved into.
    pub fn folder(&self) -> &CheckpointFolder {
        &self.folder
    }

    /// Records the held-out loss of the model after `step` steps, for a save of that step
    /// ([`CheckpointFolder::record_eval`]).
    pub fn record_eval(&mut self, step: usize, loss: f64) {
        self.folder.record_eval(step, loss);
    }

    /// Saves step `step`; returns its folder.
    ///
    /// # Errors
    /// A file that cannot be written; earlier steps stay whole.
    pub fn save<B: Backend, M: Module<B>>(
        &mut self,
        step: usize,
        model: M,
        optimizer: &OptimizerState,
    ) -> Result<PathBuf, CheckpointError> {
        let files: Vec<(&str, &[u8])> = self
            .files
            .iter()
            .map(|(name, bytes)| (name.as_str(), bytes.as_slice()))
            .collect();
        let dir = self
            .folder
            .save(step, &self.kind, model, optimizer, self.run.clone(), &files)?;
        tracing::info!("saved step {step} to {}", dir.display());
        self.last = Some((step, dir.clone()));
        Ok(dir)
    }

    /// The last step saved, and where.
    pub fn last(&self) -> Option<&(usize, PathBuf)> {
        self.last.as_ref()
    }
}
