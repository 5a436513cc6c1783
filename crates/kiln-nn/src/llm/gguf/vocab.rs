//! The tokenizer's GGUF metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`) from
//! `tokenizer.json` and `tokenizer_config.json`, as `gguf-py`'s vocabularies write it.
//!
//! Two tokenizers of Hugging Face's BPE model are written, the two llama.cpp runs:
//! - byte-level BPE (LLaMA 3, Qwen, SmolLM, GPT-2): `gpt2`, with the merges in rank order and
//!   `pre`, the pre-tokeniser llama.cpp splits text with, where the tokenizer's split pattern is
//!   one llama.cpp names (`llama-bpe`, `qwen2`), `default` otherwise;
//! - SentencePiece's BPE converted to `tokenizer.json` (LLaMA 2, Mistral): `llama`, with a
//!   score per token. SentencePiece scores a BPE piece by the negative of its rank, and the
//!   conversion numbers pieces in that rank, so the score of token `i` is `−i`.
//!
//! Token types: special added tokens are control tokens, other added tokens user-defined,
//! SentencePiece's `<0xXX>` byte tokens bytes; ids past the tokenizer up to the embedding's
//! rows are `[PADi]`, unused, as `convert_hf_to_gguf.py` pads them.

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use serde_json::Value as Json;

use super::metadata::Kv;
use crate::llm::{LlmConfig, LlmError, LlmTokenizer, folder::regular_file};

/// llama.cpp's token types (`llama_token_type`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

/// The split patterns of the pre-tokenisers llama.cpp names (`llama-vocab.cpp`).
const PRE_TOKENIZERS: [(&str, &str); 2] = [
    (
        "llama-bpe",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    (
        "qwen2",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
];

/// Appends the tokenizer of the folder `dir` to `kv`; returns the tokens written.
pub(super) fn tokenizer(dir: &Path, config: &LlmConfig, kv: &mut Kv) -> Result<usize, LlmError> {
    let path = dir.join("tokenizer.json");
    let bad = |reason: String| LlmError::Export {
        format: "GGUF",
        what: path.display().to_string(),
        reason,
    };
    // Read as the tokenizers library reads it first: a broken file gets its error.
    let tokenizer = LlmTokenizer::from_dir(dir, config)?;
    let json: Json = read_json(&path)?;
    let model = &json["model"];
    if model["type"] != "BPE" {
        return Err(bad(format!(
            "its model is {}; GGUF's tokenizers here are BPE (byte-level or SentencePiece's)",
            model["type"]
        )));
    }
    let mut tokens: Vec<Option<(String, i32)>> = vec![None; config.vocab_size];
    let mut place = |id: u64, text: &str, kind: i32| -> Result<(), LlmError> {
        let slot = usize::try_from(id)
            .ok()
            .and_then(|id| tokens.get_mut(id))
            .ok_or_else(|| bad(format!("token {text:?} has id {id}, past the vocabulary")))?;
        *slot = Some((text.to_string(), kind));
        Ok(())
    };
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| bad("model.vocab is not an object".into()))?;
    let byte_level =
        mentions(&json["pre_tokenizer"], "ByteLevel") || mentions(&json["decoder"], "ByteLevel");
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| bad(format!("token {text:?} has no integer id")))?;
        let byte = !byte_level && text.len() == 6 && text.starts_with("<0x") && text.ends_with('>');
        place(id, text, if byte { BYTE } else { NORMAL })?;
    }
    for added in json["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(text)) = (added["id"].as_u64(), added["content"].as_str()) else {
            return Err(bad("an added token has no id or content".into()));
        };
        let kind = if added["special"] == true {
            CONTROL
        } else {
            USER_DEFINED
        };
        place(id, text, kind)?;
    }
    let (texts, kinds): (Vec<Value>, Vec<Value>) = tokens
        .into_iter()
        .enumerate()
        .map(|(id, token)| {
            let (text, kind) = token.unwrap_or_else(|| (format!("[PAD{id}]"), UNUSED));
            (Value::String(text), Value::I32(kind))
        })
        .unzip();
    let count = texts.len();
    let u32_id = |id: u64| Value::U32(u32::try_from(id).unwrap_or(u32::MAX));
    if byte_level {
        kv.push(("tokenizer.ggml.model".into(), Value::String("gpt2".into())));
        let pre = split_pattern(&json["pre_tokenizer"])
            .and_then(|pattern| PRE_TOKENIZERS.iter().find(|(_, p)| *p == pattern))
            .map_or("default", |(name, _)| name);
        kv.push(("tokenizer.ggml.pre".into(), Value::String(pre.into())));
    } else {
        kv.push(("tokenizer.ggml.model".into(), Value::String("llama".into())));
        kv.push(("tokenizer.ggml.pre".into(), Value::String("default".into())));
    }
    kv.push(("tokenizer.ggml.tokens".into(), Value::Array(texts)));
    if !byte_level {
        let scores = (0..count).map(|id| Value::F32(-(id as f32))).collect();
        kv.push(("tokenizer.ggml.scores".into(), Value::Array(scores)));
    }
    kv.push(("tokenizer.ggml.token_type".into(), Value::Array(kinds)));
    let merges = merges(&model["merges"]).map_err(bad)?;
    if !merges.is_empty() {
        kv.push(("tokenizer.ggml.merges".into(), Value::Array(merges)));
    }
    let settings = match regular_file(dir, "tokenizer_config.json")? {
        Some(file) => read_json(&file)?,
        None => Json::Null,
    };
    let special = |key: &str| {
        let value = &settings[key];
        value
            .as_str()
            .or_else(|| value["content"].as_str())
            .and_then(|text| tokenizer.token_id(text))
            .map(u64::from)
    };
    // tokenizer_config.json's, else config.json's id (as gguf-py's SpecialVocab reads them).
    let model_config = match regular_file(dir, "config.json")? {
        Some(file) => read_json(&file)?,
        None => Json::Null,
    };
    let bos = special("bos_token").or_else(|| model_config["bos_token_id"].as_u64());
    // The end a generation stops at: an instruct model's end of turn.
    let eos = tokenizer
        .eos()
        .map(u64::from)
        .or_else(|| special("eos_token"));
    for (key, id) in [
        ("bos_token_id", bos),
        ("eos_token_id", eos),
        ("unknown_token_id", special("unk_token")),
        ("padding_token_id", special("pad_token")),
    ] {
        if let Some(id) = id {
            kv.push((format!("tokenizer.ggml.{key}"), u32_id(id)));
        }
    }
    // Whether encoding adds BOS, as the tokenizer does it (its post-processor).
    let adds_bos = match bos {
        Some(bos) => tokenizer.encode("a", true)?.first() == Some(&(bos as u32)),
        None => false,
    };
    kv.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(adds_bos)));
    kv.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(false)));
    if let Some(template) = chat_template(dir, &settings)? {
        kv.push(("tokenizer.chat_template".into(), Value::String(template)));
    }
    Ok(count)
}

/// The JSON of `path`.
fn read_json(path: &Path) -> Result<Json, LlmError> {
    let text = std::fs::read_to_string(path).map_err(|e| LlmError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| LlmError::Tokenizer {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// Whether `json` (a pre-tokenizer or decoder, possibly a sequence) is or holds one of `kind`.
fn mentions(json: &Json, kind: &str) -> bool {
    json["type"] == kind
        || ["pretokenizers", "decoders"]
            .iter()
            .flat_map(|key| json[key].as_array().into_iter().flatten())
            .any(|inner| mentions(inner, kind))
}

/// The regular expression of a byte-level tokenizer's `Split` pre-tokenizer, if it has one.
fn split_pattern(json: &Json) -> Option<&str> {
    if json["type"] == "Split" {
        return json["pattern"]["Regex"].as_str();
    }
    json["pretokenizers"]
        .as_array()?
        .iter()
        .find_map(split_pattern)
}

/// The merges as `"left right"` strings, from either of tokenizer.json's forms (strings, or
/// pairs since tokenizers 0.20).
fn merges(json: &Json) -> Result<Vec<Value>, String> {
    json.as_array()
        .into_iter()
        .flatten()
        .map(|merge| match merge {
            Json::String(s) => Ok(Value::String(s.clone())),
            Json::Array(pair) => match (pair.first(), pair.get(1)) {
                (Some(Json::String(a)), Some(Json::String(b))) if pair.len() == 2 => {
                    Ok(Value::String(format!("{a} {b}")))
                }
                _ => Err(format!("the merge {merge} is not a pair of strings")),
            },
            other => Err(format!("the merge {other} is not a pair of strings")),
        })
        .collect()
}

/// The chat template: `chat_template.jinja` beside the config (transformers 5), else
/// `tokenizer_config.json`'s `chat_template` (a string, or the `default` of named ones).
fn chat_template(dir: &Path, settings: &Json) -> Result<Option<String>, LlmError> {
    if let Some(file) = regular_file(dir, "chat_template.jinja")? {
        return std::fs::read_to_string(&file)
            .map(Some)
            .map_err(|e| LlmError::io(&file, e));
    }
    let template = &settings["chat_template"];
    Ok(template.as_str().map(str::to_string).or_else(|| {
        template.as_array()?.iter().find_map(|named| {
            (named["name"] == "default").then(|| named["template"].as_str().map(str::to_string))?
        })
    }))
}
