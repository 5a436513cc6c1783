//! One run per output: a lock held from a run's first checks to its last write.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use super::OutputError;

/// An output claimed by this run. The system releases the lock when the process ends, however
/// it ends, so a crashed run never leaves an output locked.
#[derive(Debug)]
pub struct OutputLock {
    path: PathBuf,
    _file: File,
    /// The lock file to remove when done (a file output's hidden sibling).
    remove: Option<PathBuf>,
}

impl OutputLock {
    /// Claims the folder `path` (created when missing): the folder itself is locked, and what
    /// an interrupted write into it left beside it is swept away.
    ///
    /// # Errors
    /// [`OutputError::Locked`] when another run holds it; [`OutputError::Kind`] for a file;
    /// [`OutputError::Io`] for a folder that cannot be created or opened.
    pub fn folder(path: &Path) -> Result<Self, OutputError> {
        if path.exists() && !path.is_dir() {
            return Err(OutputError::Kind {
                path: path.display().to_string(),
                reason: "is a file; give a folder",
            });
        }
        if !path.exists() {
            // A folder set aside by a swap that never finished comes back first.
            super::staging::sweep(path)?;
        }
        fs::create_dir_all(path).map_err(|e| OutputError::io("create", path, e))?;
        let file = File::open(path).map_err(|e| OutputError::io("open", path, e))?;
        let lock = Self::hold(path, file, None)?;
        super::staging::sweep(path)?;
        Ok(lock)
    }

    /// Claims the file `path`, through a hidden lock file beside it (the file itself is
    /// replaced by a rename when written, so it cannot carry the lock). Its folder is created
    /// when missing.
    ///
    /// # Errors
    /// As [`Self::folder`].
    pub fn file(path: &Path) -> Result<Self, OutputError> {
        if path.is_dir() {
            return Err(OutputError::Kind {
                path: path.display().to_string(),
                reason: "is a folder; give a file name",
            });
        }
        let Some(name) = path.file_name() else {
            return Err(OutputError::Kind {
                path: path.display().to_string(),
                reason: "has no file name; give a file",
            });
        };
        let folder = super::folder_of(path);
        if folder.exists() && !folder.is_dir() {
            return Err(OutputError::Kind {
                path: folder.display().to_string(),
                reason: "is a file; the output's folder must be a folder",
            });
        }
        fs::create_dir_all(folder).map_err(|e| OutputError::io("create", folder, e))?;
        let lock_path = folder.join(format!(".{}.lock", name.to_string_lossy()));
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| OutputError::io("create", &lock_path, e))?;
        Self::hold(path, file, Some(lock_path))
    }

    fn hold(path: &Path, file: File, remove: Option<PathBuf>) -> Result<Self, OutputError> {
        match file.try_lock() {
            Ok(()) => Ok(Self {
                path: path.to_path_buf(),
                _file: file,
                remove,
            }),
            Err(fs::TryLockError::WouldBlock) => Err(OutputError::Locked {
                path: path.display().to_string(),
            }),
            Err(fs::TryLockError::Error(e)) => Err(OutputError::io("lock", path, e)),
        }
    }

    /// The output claimed.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        if let Some(path) = &self.remove {
            let _ = fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_is_refused_until_the_first_ends() {
        let dir = std::env::temp_dir().join(format!("kiln-output-lock-{}", std::process::id()));
        let folder = dir.join("adapters");
        let first = OutputLock::folder(&folder).unwrap();
        let err = OutputLock::folder(&folder).unwrap_err();
        assert!(matches!(err, OutputError::Locked { .. }), "{err}");
        drop(first);
        drop(OutputLock::folder(&folder).unwrap());

        let report = dir.join("report.json");
        let first = OutputLock::file(&report).unwrap();
        let err = OutputLock::file(&report).unwrap_err();
        assert!(matches!(err, OutputError::Locked { .. }), "{err}");
        drop(first);
        assert!(
            !dir.join(".report.json.lock").exists(),
            "the lock file is removed"
        );
        fs::remove_dir_all(&dir).ok();
    }
}
