//! Files and folder entries made durable: written, synced, renamed into place.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use super::OutputError;

/// The folder holding `path`: its parent, or `.` for a bare name.
pub fn folder_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Creates `path` (replacing a file there), writes `bytes` and syncs them to the disk.
///
/// # Errors
/// [`OutputError::Io`] naming the step that failed (a full disk fails `write` or `sync`).
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    let mut file = File::create(path).map_err(|e| OutputError::io("create", path, e))?;
    file.write_all(bytes)
        .map_err(|e| OutputError::io("write", path, e))?;
    file.sync_all()
        .map_err(|e| OutputError::io("sync", path, e))
}

/// Makes a folder's entries (a new file, a rename) durable. Folders cannot be opened for
/// syncing on every platform; where they cannot, the rename is as durable as the system makes
/// it.
///
/// # Errors
/// [`OutputError::Io`] when the folder cannot be synced.
pub fn sync_folder(path: &Path) -> Result<(), OutputError> {
    #[cfg(unix)]
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| OutputError::io("sync", path, e))?;
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Replaces the file `path` with `bytes` atomically: they are written and synced into a
/// hidden sibling, which is then renamed over `path`. A crash or a full disk leaves the old
/// file whole; a link at `path` is replaced, not written through.
///
/// # Errors
/// [`OutputError::Io`]; the temporary file is removed and `path` is untouched.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    let name = path
        .file_name()
        .ok_or_else(|| OutputError::Kind {
            path: path.display().to_string(),
            reason: "has no file name; give a file",
        })?
        .to_string_lossy();
    let folder = folder_of(path);
    if path.is_dir() {
        return Err(OutputError::Kind {
            path: path.display().to_string(),
            reason: "is a folder; give a file name",
        });
    }
    let temp = folder.join(format!(".{name}.tmp-{}", std::process::id()));
    let written = write_synced(&temp, bytes)
        .and_then(|()| fs::rename(&temp, path).map_err(|e| OutputError::io("rename", &temp, e)));
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written?;
    sync_folder(folder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_replaced_never_written_through() {
        let dir = std::env::temp_dir().join(format!("kiln-write-file-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let precious = dir.join("precious.txt");
        fs::write(&precious, b"the user's").unwrap();
        let out = dir.join("report.json");
        #[cfg(unix)]
        std::os::unix::fs::symlink(&precious, &out).unwrap();
        write_file(&out, b"{}").unwrap();
        assert_eq!(fs::read(&precious).unwrap(), b"the user's");
        assert_eq!(fs::read(&out).unwrap(), b"{}");
        assert!(!fs::symlink_metadata(&out).unwrap().is_symlink());
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "no temporary file is left: {names:?}");
        fs::remove_dir_all(&dir).ok();
    }
}
