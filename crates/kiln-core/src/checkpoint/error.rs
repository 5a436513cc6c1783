//! Why a checkpoint could not be written, found or trusted: one line each, naming the file.

/// A checkpoint that cannot be written, found, or trusted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CheckpointError {
    /// A checkpoint setting out of range.
    #[error("{0}")]
    Setting(&'static str),
    /// A file or folder could not be read, written or removed.
    #[error("cannot {action} {path}: {reason}")]
    Io {
        /// `read`, `write`, `create`, `rename`, `remove`, `sync`.
        action: &'static str,
        /// The file or folder.
        path: String,
        /// The system's message.
        reason: String,
    },
    /// A path that should be a folder is something else.
    #[error("{path} is a file, not a checkpoint folder; give a folder (it is created if missing)")]
    NotAFolder {
        /// The path.
        path: String,
    },
    /// A folder without a checkpoint.
    #[error(
        "{path} holds no checkpoint: neither a manifest.toml nor step-<N> folders; give a \
         folder a run saved into (kiln train --save, kiln ad train --out) or one of its \
         step-<N> folders"
    )]
    NotFound {
        /// The folder.
        path: String,
    },
    /// A manifest that does not parse.
    #[error("checkpoint {path} is unreadable: {reason}; use another step")]
    Manifest {
        /// The manifest file.
        path: String,
        /// The parser's message.
        reason: String,
    },
    /// An input of the run differs from the one the checkpoint was trained on.
    #[error(
        "checkpoint {checkpoint} was trained on another {input} ({was}; now {now}); resume with \
         the inputs it was trained on, or start a new run (--save into another folder) to \
         train on these"
    )]
    InputChanged {
        /// The checkpoint step.
        checkpoint: String,
        /// The input, by the job's name for it (`data`, `model/config.json`).
        input: String,
        /// What the checkpoint recorded.
        was: String,
        /// What the run has now.
        now: String,
    },
    /// A file the manifest lists is not there.
    #[error("checkpoint file {path} is missing; the checkpoint is incomplete, use another step")]
    Missing {
        /// The file.
        path: String,
    },
    /// A file of another size than the one written.
    #[error(
        "checkpoint file {path} has {found} bytes but {expected} were written (truncated or \
         overwritten); use another step"
    )]
    Size {
        /// The file.
        path: String,
        /// Bytes written.
        expected: u64,
        /// Bytes found.
        found: u64,
    },
    /// A file whose bytes changed since they were written.
    #[error(
        "checkpoint file {path} is corrupted: its SHA-256 is {found}, not the {expected} written; \
         use another step"
    )]
    Digest {
        /// The file.
        path: String,
        /// The digest written.
        expected: String,
        /// The digest found.
        found: String,
    },
    /// A checkpoint of another model.
    #[error(
        "checkpoint {path} holds {found}, but this run trains {expected}; resume with the model \
         (and config) that saved it"
    )]
    OtherModel {
        /// The manifest.
        path: String,
        /// The model this run builds, described.
        expected: String,
        /// The model the checkpoint holds, described.
        found: String,
    },
    /// A checkpoint of a strategy whose optimizer state does not load into this one.
    #[error(
        "checkpoint {path} was saved by {found_strategy} ({found_layout}), but this run's \
         {expected_strategy} needs {expected_layout}; resume with the strategy (and numbers of \
         stages and shards) that saved it"
    )]
    OtherStrategy {
        /// The manifest.
        path: String,
        /// The strategy that saved it, with its mesh.
        found_strategy: String,
        /// How its optimizer state is cut.
        found_layout: String,
        /// This run's strategy, with its mesh.
        expected_strategy: String,
        /// How this run cuts its optimizer state.
        expected_layout: String,
    },
    /// A job file that is not in the checkpoint.
    #[error("checkpoint {path} has no {file}; it was not written by this job")]
    NoFile {
        /// The checkpoint's folder.
        path: String,
        /// The file asked for.
        file: String,
    },
    /// Bytes that passed their digest but do not decode as what was asked (a checkpoint of
    /// another Kiln version, or of a model of the same shapes but other types).
    #[error("checkpoint file {path} does not decode: {reason}")]
    Decode {
        /// The file.
        path: String,
        /// The decoder's first line.
        reason: String,
    },
    /// A resumed run whose last step the checkpoint has already trained.
    #[error(
        "the checkpoint {path} has trained {step} steps and this run ends at step {steps}: \
         nothing to train; give --steps above {step} to train further"
    )]
    NothingToTrain {
        /// The checkpoint's folder.
        path: String,
        /// Its step.
        step: usize,
        /// The run's last step.
        steps: usize,
    },
    /// A checkpoint setting of a run that saves nowhere.
    #[error("{0} needs a checkpoint folder, but none is given; add {1}")]
    NoFolder(&'static str, &'static str),
    /// Another run is saving into the folder.
    #[error(
        "another run is saving into {path} (it holds {path}/.lock); wait for it to end, or save \
         into another folder"
    )]
    Locked {
        /// The folder.
        path: String,
    },
    /// A save folder that already holds later steps of some run.
    #[error(
        "{path} already holds checkpoints up to step {newest}, {why}; save into another \
         folder, resume from its newest step, or pass --overwrite to discard them"
    )]
    InUse {
        /// The folder.
        path: String,
        /// Its newest step.
        newest: usize,
        /// How they clash with this run.
        why: String,
    },
}

impl CheckpointError {
    pub(crate) fn io(action: &'static str, path: &std::path::Path, e: impl ToString) -> Self {
        CheckpointError::Io {
            action,
            path: path.display().to_string(),
            reason: e.to_string(),
        }
    }
}

impl From<crate::output::OutputError> for CheckpointError {
    fn from(e: crate::output::OutputError) -> Self {
        match e {
            crate::output::OutputError::Io { op, path, source } => CheckpointError::Io {
                action: op,
                path,
                reason: source.to_string(),
            },
            crate::output::OutputError::Locked { path } => CheckpointError::Locked { path },
            crate::output::OutputError::Kind { path, reason } => CheckpointError::Io {
                action: "use",
                reason: format!("{path} {reason}"),
                path,
            },
        }
    }
}
