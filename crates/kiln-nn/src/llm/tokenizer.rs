//! A model folder's `tokenizer.json`, through Hugging Face's `tokenizers` crate: the same
//! encodings the Python library gives.

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use super::{LlmConfig, LlmError};

const FILE: &str = "tokenizer.json";

/// The tokenizer of a model folder and the model's end-of-sequence tokens.
#[derive(Clone)]
pub struct LlmTokenizer {
    inner: Tokenizer,
    path: PathBuf,
    eos: Vec<u32>,
}

impl std::fmt::Debug for LlmTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmTokenizer")
            .field("path", &self.path)
            .field("vocab", &self.inner.get_vocab_size(true))
            .field("eos", &self.eos)
            .finish()
    }
}

impl LlmTokenizer {
    /// Reads `dir/tokenizer.json` for the model `config` describes.
    ///
    /// # Errors
    /// [`LlmError::Tokenizer`] for a missing or unreadable file, or a vocabulary larger than
    /// the model's embedding.
    pub fn from_dir(dir: &Path, config: &LlmConfig) -> Result<Self, LlmError> {
        let path = dir.join(FILE);
        let bad = |reason: String| LlmError::Tokenizer {
            path: path.display().to_string(),
            reason,
        };
        if super::folder::regular_file(dir, FILE)?.is_none() {
            return Err(bad(
                "not found; the model folder needs its tokenizer.json (Hugging Face's fast \
                 tokenizer file)"
                    .into(),
            ));
        }
        let inner = Tokenizer::from_file(&path).map_err(|e| bad(e.to_string()))?;
        let vocab = inner.get_vocab_size(true);
        if vocab > config.vocab_size {
            return Err(bad(format!(
                "holds {vocab} tokens but the model embeds only {}",
                config.vocab_size
            )));
        }
        Ok(Self {
            inner,
            path,
            eos: config.eos_token_ids.clone(),
        })
    }

    /// The ids of `text`; `special` adds what the tokenizer's post-processor adds (LLaMA's
    /// `<s>`), as `add_special_tokens=True` does in Python.
    ///
    /// # Errors
    /// [`LlmError::Tokenizer`] with the library's message.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, LlmError> {
        self.inner
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| self.error(e))
    }

    /// The text of `ids`, special tokens skipped.
    ///
    /// # Errors
    /// [`LlmError::Tokenizer`] with the library's message.
    pub fn decode(&self, ids: &[u32]) -> Result<String, LlmError> {
        self.inner.decode(ids, true).map_err(|e| self.error(e))
    }

    /// The token that ends a response, appended to every trained response so that the model
    /// learns to stop; `None` when the config names none.
    pub fn eos(&self) -> Option<u32> {
        self.eos.first().copied()
    }

    /// Whether `id` ends a sequence.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }

    fn error(&self, e: impl std::fmt::Display) -> LlmError {
        LlmError::Tokenizer {
            path: self.path.display().to_string(),
            reason: e.to_string(),
        }
    }
}
