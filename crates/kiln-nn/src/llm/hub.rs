//! Models named as their users name them: a folder, or a Hugging Face Hub name (`org/name`)
//! in the Hugging Face cache, as `from_pretrained` finds it, downloaded into the cache first
//! when the user allows it.
//!
//! The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
//! else `~/.cache/huggingface/hub` (huggingface_hub's order). A model lies in
//! `models--org--name/snapshots/<commit>/`, the commit named by `refs/main`. A download goes
//! through `hf-hub` (Hugging Face's own client) from `$HF_ENDPOINT` (default
//! `https://huggingface.co`), with `$HF_TOKEN` or the cache's `token` file, into the same
//! layout, so the next run finds it offline.

use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use super::LlmError;

/// Whether [`resolve_model`] may download a model the cache lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fetch {
    /// Read the cache only (the default: no network unless the user asks).
    #[default]
    CacheOnly,
    /// Download what the cache lacks from the Hub.
    Download,
}

/// The model folder `model` names: itself when it is a folder (a local folder wins, as in
/// transformers), else the cached snapshot of the Hub name it spells (`org/name`, or
/// `org/name@revision` for a branch, tag or commit), downloaded first if the cache lacks it
/// and `fetch` allows it.
///
/// # Errors
/// [`LlmError::Path`] when `model` is neither a folder nor a Hub name, when the cache lacks it
/// and downloads are not allowed (saying where the cache was looked in and how to download
/// it), or when the download fails.
pub fn resolve_model(model: &Path, fetch: Fetch) -> Result<PathBuf, LlmError> {
    let cache = hub_cache();
    match (resolve_in(model, cache.as_deref()), fetch) {
        // Not a Hub name: `model_name` gives the same refusal `resolve_in` did.
        (Err(LlmError::Path { .. }), Fetch::Download) => {
            let (name, revision) = model_name(model)?;
            let cache = cache.ok_or_else(|| refuse(model, NO_CACHE.into()))?;
            download(&endpoint(), &cache, &name, &revision)
        }
        (resolved, _) => resolved,
    }
}

const NO_CACHE: &str = "no cache folder: HF_HUB_CACHE, HF_HOME and HOME are unset";

fn refuse(model: &Path, reason: String) -> LlmError {
    LlmError::Path {
        path: model.to_string_lossy().to_string(),
        reason,
    }
}

/// The Hub name and revision `model` spells (`org/name[@revision]`, `main` by default).
fn model_name(model: &Path) -> Result<(String, String), LlmError> {
    let text = model.to_string_lossy();
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
    if hub_name && plain(revision) && !revision.is_empty() && !revision.contains("..") {
        Ok((name.to_string(), revision.to_string()))
    } else {
        Err(refuse(
            model,
            "is not a folder; give a model folder, or a Hub name as org/name".into(),
        ))
    }
}

/// [`resolve_model`] against the cache `cache` (`None`: no cache could be located), offline.
fn resolve_in(model: &Path, cache: Option<&Path>) -> Result<PathBuf, LlmError> {
    if model.is_dir() {
        return Ok(model.to_path_buf());
    }
    let (name, revision) = model_name(model)?;
    let not_cached = |looked: String| {
        refuse(
            model,
            format!(
                "is neither a folder nor in the Hugging Face cache ({looked}); download it with \
                 --download (or `hf download {name}`), or give its folder"
            ),
        )
    };
    let Some(cache) = cache else {
        return Err(not_cached(NO_CACHE.into()));
    };
    let repo = cache.join(format!("models--{}", name.replace('/', "--")));
    // A branch or tag names its commit in `refs/`; a commit names its snapshot itself.
    let commit = std::fs::read_to_string(repo.join("refs").join(&revision))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| revision.clone());
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

/// The Hub's address: `$HF_ENDPOINT`, else huggingface.co.
fn endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "https://huggingface.co".to_string())
        .trim_end_matches('/')
        .to_string()
}

/// Whether a file of a model repository is one Kiln reads: the configs, tokenizer and chat
/// template files and the safetensors weights at its top level (not `*.bin`, `*.gguf`,
/// `onnx/`, `original/` and the like, which other libraries read).
fn wanted(file: &str) -> bool {
    !file.contains('/')
        && [".json", ".safetensors", ".jinja", ".txt", "tokenizer.model"]
            .iter()
            .any(|end| file.ends_with(end))
}

/// Downloads `name` at `revision` from `endpoint` into `cache`, as huggingface_hub lays it out;
/// returns its snapshot folder.
fn download(endpoint: &str, cache: &Path, name: &str, revision: &str) -> Result<PathBuf, LlmError> {
    let fail = |what: String| LlmError::Path {
        path: format!("{name}@{revision}"),
        reason: format!("could not be downloaded from {endpoint}: {what}"),
    };
    let cache = Cache::new(cache.to_path_buf());
    let token = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| cache.token());
    let api = ApiBuilder::from_cache(cache)
        .with_endpoint(endpoint.to_string())
        .with_token(token)
        .with_progress(true)
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let repo = api.repo(Repo::with_revision(
        name.to_string(),
        RepoType::Model,
        revision.to_string(),
    ));
    let info = repo.info().map_err(|e| fail(e.to_string()))?;
    let files: Vec<&str> = info
        .siblings
        .iter()
        .map(|s| s.rfilename.as_str())
        .filter(|f| wanted(f))
        .collect();
    if !files.contains(&"config.json") || !files.iter().any(|f| f.ends_with(".safetensors")) {
        return Err(fail(
            "the repository has no config.json and safetensors weights at its top level, \
             which Kiln reads"
                .into(),
        ));
    }
    tracing::info!(
        "{name}@{revision}: downloading {} files from {endpoint} (commit {})",
        files.len(),
        info.sha
    );
    let mut snapshot = None;
    for file in files {
        let path = repo.get(file).map_err(|e| fail(format!("{file}: {e}")))?;
        snapshot = path.parent().map(Path::to_path_buf);
    }
    snapshot.ok_or_else(|| fail("nothing was downloaded".into()))
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
            missing.contains("--download (or `hf download meta-llama/Llama-3.2-1B`)"),
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
