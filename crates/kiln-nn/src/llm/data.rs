//! Fine-tuning data: a JSONL file of `{"prompt": .., "response": ..}` or `{"text": ..}` lines,
//! tokenised into fixed-length sequences whose loss covers the response tokens only.

use std::path::Path;

use super::{LlmError, LlmTokenizer, LmItem};

/// One line of a data file.
#[derive(Debug, Clone, PartialEq)]
pub enum Example {
    /// An instruction and its answer: only the answer (and the end token) is trained.
    Chat {
        /// What the model is given.
        prompt: String,
        /// What it should answer.
        response: String,
    },
    /// Plain text: every token is trained.
    Text(String),
}

/// How examples become sequences of `seq_len + 1` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Packing {
    /// One example per sequence, padded (pads are never trained); a longer example's end is
    /// cut, and one whose prompt alone fills the sequence is refused.
    #[default]
    Pad,
    /// Examples concatenated and cut into full sequences (an example may span two, and a
    /// sequence attend across examples, as TRL's packing does): no padding computed.
    Pack,
}

/// The sequences of a data file.
#[derive(Debug, Clone)]
pub struct Tokenized {
    /// The sequences.
    pub items: Vec<LmItem>,
    /// Examples whose end was cut to fit ([`Packing::Pad`]).
    pub truncated: usize,
    /// Tokens that count in the loss, over all sequences.
    pub trained_tokens: usize,
}

/// Reads every example of the JSONL file `path` (blank lines skipped).
///
/// # Errors
/// [`LlmError::Io`] when the file cannot be read; [`LlmError::Data`] naming the line that is
/// not JSON, or not an object with string fields `prompt` and `response`, or `text`.
pub fn read_jsonl(path: &Path) -> Result<Vec<Example>, LlmError> {
    super::folder::check_regular(path)?;
    let bytes = std::fs::read(path).map_err(|e| LlmError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    // Editors on Windows start UTF-8 files with a byte-order mark; it is not part of the data.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let mut examples = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let bad = |reason: String| LlmError::Data {
            path: path.display().to_string(),
            line: i + 1,
            reason,
        };
        let line = std::str::from_utf8(line).map_err(|e| {
            bad(format!(
                "is not UTF-8 text (an invalid byte at column {}); save the file as UTF-8",
                e.valid_up_to() + 1
            ))
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let field = |name: &str| value.get(name).and_then(serde_json::Value::as_str);
        let example = match (field("prompt"), field("response"), field("text")) {
            (_, Some(""), None) | (None, None, Some("")) => {
                return Err(bad(
                    "the example is empty: it would train nothing but an end token".into(),
                ));
            }
            (Some(prompt), Some(response), None) => Example::Chat {
                prompt: prompt.to_string(),
                response: response.to_string(),
            },
            (None, None, Some(text)) => Example::Text(text.to_string()),
            _ => {
                return Err(bad(
                    "expected an object with string fields \"prompt\" and \"response\", or \
                     \"text\""
                        .into(),
                ));
            }
        };
        examples.push(example);
    }
    if examples.is_empty() {
        return Err(LlmError::Path {
            path: path.display().to_string(),
            reason: "holds no example; give one JSON object per line, such as \
                     {\"prompt\": \"...\", \"response\": \"...\"}"
                .into(),
        });
    }
    Ok(examples)
}

/// Tokenises `examples` into sequences of `seq_len + 1` tokens. Chat examples are
/// `<s> prompt response </s>` with the response and the end token trained; text examples
/// train every token. `path` names the file in errors.
///
/// # Errors
/// [`LlmError::Data`] for an example whose prompt leaves no room for its response within
/// `seq_len` (with [`Packing::Pad`]); [`LlmError::Tokenizer`] from the tokenizer.
pub fn tokenize(
    examples: &[Example],
    tokenizer: &LlmTokenizer,
    seq_len: usize,
    packing: Packing,
    path: &Path,
) -> Result<Tokenized, LlmError> {
    let mut streams = Vec::with_capacity(examples.len());
    for example in examples {
        // Each token with whether it is a target the loss counts.
        let mut stream: Vec<(u32, bool)> = Vec::new();
        match example {
            Example::Chat { prompt, response } => {
                stream.extend(
                    tokenizer
                        .encode(prompt, true)?
                        .into_iter()
                        .map(|t| (t, false)),
                );
                stream.extend(
                    tokenizer
                        .encode(response, false)?
                        .into_iter()
                        .map(|t| (t, true)),
                );
                stream.extend(tokenizer.eos().map(|t| (t, true)));
            }
            Example::Text(text) => {
                let ids = tokenizer.encode(text, true)?;
                stream.extend(ids.into_iter().map(|t| (t, true)));
                stream.extend(tokenizer.eos().map(|t| (t, true)));
            }
        }
        // An example's first token (`<s>`) is never a target, not even after the example
        // before it in a packed sequence.
        if let Some(first) = stream.first_mut() {
            first.1 = false;
        }
        streams.push(stream);
    }
    let pad = tokenizer.eos().unwrap_or(0);
    let mut out = Tokenized {
        items: Vec::new(),
        truncated: 0,
        trained_tokens: 0,
    };
    match packing {
        Packing::Pad => {
            for (line, mut stream) in streams.into_iter().enumerate() {
                // A target at position i is token i + 1: the first trained token must be at
                // most at index seq_len.
                let first = stream.iter().position(|&(_, trained)| trained);
                if first.is_some_and(|f| f > seq_len) {
                    return Err(LlmError::Data {
                        path: path.display().to_string(),
                        line: line + 1,
                        reason: format!(
                            "the prompt is {} tokens, which leaves no room for the response \
                             within --seq-len {seq_len}; raise --seq-len or shorten the prompt",
                            first.unwrap_or(0)
                        ),
                    });
                }
                if stream.len() > seq_len + 1 {
                    stream.truncate(seq_len + 1);
                    out.truncated += 1;
                }
                stream.resize(seq_len + 1, (pad, false));
                out.items.push(LmItem::from_stream(&stream));
            }
        }
        Packing::Pack => {
            let all: Vec<(u32, bool)> = streams.into_iter().flatten().collect();
            // Windows overlap by one token: the last input's target is the next window's
            // first input.
            let mut start = 0;
            while start + 1 < all.len() {
                let mut window = all[start..(start + seq_len + 1).min(all.len())].to_vec();
                window.resize(seq_len + 1, (pad, false));
                out.items.push(LmItem::from_stream(&window));
                start += seq_len;
            }
        }
    }
    out.trained_tokens = out
        .items
        .iter()
        .map(|item| item.trained.iter().filter(|&&t| t).count())
        .sum();
    Ok(out)
}
