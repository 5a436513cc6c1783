//! Everything a run will write, checked before its first step: a typo in `--json` must not
//! throw away hours of training.

use std::fs;
use std::path::Path;

/// An output the run could not write.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {path}: {reason}")]
pub struct OutputError {
    flag: &'static str,
    path: String,
    reason: String,
}

fn refuse(flag: &'static str, path: &Path, reason: impl ToString) -> OutputError {
    OutputError {
        flag,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Checks that the file `path` of `flag` can be written when the run ends: not a folder, its
/// folder existing (created now if missing) and writable. An existing file is left as it is.
///
/// # Errors
/// [`OutputError`] naming the flag.
pub fn check_file(flag: &'static str, path: &Path) -> Result<(), OutputError> {
    if path.is_dir() {
        return Err(refuse(flag, path, "is a folder; give a file name"));
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    check_folder(flag, parent)
        .map_err(|e| refuse(flag, path, format!("its folder {} {}", e.path, e.reason)))?;
    let existed = path.exists();
    fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| refuse(flag, path, format!("cannot be written: {e}")))?;
    if !existed {
        fs::remove_file(path).map_err(|e| refuse(flag, path, format!("cannot be removed: {e}")))?;
    }
    Ok(())
}

/// Checks that the folder `path` of `flag` exists (created now if missing) and is writable.
///
/// # Errors
/// [`OutputError`] naming the flag.
pub fn check_folder(flag: &'static str, path: &Path) -> Result<(), OutputError> {
    if path.exists() && !path.is_dir() {
        return Err(refuse(flag, path, "is a file; give a folder"));
    }
    fs::create_dir_all(path).map_err(|e| refuse(flag, path, format!("cannot be created: {e}")))?;
    let probe = path.join(format!(".kiln-probe-{}", std::process::id()));
    fs::write(&probe, b"").map_err(|e| refuse(flag, path, format!("is not writable: {e}")))?;
    fs::remove_file(&probe).map_err(|e| refuse(flag, path, format!("is not writable: {e}")))
}
