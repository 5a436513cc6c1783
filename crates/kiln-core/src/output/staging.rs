//! A whole output folder built beside its target and swapped in at once.

use std::fs;
use std::path::{Path, PathBuf};

use super::{OutputError, sync_folder};

/// The tags of the hidden siblings a [`Staging`] makes: `.<name>.staging-<pid>`.
const STAGING: &str = ".staging-";

/// A folder being written beside its target, `.<name>.staging-<pid>`: write every file of the
/// output into [`Self::path`], then [`Self::commit`]. Dropped uncommitted, it is removed and
/// the target is untouched.
#[derive(Debug)]
pub struct Staging {
    target: PathBuf,
    dir: PathBuf,
    committed: bool,
    /// The files written through [`Self::write`], in order.
    written: Vec<String>,
}

impl Staging {
    /// A fresh staging folder for the output folder `target` (a link to a folder stands for
    /// the folder it names: the user chose it).
    ///
    /// # Errors
    /// [`OutputError::Kind`] when `target` is a file; [`OutputError::Io`] when the staging
    /// folder cannot be created.
    pub fn new(target: &Path) -> Result<Self, OutputError> {
        if target.exists() && !target.is_dir() {
            return Err(OutputError::Kind {
                path: target.display().to_string(),
                reason: "is a file; give a folder",
            });
        }
        let target = match target.exists() {
            true => fs::canonicalize(target).map_err(|e| OutputError::io("resolve", target, e))?,
            false => target.to_path_buf(),
        };
        let (parent, name) = split(&target)?;
        fs::create_dir_all(&parent).map_err(|e| OutputError::io("create", &parent, e))?;
        let dir = parent.join(format!(".{name}{STAGING}{}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(|e| OutputError::io("remove", &dir, e))?;
        }
        fs::create_dir(&dir).map_err(|e| OutputError::io("create", &dir, e))?;
        Ok(Self {
            target,
            dir,
            committed: false,
            written: Vec::new(),
        })
    }

    /// The folder to write the output's files into.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes and syncs the output's file `name`; an error names the file where it would have
    /// landed (the staging folder is an implementation detail) and that nothing was replaced.
    ///
    /// # Errors
    /// [`OutputError::Io`].
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<(), OutputError> {
        super::write_synced(&self.dir.join(name), bytes).map_err(|e| self.named(name, e))?;
        self.written.push(name.to_string());
        Ok(())
    }

    /// `e`, a failure on the staged file `name`, told of the target's file instead.
    pub fn named(&self, name: &str, e: OutputError) -> OutputError {
        match e {
            OutputError::Io { op, source, .. } => OutputError::Io {
                op,
                path: format!(
                    "{} (nothing was replaced)",
                    self.target.join(name).display()
                ),
                source,
            },
            other => other,
        }
    }

    /// Puts the staged folder in the target's place in one rename. What the old target held
    /// that the staged folder does not is carried over (hard-linked, so nothing is copied),
    /// except the names `replaces` claims: files of an earlier output of the same kind that
    /// would contradict the new one (an old shard index beside new weights).
    ///
    /// A target that is more than an output (one holding folders of its own, or the working
    /// directory or a folder above it, such as `--out .`) is never swapped: its other contents
    /// are not Kiln's to move, and a process working in it must not find itself in a removed
    /// folder. There each staged file is renamed into place instead, each rename atomic: those
    /// written by path first, then those written through [`Self::write`] in their order (the
    /// adapters' config after their weights).
    ///
    /// # Errors
    /// [`OutputError::Io`]; the target is then the old folder, whole (renamed file by file,
    /// it may hold the new files renamed before the failure).
    pub fn commit(mut self, replaces: impl Fn(&str) -> bool) -> Result<(), OutputError> {
        let (parent, _) = split(&self.target)?;
        if self.target.is_dir() && shared(&self.target)? {
            return self.rename_each(&replaces);
        }
        if self.target.is_dir() {
            carry(&self.target, &self.dir, &replaces)?;
        }
        sync_folder(&self.dir)?;
        swap(&self.dir, &self.target)?;
        self.committed = true;
        sync_folder(&parent)?;
        // The old folder now lies where the staging folder was (or nowhere, if there was none).
        if self.dir.exists() {
            fs::remove_dir_all(&self.dir).map_err(|e| OutputError::io("remove", &self.dir, e))?;
        }
        Ok(())
    }

    /// Renames each staged file into the target in the order written, after removing what
    /// `replaces` claims of the old files.
    fn rename_each(mut self, replaces: &dyn Fn(&str) -> bool) -> Result<(), OutputError> {
        let read = |dir: &Path| fs::read_dir(dir).map_err(|e| OutputError::io("read", dir, e));
        // Files written into the folder by path first, by name; then those written through
        // `write`, in their order.
        let mut staged: Vec<std::ffi::OsString> = read(&self.dir)?
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .filter(|n| !self.written.iter().any(|w| n == w.as_str()))
            .collect();
        staged.sort();
        staged.extend(self.written.iter().map(Into::into));
        for entry in read(&self.target)?.filter_map(Result::ok) {
            let name = entry.file_name();
            let file = entry.file_type().is_ok_and(|t| !t.is_dir());
            if file && !staged.contains(&name) && replaces(&name.to_string_lossy()) {
                let path = entry.path();
                fs::remove_file(&path).map_err(|e| OutputError::io("remove", &path, e))?;
            }
        }
        for name in &staged {
            let from = self.dir.join(name);
            fs::rename(&from, self.target.join(name))
                .map_err(|e| OutputError::io("rename", &from, e))?;
        }
        self.committed = true;
        sync_folder(&self.target)?;
        fs::remove_dir_all(&self.dir).map_err(|e| OutputError::io("remove", &self.dir, e))
    }
}

/// Whether the folder `target` is more than an output: it holds a folder, or it is the
/// working directory or one above it.
fn shared(target: &Path) -> Result<bool, OutputError> {
    let resolved = fs::canonicalize(target).map_err(|e| OutputError::io("resolve", target, e))?;
    let cwd = std::env::current_dir()
        .ok()
        .and_then(|d| d.canonicalize().ok());
    if cwd.is_some_and(|cwd| cwd.starts_with(&resolved)) {
        return Ok(true);
    }
    let entries = fs::read_dir(target).map_err(|e| OutputError::io("read", target, e))?;
    Ok(entries
        .filter_map(Result::ok)
        .any(|e| e.file_type().is_ok_and(|t| t.is_dir())))
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The folder holding `path` and `path`'s name.
fn split(path: &Path) -> Result<(PathBuf, String), OutputError> {
    let name = path.file_name().ok_or_else(|| OutputError::Kind {
        path: path.display().to_string(),
        reason: "has no folder name; give a folder",
    })?;
    let parent = super::folder_of(path);
    Ok((parent.to_path_buf(), name.to_string_lossy().into_owned()))
}

/// Links every entry of `from` that `to` lacks and `replaces` does not claim into `to`,
/// recursively; links themselves are linked, never followed.
fn carry(from: &Path, to: &Path, replaces: &dyn Fn(&str) -> bool) -> Result<(), OutputError> {
    let entries = fs::read_dir(from).map_err(|e| OutputError::io("read", from, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| OutputError::io("read", from, e))?;
        let name = entry.file_name();
        let (source, dest) = (entry.path(), to.join(&name));
        if replaces(&name.to_string_lossy()) || dest.symlink_metadata().is_ok() {
            continue;
        }
        let kind = entry
            .file_type()
            .map_err(|e| OutputError::io("read", &source, e))?;
        if kind.is_dir() {
            fs::create_dir(&dest).map_err(|e| OutputError::io("create", &dest, e))?;
            carry(&source, &dest, &|_: &str| false)?;
        } else if fs::hard_link(&source, &dest).is_err() {
            // A file system without hard links: copy, unless it is a link, which is recreated.
            #[cfg(unix)]
            if kind.is_symlink() {
                let target =
                    fs::read_link(&source).map_err(|e| OutputError::io("read", &source, e))?;
                std::os::unix::fs::symlink(target, &dest)
                    .map_err(|e| OutputError::io("link", &dest, e))?;
                continue;
            }
            fs::copy(&source, &dest).map_err(|e| OutputError::io("copy", &source, e))?;
        }
    }
    Ok(())
}

/// Moves `staged` to `target`. On Linux an existing target is exchanged with the staged
/// folder in one atomic rename; elsewhere it is renamed aside first (a crash between the two
/// renames leaves it aside, and [`sweep`] puts it back).
fn swap(staged: &Path, target: &Path) -> Result<(), OutputError> {
    if !target.exists() {
        return fs::rename(staged, target).map_err(|e| OutputError::io("rename", staged, e));
    }
    #[cfg(target_os = "linux")]
    if exchange(staged, target).is_ok() {
        return Ok(());
    }
    let (parent, name) = split(target)?;
    let aside = parent.join(format!(".{name}.replaced-{}", std::process::id()));
    fs::rename(target, &aside).map_err(|e| OutputError::io("rename", target, e))?;
    if let Err(e) = fs::rename(staged, target) {
        let _ = fs::rename(&aside, target);
        return Err(OutputError::io("rename", staged, e));
    }
    // Where the caller looks for the old folder to remove it.
    fs::rename(&aside, staged).map_err(|e| OutputError::io("rename", &aside, e))
}

/// `renameat2(RENAME_EXCHANGE)`: both paths swap their entries atomically.
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let cstr = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (a, b) = (cstr(a)?, cstr(b)?);
    // SAFETY: both are valid NUL-terminated paths, resolved from the working directory.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Removes the staging folders an interrupted write into `target` left beside it, and puts
/// back a folder set aside and never replaced. Called by the lock's holder only: another
/// run's staging folder is never swept while it writes.
pub(super) fn sweep(target: &Path) -> Result<(), OutputError> {
    // `.` and `..` name no folder until resolved.
    let resolved = fs::canonicalize(target).unwrap_or_else(|_| target.to_path_buf());
    let target = resolved.as_path();
    let (parent, name) = split(target)?;
    if !parent.is_dir() {
        return Ok(());
    }
    let entries = fs::read_dir(&parent).map_err(|e| OutputError::io("read", &parent, e))?;
    let prefix = format!(".{name}.");
    for entry in entries.filter_map(Result::ok) {
        let file = entry.file_name();
        let Some(tag) = file.to_str().and_then(|f| f.strip_prefix(&prefix)) else {
            continue;
        };
        let path = entry.path();
        if tag.starts_with("replaced-") && !target.exists() {
            fs::rename(&path, target).map_err(|e| OutputError::io("rename", &path, e))?;
        } else if tag.starts_with(&STAGING[1..]) || tag.starts_with("replaced-") {
            fs::remove_dir_all(&path).map_err(|e| OutputError::io("remove", &path, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_folder_is_swapped_whole_and_keeps_the_users_files() {
        let root = std::env::temp_dir().join(format!("kiln-staging-{}", std::process::id()));
        let out = root.join("adapters");
        fs::create_dir_all(&out).unwrap();
        fs::write(out.join("weights"), b"old").unwrap();
        fs::write(out.join("stale-index"), b"old").unwrap();
        fs::write(out.join("README.md"), b"the user's").unwrap();
        let outside = root.join("precious");
        fs::write(&outside, b"the user's").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(&outside, out.join("config")).unwrap();

        // Dropped before commit: nothing changes.
        let staging = Staging::new(&out).unwrap();
        fs::write(staging.path().join("weights"), b"half").unwrap();
        drop(staging);
        assert_eq!(fs::read(out.join("weights")).unwrap(), b"old");

        let staging = Staging::new(&out).unwrap();
        fs::write(staging.path().join("weights"), b"new").unwrap();
        fs::write(staging.path().join("config"), b"new").unwrap();
        staging.commit(|name| name == "stale-index").unwrap();
        assert_eq!(names(&out), ["README.md", "config", "weights"]);
        assert_eq!(fs::read(out.join("weights")).unwrap(), b"new");
        assert_eq!(fs::read(out.join("config")).unwrap(), b"new");
        assert_eq!(
            fs::read(&outside).unwrap(),
            b"the user's",
            "the link was not followed"
        );
        assert_eq!(
            names(&root),
            ["adapters", "precious"],
            "no staging folder left"
        );
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn a_folder_holding_folders_is_written_file_by_file_never_moved() {
        let root = std::env::temp_dir().join(format!("kiln-staging-shared-{}", std::process::id()));
        let out = root.join("project");
        fs::create_dir_all(out.join("src")).unwrap();
        fs::write(out.join("src").join("main.rs"), b"the user's").unwrap();
        fs::write(out.join("weights"), b"old").unwrap();
        fs::write(out.join("stale-index"), b"old").unwrap();
        #[cfg(unix)]
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        #[cfg(unix)]
        let before = inode(&out);
        let mut staging = Staging::new(&out).unwrap();
        staging.write("weights", b"new").unwrap();
        staging.write("config", b"new").unwrap();
        staging.commit(|name| name == "stale-index").unwrap();
        #[cfg(unix)]
        assert_eq!(inode(&out), before, "the folder itself stays where it is");
        assert_eq!(names(&out), ["config", "src", "weights"]);
        assert_eq!(fs::read(out.join("weights")).unwrap(), b"new");
        assert_eq!(
            fs::read(out.join("src").join("main.rs")).unwrap(),
            b"the user's"
        );
        assert_eq!(names(&root), ["project"], "no staging folder left");
        fs::remove_dir_all(&root).ok();
    }
}
