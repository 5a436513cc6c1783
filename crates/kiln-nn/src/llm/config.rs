//! `config.json` of a Hugging Face LLaMA-family model, read into the sizes Kiln builds from.
//!
//! Both styles are read: transformers 4.x wrote `rope_theta` and `rope_scaling` at the top
//! level (most published checkpoints); 5.x writes them inside `rope_parameters`. Fields Kiln
//! does not need are ignored.

use std::path::Path;

use serde::Deserialize;

use super::LlmError;

/// The architectures Kiln builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelType {
    /// LLaMA 1–3.
    Llama,
    /// Mistral: LLaMA's layers, each token attending within a sliding window.
    Mistral,
    /// Qwen2 and Qwen2.5: biases on the query, key and value projections.
    Qwen2,
    /// Qwen3: an RMSNorm over each query and key head before the rotation, and a `head_dim`
    /// of its own (not `hidden / heads`).
    Qwen3,
}

impl std::fmt::Display for ModelType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModelType::Llama => "llama",
            ModelType::Mistral => "mistral",
            ModelType::Qwen2 => "qwen2",
            ModelType::Qwen3 => "qwen3",
        })
    }
}

/// How the rotary frequencies are rescaled for long contexts.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum RopeScaling {
    /// LLaMA 3's: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 {
        /// How much longer the context is than the one trained.
        factor: f64,
        /// Below this fraction of the original context, wavelengths are scaled.
        low_freq_factor: f64,
        /// Above this one they are kept.
        high_freq_factor: f64,
        /// The context the model was first trained with.
        original_max_position_embeddings: usize,
    },
}

/// The sizes of a LLaMA-family model.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LlmConfig {
    /// The architecture.
    pub model_type: ModelType,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// SwiGLU hidden width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key and value heads (grouped-query attention when fewer than the query heads).
    pub num_key_value_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm's epsilon.
    pub rms_norm_eps: f64,
    /// The rotary base.
    pub rope_theta: f64,
    /// The rotary rescaling, if any.
    pub rope_scaling: Option<RopeScaling>,
    /// The longest position the model was trained for.
    pub max_position_embeddings: usize,
    /// Whether the LM head is the embedding, transposed.
    pub tie_word_embeddings: bool,
    /// Whether the query, key and value projections have biases.
    pub qkv_bias: bool,
    /// Whether the output projection has a bias.
    pub o_bias: bool,
    /// Whether each query and key head is RMS-normalised (over `head_dim`, one gain each for
    /// queries and keys) before the rotation: Qwen3's `q_norm` and `k_norm`.
    pub qk_norm: bool,
    /// The end-of-sequence tokens (`eos_token_id`, one id or a list); empty when not given.
    pub eos_token_ids: Vec<u32>,
    /// Mistral's sliding window: each token attends to itself and the `window − 1` tokens
    /// before it, in every layer; `None` when the window covers every position.
    pub sliding_window: Option<usize>,
}

/// The largest size of each kind Kiln builds: far beyond every published model (LLaMA 3
/// 405B: width 16,384, 126 layers, 131,072 positions; Gemma's 262,144 tokens), small enough
/// that every parameter and byte count stays exact in 64 bits. A config past them is damaged
/// or hostile, and is refused before anything is allocated.
const LIMITS: [(&str, usize); 8] = [
    ("vocab_size", 1 << 22),
    ("hidden_size", 1 << 17),
    ("intermediate_size", 1 << 19),
    ("num_hidden_layers", 1 << 12),
    ("num_attention_heads", 1 << 12),
    ("num_key_value_heads", 1 << 12),
    ("head_dim", 1 << 12),
    ("max_position_embeddings", 1 << 24),
];

/// `config.json` as written, every field Kiln reads optional so that a missing one is named.
#[derive(Debug, Deserialize)]
struct Raw {
    model_type: Option<String>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    rope_parameters: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    eos_token_id: Option<serde_json::Value>,
}

impl LlmConfig {
    /// Reads `config.json` at `path`.
    ///
    /// # Errors
    /// [`LlmError`] for a file that cannot be read or parsed, a missing field, or an
    /// architecture, activation or rope scaling Kiln does not build.
    pub fn from_file(path: &Path) -> Result<Self, LlmError> {
        let text = std::fs::read_to_string(path).map_err(|e| LlmError::io(path, e))?;
        Self::from_json(&text).map_err(|e| match e {
            LlmError::Config { reason, .. } => LlmError::Config {
                path: path.display().to_string(),
                reason,
            },
            other => other,
        })
    }

    /// Reads a `config.json`'s text.
    ///
    /// # Errors
    /// As [`Self::from_file`] (the path reads `config.json`).
    pub fn from_json(text: &str) -> Result<Self, LlmError> {
        let bad = |reason: String| LlmError::Config {
            path: "config.json".to_string(),
            reason,
        };
        let raw: Raw = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let within = |name: &str, value: usize| match LIMITS.iter().find(|(n, _)| *n == name) {
            Some((_, max)) if value > *max => Err(bad(format!(
                "{name} is {value}, beyond {max}, the largest Kiln builds; the config is damaged"
            ))),
            _ => Ok(value),
        };
        let need = |name: &str, value: Option<usize>| {
            let value = value
                .filter(|&v| v > 0)
                .ok_or_else(|| bad(format!("{name} is missing or zero")))?;
            within(name, value)
        };
        let positive = |name: &str, value: f64| {
            if value.is_finite() && value > 0.0 {
                Ok(value)
            } else {
                Err(bad(format!(
                    "{name} must be a positive number, got {value}"
                )))
            }
        };
        let model_type = match raw.model_type.as_deref() {
            Some("llama") => ModelType::Llama,
            Some("mistral") => ModelType::Mistral,
            Some("qwen2") => ModelType::Qwen2,
            Some("qwen3") => ModelType::Qwen3,
            Some(other) => return Err(LlmError::Architecture(other.to_string())),
            None => return Err(bad("model_type is missing".to_string())),
        };
        if let Some(act) = raw.hidden_act.as_deref().filter(|a| *a != "silu") {
            return Err(bad(format!(
                "hidden_act '{act}' is not supported; LLaMA-family MLPs use silu"
            )));
        }
        if raw.mlp_bias == Some(true) {
            return Err(bad("mlp_bias = true is not supported".to_string()));
        }
        let heads = need("num_attention_heads", raw.num_attention_heads)?;
        let hidden_size = need("hidden_size", raw.hidden_size)?;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(bad(format!(
                "num_key_value_heads ({kv_heads}) must divide num_attention_heads ({heads})"
            )));
        }
        let kv_heads = within("num_key_value_heads", kv_heads)?;
        let head_dim = match raw.head_dim {
            Some(d) => within("head_dim", d)?,
            None if hidden_size.is_multiple_of(heads) => hidden_size / heads,
            None => {
                return Err(bad(format!(
                    "num_attention_heads ({heads}) does not divide hidden_size ({hidden_size}) and \
                     head_dim is not given"
                )));
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(bad(format!(
                "head_dim must be even and positive, got {head_dim}"
            )));
        }
        let max_position_embeddings = need(
            "max_position_embeddings",
            Some(raw.max_position_embeddings.unwrap_or(2048)),
        )?;
        if raw.sliding_window == Some(0) {
            return Err(bad("sliding_window must be positive".into()));
        }
        let sliding_window = match model_type {
            ModelType::Mistral => raw.sliding_window.filter(|&w| w < max_position_embeddings),
            // Qwen slides only from layer max_window_layers on (layer_types): not built.
            ModelType::Qwen2 | ModelType::Qwen3 if raw.use_sliding_window == Some(true) => {
                if let Some(window) = raw.sliding_window.filter(|&w| w < max_position_embeddings) {
                    return Err(LlmError::SlidingWindow {
                        model_type: model_type.to_string(),
                        window,
                        positions: max_position_embeddings,
                    });
                }
                None
            }
            _ => None,
        };
        // 5.x keeps theta and the scaling in rope_parameters; 4.x at the top level.
        let rope = raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref());
        let rope_theta = raw
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
            .and_then(serde_json::Value::as_f64)
            .or(raw.rope_theta)
            .unwrap_or(10_000.0);
        let rope_theta = positive("rope_theta", rope_theta)?;
        let rope_scaling = match rope.filter(|v| !v.is_null()) {
            Some(params) => rope_scaling(params).map_err(|e| match e {
                LlmError::Config { reason, .. } => bad(reason),
                other => other,
            })?,
            None => None,
        };
        let (qkv_bias, o_bias) = match model_type {
            ModelType::Qwen2 => (true, false),
            _ => {
                let bias = raw.attention_bias.unwrap_or(false);
                (bias, bias)
            }
        };
        let eos_token_ids = token_ids(raw.eos_token_id.as_ref()).map_err(bad)?;
        Ok(Self {
            model_type,
            vocab_size: need("vocab_size", raw.vocab_size)?,
            hidden_size,
            intermediate_size: need("intermediate_size", raw.intermediate_size)?,
            num_hidden_layers: need("num_hidden_layers", raw.num_hidden_layers)?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps: positive("rms_norm_eps", raw.rms_norm_eps.unwrap_or(1e-6))?,
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            qk_norm: model_type == ModelType::Qwen3,
            o_bias,
            eos_token_ids,
            sliding_window,
        })
    }

    /// Parameters of the model.
    pub fn parameters(&self) -> usize {
        let (d, f, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let (q, kv) = (
            self.num_attention_heads * self.head_dim,
            self.num_key_value_heads * self.head_dim,
        );
        let bias = if self.qkv_bias { q + 2 * kv } else { 0 } + if self.o_bias { d } else { 0 };
        let qk_norm = if self.qk_norm { 2 * self.head_dim } else { 0 };
        let layer = d * q + 2 * d * kv + q * d + 3 * d * f + 2 * d + bias + qk_norm;
        let head = if self.tie_word_embeddings { 0 } else { v * d };
        v * d + self.num_hidden_layers * layer + d + head
    }
}

/// The rotary scaling a `rope_scaling` / `rope_parameters` object names.
fn rope_scaling(params: &serde_json::Value) -> Result<Option<RopeScaling>, LlmError> {
    let kind = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("default");
    let number = |name: &str| {
        params
            .get(name)
            .and_then(serde_json::Value::as_f64)
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| LlmError::Config {
                path: "config.json".to_string(),
                reason: format!("rope scaling '{kind}' needs {name}, a positive number"),
            })
    };
    match kind {
        "default" => Ok(None),
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: number("factor")?,
            low_freq_factor: number("low_freq_factor")?,
            high_freq_factor: number("high_freq_factor")?,
            original_max_position_embeddings: number("original_max_position_embeddings")? as usize,
        })),
        other => Err(LlmError::RopeScaling(other.to_string())),
    }
}

/// The token ids of an `eos_token_id` field (of `config.json` or `generation_config.json`):
/// one id, a list of them, or none.
///
/// # Errors
/// A value that is not a token id or a list of them, in words for the file's message.
pub(super) fn token_ids(value: Option<&serde_json::Value>) -> Result<Vec<u32>, String> {
    let id = |v: &serde_json::Value| v.as_u64().and_then(|id| u32::try_from(id).ok());
    match value {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(ids)) => ids
            .iter()
            .map(id)
            .collect::<Option<_>>()
            .ok_or_else(|| "eos_token_id must be token ids".to_string()),
        Some(v) => id(v)
            .map(|id| vec![id])
            .ok_or_else(|| "eos_token_id must be a token id".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: &str = r#"{"model_type": "llama", "vocab_size": 96, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "some_new_field": [1, 2]"#;

    fn with(extra: &str) -> Result<LlmConfig, LlmError> {
        LlmConfig::from_json(&format!("{LLAMA}{extra}}}"))
    }

    #[test]
    fn both_rope_styles_and_unknown_fields_read() {
        let v4 = with(r#", "rope_theta": 500000.0, "rope_scaling": null"#).unwrap();
        assert_eq!((v4.rope_theta, v4.rope_scaling), (500_000.0, None));
        assert_eq!((v4.head_dim, v4.num_key_value_heads), (8, 2));
        let v5 = with(
            r#", "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}"#,
        )
        .unwrap();
        assert_eq!(v5.rope_theta, 500_000.0);
        assert!(matches!(
            v5.rope_scaling,
            Some(RopeScaling::Llama3 { factor: 8.0, .. })
        ));
    }

    #[test]
    fn unsupported_choices_are_refused_in_one_line() {
        let yarn = with(r#", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#);
        assert!(matches!(yarn, Err(LlmError::RopeScaling(k)) if k == "yarn"));
        let gpt2 = LlmConfig::from_json(r#"{"model_type": "gpt2"}"#);
        assert!(matches!(gpt2, Err(LlmError::Architecture(k)) if k == "gpt2"));
        let window = |model: &str, extra: &str| {
            LlmConfig::from_json(&format!(
                "{}{}{extra}}}",
                LLAMA.replace("llama", model),
                r#", "sliding_window": 16, "max_position_embeddings": 4096"#
            ))
        };
        assert_eq!(window("mistral", "").unwrap().sliding_window, Some(16));
        assert!(matches!(
            window("qwen2", r#", "use_sliding_window": true"#),
            Err(LlmError::SlidingWindow { window: 16, .. })
        ));
        assert_eq!(window("qwen2", "").unwrap().sliding_window, None);
        let gelu = with(r#", "hidden_act": "gelu""#).unwrap_err();
        assert!(gelu.to_string().contains("hidden_act 'gelu'"), "{gelu}");
        let missing = LlmConfig::from_json(r#"{"model_type": "llama"}"#).unwrap_err();
        assert!(missing.to_string().contains("is missing"), "{missing}");
    }
}
