//! Models named as their users name them: a folder, or a Hugging Face Hub name (`org/name`)
//! already downloaded into the Hugging Face cache, as `from_pretrained` finds it.
//!
//! The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
//! else `~/.cache/huggingface/hub` (huggingface_hub's order). A model lies in
//! `models--org--name/snapshots/<commit>/`, the commit named by `refs/main`. Kiln reads the
//! cache and never downloads: a model not in it is refused with the command that fetches it.

use std::path::{Path, PathBuf};

use super::LlmError;

/// The model folder `model` names: itself when it is a folder (a local folder wins, as in
/// transformers), else the cached snapshot of the Hub name it spells (`org/name`, or
/// `org/name@revision` for a branch, tag or commit the cache holds).
///
/// # Errors
/// [`LlmError::Path`] when `model` is neither a folder nor a cached model, saying where the
/// cache was looked in and how to download the model.
pub fn resolve_model(model: &Path) -> Result<PathBuf, LlmError> {
    resolve_in(model, hub_cache().as_deref())
}

/// [`resolve_model`] against the cache `cache` (`None`: no cache could be located).
fn resolve_in(model: &Path, cache: Option<&Path>) -> Result<PathBuf, LlmError> {
    if model.is_dir() {
        return Ok(model.to_path_buf());
    }
    let text = model.to_string_lossy();
    let refuse = |reason: String| LlmError::Path {
        path: text.to_string(),
        reason,
    };
    let (name, revision) = text.split_once('@').unwrap_or((&text, "main"));
    let parts: Vec<&str> = name.split('/').collect();
    let hub_name = parts.len() == 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && *p != "." && *p != "..");
    // A revision is a branch, a tag or a commit: a name, never a path.
    let plain = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    let hub_name = hub_name && plain(revision) && !revision.is_empty() && !revision.contains("..");
    if !hub_name {
        return Err(refuse(
            "is not a folder; give a model folder, or a Hub name as org/name".into(),
        ));
    }
    let not_cached = |looked: String| {
        refuse(format!(
            "is neither a folder nor in the Hugging Face cache ({looked}); download it with \
             `hf download {name}`, or give its folder"
        ))
    };
    let Some(cache) = cache else {
        return Err(not_cached(
            "no cache folder: HF_HUB_CACHE, HF_HOME and HOME are unset".into(),
        ));
    };
    let repo = cache.join(format!("models--{}", name.replace('/', "--")));
    // A branch or tag names its commit in `refs/`; a commit names its snapshot itself.
    let commit = std::fs::read_to_string(repo.join("refs").join(revision))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| revision.to_string());
    let valid = !commit.is_empty() && commit.chars().all(|c| c.is_ascii_alphanumeric());
    let snapshot = repo.join("snapshots").join(&commit);
    if valid && snapshot.is_dir() {
        tracing::info!(
            "{name}: the Hugging Face cache's snapshot {}",
            snapshot.display()
        );
        return Ok(snapshot);
    }
    Err(not_cached(format!("looked in {}", repo.display())))
}

/// The Hugging Face cache folder, as huggingface_hub locates it.
fn hub_cache() -> Option<PathBuf> {
    let var = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HF_HUB_CACHE")
        .or_else(|| var("HF_HOME").map(|home| home.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface").join("hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("huggingface").join("hub")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_names_resolve_to_the_cached_snapshot_and_folders_to_themselves() {
        let cache = std::env::temp_dir().join(format!("kiln-hub-{}", std::process::id()));
        let repo = cache.join("models--HuggingFaceTB--SmolLM2-135M");
        let (main, tagged) = (repo.join("snapshots/abc123"), repo.join("snapshots/def456"));
        for dir in [&main, &tagged, &repo.join("refs")] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(repo.join("refs/main"), "abc123\n").unwrap();
        std::fs::write(repo.join("refs/v1"), "def456").unwrap();
        let resolve = |m: &str| resolve_in(Path::new(m), Some(&cache));
        assert_eq!(resolve("HuggingFaceTB/SmolLM2-135M").unwrap(), main);
        assert_eq!(resolve("HuggingFaceTB/SmolLM2-135M@v1").unwrap(), tagged);
        assert_eq!(
            resolve("HuggingFaceTB/SmolLM2-135M@def456").unwrap(),
            tagged
        );
        // A folder is itself, whatever the cache holds.
        assert_eq!(resolve(main.to_str().unwrap()).unwrap(), main);
        let missing = resolve("meta-llama/Llama-3.2-1B").unwrap_err().to_string();
        assert!(
            missing.contains("hf download meta-llama/Llama-3.2-1B"),
            "{missing}"
        );
        for bad in [
            "HuggingFaceTB/SmolLM2-135M@../../x",
            "../x",
            "a/b/c",
            "nothing",
        ] {
            assert!(resolve(bad).is_err(), "{bad}");
        }
        assert!(
            resolve_in(Path::new("a/b"), None)
                .unwrap_err()
                .to_string()
                .contains("unset")
        );
        std::fs::remove_dir_all(&cache).ok();
    }
}
