//! A model folder's tokenizer: `tokenizer.json` through Hugging Face's `tokenizers` crate (the
//! same encodings the Python library gives), with what `tokenizer_config.json` adds: the special
//! tokens' texts and the chat template (or `chat_template.jinja`, where transformers 5 writes it).

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use super::{ChatTemplate, LlmConfig, LlmError, SpecialTokens};

const FILE: &str = "tokenizer.json";

/// The byte range of the text a token came from: `(start, end)`.
pub type Offsets = (usize, usize);
const CONFIG: &str = "tokenizer_config.json";
const TEMPLATE: &str = "chat_template.jinja";
const GENERATION: &str = "generation_config.json";

/// The tokenizer of a model folder, the model's end-of-sequence tokens and its chat template.
#[derive(Clone)]
pub struct LlmTokenizer {
    inner: Tokenizer,
    path: PathBuf,
    eos: Vec<u32>,
    special: SpecialTokens,
    template: Option<ChatTemplate>,
}

impl std::fmt::Debug for LlmTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmTokenizer")
            .field("path", &self.path)
            .field("vocab", &self.inner.get_vocab_size(true))
            .field("eos", &self.eos)
            .field("template", &self.template)
            .finish()
    }
}

impl LlmTokenizer {
    /// Reads `dir/tokenizer.json` for the model `config` describes, and `tokenizer_config.json`,
    /// `chat_template.jinja` and `generation_config.json` where the folder has them. The end
    /// of a sequence is `tokenizer_config.json`'s `eos_token` where it names one (an instruct
    /// model's end of turn, what TRL appends), then `config.json`'s `eos_token_id`s, then
    /// `generation_config.json`'s (where transformers' `generate` stops too).
    ///
    /// # Errors
    /// [`LlmError::Tokenizer`] for a missing or unreadable file, or a vocabulary larger than
    /// the model's embedding; [`LlmError::ChatTemplate`] for a template that does not compile.
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
        let (special, source) = match super::folder::regular_file(dir, CONFIG)? {
            Some(config_path) => read_config(&config_path)?,
            None => (SpecialTokens::default(), None),
        };
        let mut eos = config.eos_token_ids.clone();
        if let Some(id) = special
            .eos_token
            .as_deref()
            .and_then(|t| inner.token_to_id(t))
        {
            eos.retain(|&e| e != id);
            eos.insert(0, id);
        }
        if let Some(generation) = super::folder::regular_file(dir, GENERATION)? {
            for id in read_generation_eos(&generation)? {
                if !eos.contains(&id) {
                    eos.push(id);
                }
            }
        }
        let template = match super::folder::regular_file(dir, TEMPLATE)? {
            Some(file) => Some(read_template(&file, &special)?),
            None => source
                .map(|text| ChatTemplate::new(&text, &dir.join(CONFIG), special.clone()))
                .transpose()?,
        };
        Ok(Self {
            inner,
            path,
            eos,
            special,
            template,
        })
    }

    /// This tokenizer with the chat template of the file `path` in place of the folder's.
    ///
    /// # Errors
    /// [`LlmError::Io`] for a file that cannot be read; [`LlmError::ChatTemplate`] for one
    /// that does not compile.
    pub fn with_chat_template(mut self, path: &Path) -> Result<Self, LlmError> {
        self.template = Some(read_template(path, &self.special)?);
        Ok(self)
    }

    /// The chat template, when the folder (or [`Self::with_chat_template`]) gave one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// The ids of `text` with the offsets (byte ranges of `text`) each came from, special
    /// tokens written in the text encoded as themselves and none added: how transformers
    /// tokenises a rendered chat template.
    ///
    /// # Errors
    /// [`LlmError::Tokenizer`] with the library's message.
    pub fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<Offsets>), LlmError> {
        let encoding = self.inner.encode(text, false).map_err(|e| self.error(e))?;
        Ok((encoding.get_ids().to_vec(), encoding.get_offsets().to_vec()))
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

    /// The id of the token written `text`, if it is one token of the vocabulary.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    fn error(&self, e: impl std::fmt::Display) -> LlmError {
        LlmError::Tokenizer {
            path: self.path.display().to_string(),
            reason: e.to_string(),
        }
    }
}

/// The special tokens and the chat template's source of a `tokenizer_config.json`. A token is
/// a string or an object with its `content` (an `AddedToken`); the template a string, or a
/// list of named ones of which Kiln takes `default`.
/// The `eos_token_id`s of `generation_config.json`.
fn read_generation_eos(path: &Path) -> Result<Vec<u32>, LlmError> {
    let bad = |reason: String| LlmError::Config {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| LlmError::io(path, e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    super::config::token_ids(value.get("eos_token_id")).map_err(bad)
}

fn read_config(path: &Path) -> Result<(SpecialTokens, Option<String>), LlmError> {
    let bad = |reason: String| LlmError::Tokenizer {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| LlmError::io(path, e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let token = |name: &str| match value.get(name) {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Object(o)) => o
            .get("content")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string),
        _ => None,
    };
    let special = SpecialTokens {
        bos_token: token("bos_token"),
        eos_token: token("eos_token"),
        pad_token: token("pad_token"),
        unk_token: token("unk_token"),
    };
    let template = match value.get("chat_template") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Array(named)) => {
            let chosen = named
                .iter()
                .find(|t| t.get("name").and_then(serde_json::Value::as_str) == Some("default"))
                .or(named.first());
            let source = chosen
                .and_then(|t| t.get("template"))
                .and_then(serde_json::Value::as_str);
            match source {
                Some(s) => Some(s.to_string()),
                None => {
                    return Err(bad(
                        "chat_template is a list without a {\"name\", \"template\"} entry".into(),
                    ));
                }
            }
        }
        Some(_) => {
            return Err(bad(
                "chat_template is neither a string nor a list of named templates".into(),
            ));
        }
    };
    Ok((special, template))
}

/// The chat template of the Jinja file `path`.
fn read_template(path: &Path, special: &SpecialTokens) -> Result<ChatTemplate, LlmError> {
    super::folder::check_regular(path)?;
    let source = std::fs::read_to_string(path).map_err(|e| LlmError::io(path, e))?;
    ChatTemplate::new(&source, path, special.clone())
}
