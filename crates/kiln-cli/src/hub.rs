//! `--model` by Hub name: whether this run may download what the Hugging Face cache lacks
//! (`kiln --download`, any command), decided once when the command line is read.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kiln_nn::llm::{Fetch, LlmError};

static FETCH: OnceLock<Fetch> = OnceLock::new();

/// Records this run's choice; the first call wins.
pub fn allow_downloads(allowed: bool) {
    let fetch = match allowed {
        true => Fetch::Download,
        false => Fetch::CacheOnly,
    };
    FETCH.get_or_init(|| fetch);
}

/// The folder `model` names (a folder, or a Hub name in the cache, downloaded first when this
/// run allows it): [`kiln_nn::llm::resolve_model`] with this run's choice.
///
/// # Errors
/// [`LlmError::Path`] as `resolve_model` says.
pub fn resolve(model: &Path) -> Result<PathBuf, LlmError> {
    kiln_nn::llm::resolve_model(model, FETCH.get().copied().unwrap_or_default())
}
