//! The files of a Hugging Face model folder, checked before a byte of them is used: every
//! path a file names stays inside the folder, and every file read is a regular file.
//!
//! A folder is untrusted input (a download, a shared disk): a sharded index naming
//! `../../x.safetensors` or an absolute path would otherwise be opened, and a FIFO read
//! would block forever.

use std::path::{Component, Path, PathBuf};

use super::LlmError;

/// The single weight file.
pub(crate) const SINGLE: &str = "model.safetensors";
/// The sharded checkpoint's index.
pub(crate) const INDEX: &str = "model.safetensors.index.json";

/// `dir/name` when it exists, checked to be a regular file inside `dir`; `None` when there is
/// nothing at that path.
///
/// Links are followed only where they stay in the folder, or, for a snapshot of the Hugging
/// Face cache (`…/snapshots/<revision>/`), into that cache's `blobs/`, where every cached file
/// lives.
///
/// # Errors
/// [`LlmError::Path`] for a name that leaves the folder, a link out of it, or anything but a
/// regular file (a folder, a FIFO, a device).
pub(crate) fn regular_file(dir: &Path, name: &str) -> Result<Option<PathBuf>, LlmError> {
    let refuse = |path: &Path, reason: String| LlmError::Path {
        path: path.display().to_string(),
        reason,
    };
    let relative = Path::new(name);
    let inside = relative
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !inside || relative.as_os_str().is_empty() {
        return Err(refuse(
            &dir.join(INDEX),
            format!(
                "names the file '{name}', which is not inside the model folder; a shard must \
                 be a plain file name of the folder"
            ),
        ));
    }
    let path = dir.join(relative);
    if path.symlink_metadata().is_err() {
        return Ok(None);
    }
    let resolved = path
        .canonicalize()
        .map_err(|e| refuse(&path, format!("cannot be resolved: {e}")))?;
    let roots = allowed_roots(dir)?;
    if !roots.iter().any(|root| resolved.starts_with(root)) {
        return Err(refuse(
            &path,
            format!(
                "links to {}, outside the model folder; copy the file into the folder",
                resolved.display()
            ),
        ));
    }
    check_regular(&path)?;
    Ok(Some(path))
}

/// Where the files of `dir` may resolve to: the folder itself, and the cache's `blobs/` when
/// `dir` is a snapshot of the Hugging Face cache.
fn allowed_roots(dir: &Path) -> Result<Vec<PathBuf>, LlmError> {
    let dir = dir.canonicalize().map_err(|e| LlmError::Path {
        path: dir.display().to_string(),
        reason: format!("cannot be resolved: {e}"),
    })?;
    let mut roots = vec![dir.clone()];
    let snapshots = dir.parent();
    if let Some(repo) = snapshots
        .filter(|s| s.file_name().is_some_and(|n| n == "snapshots"))
        .and_then(Path::parent)
    {
        roots.push(repo.join("blobs"));
    }
    Ok(roots)
}

/// Checks that `path`, a file the user named, is a regular file (a FIFO would block the read
/// forever, a folder fail with the system's bare message).
///
/// # Errors
/// [`LlmError::Path`] saying what it is instead.
pub(crate) fn check_regular(path: &Path) -> Result<(), LlmError> {
    let meta = path.metadata().map_err(|e| LlmError::io(path, e))?;
    if meta.is_file() {
        return Ok(());
    }
    Err(LlmError::Path {
        path: path.display().to_string(),
        reason: format!("is {}, not a regular file", kind(&meta)),
    })
}

/// What a file system entry is, for a message.
fn kind(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_block_device() || t.is_char_device() {
            return "a device";
        }
    }
    if meta.is_dir() {
        "a folder"
    } else {
        "not a file"
    }
}

/// Every file of the model folder `dir` that a run reads, by its name in the folder:
/// `config.json`, the tokenizer's files and the chat template (when present), the index (when
/// sharded) and the weights.
/// What a checkpoint records so that a resume can tell the base model has not changed.
///
/// # Errors
/// As [`weight_files`].
pub fn model_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, LlmError> {
    let mut files = Vec::new();
    for name in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        INDEX,
    ] {
        if let Some(path) = regular_file(dir, name)? {
            files.push((name.to_string(), path));
        }
    }
    for path in weight_files(dir)? {
        let name = path
            .strip_prefix(dir)
            .unwrap_or(&path)
            .display()
            .to_string();
        files.push((name, path));
    }
    Ok(files)
}

/// The safetensors files of `dir`: the shards its index names, or its single file.
///
/// # Errors
/// [`LlmError::NoWeights`], an index that cannot be read, a shard missing, outside the folder
/// or not a regular file.
pub(crate) fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, LlmError> {
    if let Some(index) = regular_file(dir, INDEX)? {
        let io = |e: &dyn std::fmt::Display| LlmError::io(&index, e);
        let text = std::fs::read_to_string(&index).map_err(|e| io(&e))?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| io(&e))?;
        let map = json
            .get("weight_map")
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| io(&"no weight_map object"))?;
        let mut shards = std::collections::BTreeSet::new();
        for (tensor, shard) in map {
            let shard = shard
                .as_str()
                .ok_or_else(|| io(&format!("the shard of {tensor} is not a file name")))?;
            shards.insert(shard);
        }
        if shards.is_empty() {
            return Err(io(&"weight_map names no shard"));
        }
        return shards
            .into_iter()
            .map(|shard| {
                regular_file(dir, shard)?.ok_or_else(|| LlmError::Io {
                    path: dir.join(shard).display().to_string(),
                    reason: format!("a shard {INDEX} names is missing"),
                })
            })
            .collect();
    }
    match regular_file(dir, SINGLE)? {
        Some(single) => Ok(vec![single]),
        None => Err(LlmError::NoWeights {
            dir: dir.display().to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_stay_inside_the_folder() {
        let root = std::env::temp_dir().join(format!("kiln-model-folder-{}", std::process::id()));
        let dir = root.join("model");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(root.join("outside.safetensors"), b"").unwrap();
        std::fs::write(dir.join("inside.safetensors"), b"").unwrap();
        for name in [
            "../outside.safetensors",
            "/etc/passwd",
            "",
            "a/../../outside.safetensors",
        ] {
            let err = regular_file(&dir, name).unwrap_err();
            assert!(
                err.to_string().contains("not inside the model folder"),
                "{name}: {err}"
            );
        }
        assert!(regular_file(&dir, "inside.safetensors").unwrap().is_some());
        assert!(regular_file(&dir, "absent.safetensors").unwrap().is_none());
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(
                root.join("outside.safetensors"),
                dir.join("link.safetensors"),
            )
            .unwrap();
            let err = regular_file(&dir, "link.safetensors").unwrap_err();
            assert!(
                err.to_string().contains("outside the model folder"),
                "{err}"
            );
            std::fs::create_dir(dir.join("sub.safetensors")).unwrap();
            let err = regular_file(&dir, "sub.safetensors").unwrap_err();
            assert!(err.to_string().contains("is a folder"), "{err}");
        }
        std::fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn a_cache_snapshot_reads_its_blobs() {
        let root = std::env::temp_dir().join(format!("kiln-hf-cache-{}", std::process::id()));
        let repo = root.join("models--org--name");
        let snapshot = repo.join("snapshots").join("abc123");
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(repo.join("blobs").join("f00d"), b"").unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("../../blobs/f00d", snapshot.join(SINGLE)).unwrap();
            assert!(regular_file(&snapshot, SINGLE).unwrap().is_some());
        }
        std::fs::remove_dir_all(&root).ok();
    }
}
