//! Why an output could not be written.

use std::path::Path;

/// An output that could not be claimed or written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// A system call on the output failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What was being done (`write`, `rename`, …).
        op: &'static str,
        /// The path.
        path: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// Another run holds the output.
    #[error(
        "{path} is being written by another Kiln run; wait for it to finish or give another path"
    )]
    Locked {
        /// The output.
        path: String,
    },
    /// A file where a folder is needed, or the reverse.
    #[error("{path} {reason}")]
    Kind {
        /// The output.
        path: String,
        /// What it is and what was wanted.
        reason: &'static str,
    },
}

impl OutputError {
    /// A failed system call `op` on `path`.
    pub fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.display().to_string(),
            source,
        }
    }
}
