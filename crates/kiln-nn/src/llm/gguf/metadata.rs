//! The model's GGUF metadata: `general.*` and the architecture's hyperparameters, under the
//! keys llama.cpp reads (`gguf-py`'s `Keys`).

use std::path::Path;

use candle_core::quantized::gguf_file::Value;

use super::GgufType;
use crate::llm::LlmConfig;

/// A metadata key and its value, in the order written.
pub(super) type Kv = Vec<(String, Value)>;

/// `general.*` and `{arch}.*` of `config`, written from the folder `dir` as `ty`.
pub(super) fn model(config: &LlmConfig, arch: &'static str, ty: GgufType, dir: &Path) -> Kv {
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into());
    let u32_of = |v: usize| Value::U32(u32::try_from(v).unwrap_or(u32::MAX));
    let key = |k: &str| format!("{arch}.{k}");
    let mut kv: Kv = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.name".into(), Value::String(name)),
        ("general.file_type".into(), Value::U32(ty.file_type())),
        // ggml's block formats as of 2023 (q8_0's layout among them).
        ("general.quantization_version".into(), Value::U32(2)),
        (key("vocab_size"), u32_of(config.vocab_size)),
        (
            key("context_length"),
            u32_of(config.max_position_embeddings),
        ),
        (key("embedding_length"), u32_of(config.hidden_size)),
        (key("block_count"), u32_of(config.num_hidden_layers)),
        (key("feed_forward_length"), u32_of(config.intermediate_size)),
        (
            key("attention.head_count"),
            u32_of(config.num_attention_heads),
        ),
        (
            key("attention.head_count_kv"),
            u32_of(config.num_key_value_heads),
        ),
        (key("attention.key_length"), u32_of(config.head_dim)),
        (key("attention.value_length"), u32_of(config.head_dim)),
        (
            key("attention.layer_norm_rms_epsilon"),
            Value::F32(config.rms_norm_eps as f32),
        ),
        (key("rope.dimension_count"), u32_of(config.head_dim)),
        (key("rope.freq_base"), Value::F32(config.rope_theta as f32)),
    ];
    if let Some(window) = config.sliding_window {
        // Read by the architectures that slide; llama.cpp's `llama` attends to every position.
        kv.push((key("attention.sliding_window"), u32_of(window)));
    }
    kv
}
