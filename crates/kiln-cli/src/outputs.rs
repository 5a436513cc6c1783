//! Everything a run will write, checked and claimed before its first step: a typo in `--json`
//! must not throw away hours of training, and two runs given the same output must not both
//! write it. Each output is written whole when the run ends (`kiln_core::output`).

use std::path::Path;

use kiln_core::output::{OutputError as Written, OutputLock, write_file};

/// An output the run could not claim or write.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {path}: {reason}")]
pub struct OutputError {
    flag: &'static str,
    path: String,
    reason: String,
}

/// The error of the output `path` of `flag`, for `reason`.
pub fn refuse(flag: &'static str, path: &Path, reason: impl ToString) -> OutputError {
    OutputError {
        flag,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Why an output cannot be used, in the words of a flag's message.
fn reason(e: Written) -> String {
    match e {
        Written::Locked { .. } => {
            "is being written by another Kiln run; wait for it to finish or give another path"
                .to_string()
        }
        Written::Kind { reason, .. } => reason.to_string(),
        Written::Io { op, source, .. } => format!("cannot {op}: {source}"),
    }
}

/// Claims the file `path` of `flag` for this run, until the returned lock is dropped: not a
/// folder, its folder existing (created now if missing) and writable, and no other run
/// writing it. An existing file is left as it is until [`write`] replaces it.
///
/// # Errors
/// [`OutputError`] naming the flag.
pub fn check_file(flag: &'static str, path: &Path) -> Result<OutputLock, OutputError> {
    let lock = OutputLock::file(path).map_err(|e| refuse(flag, path, reason(e)))?;
    let folder = kiln_core::output::folder_of(path);
    probe(flag, folder).map_err(|e| refuse(flag, path, format!("its folder {e}")))?;
    Ok(lock)
}

/// [`check_file`] for each of `files` (`("--json", path)`) that is given.
///
/// # Errors
/// The first [`OutputError`].
pub fn check_files(
    files: &[(&'static str, Option<&Path>)],
) -> Result<Vec<OutputLock>, OutputError> {
    files
        .iter()
        .filter_map(|&(flag, path)| path.map(|path| check_file(flag, path)))
        .collect()
}

/// Claims the folder `path` of `flag` for this run, until the returned lock is dropped: a
/// folder (created now if missing), writable, and no other run writing it.
///
/// # Errors
/// [`OutputError`] naming the flag.
pub fn check_folder(flag: &'static str, path: &Path) -> Result<OutputLock, OutputError> {
    let lock = OutputLock::folder(path).map_err(|e| refuse(flag, path, reason(e)))?;
    probe(flag, path).map_err(|e| refuse(flag, path, e))?;
    Ok(lock)
}

/// Checks that `folder` takes a new file, and (its parent too: outputs are staged beside
/// themselves) that the folder holding it does.
fn probe(flag: &'static str, folder: &Path) -> Result<(), String> {
    let probe = folder.join(format!(".kiln-probe-{}-{flag}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| format!("is not writable: {e}"))?;
    std::fs::remove_file(&probe).map_err(|e| format!("is not writable: {e}"))
}

/// Writes `bytes` to the file `path` of `flag` whole: a crash or a full disk leaves the old
/// file as it was.
///
/// # Errors
/// [`OutputError`] naming the flag.
pub fn write(flag: &'static str, path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    write_file(path, bytes).map_err(|e| refuse(flag, path, reason(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_run_cannot_claim_an_output_the_first_holds() {
        let dir = std::env::temp_dir().join(format!("kiln-outputs-{}", std::process::id()));
        let held = check_folder("--output", &dir).unwrap();
        let err = check_folder("--output", &dir).unwrap_err().to_string();
        assert!(err.starts_with("--output "), "{err}");
        assert!(err.contains("another Kiln run"), "{err}");
        drop(held);
        let json = dir.join("report.json");
        let held = check_file("--json", &json).unwrap();
        assert!(check_file("--json", &json).is_err());
        write("--json", &json, b"{}").unwrap();
        drop(held);
        assert_eq!(std::fs::read(&json).unwrap(), b"{}");
        let err = check_file("--json", &dir).unwrap_err().to_string();
        assert!(err.contains("is a folder"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
