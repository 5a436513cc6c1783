//! llama.cpp's names: the architecture a config is written as, and each Hugging Face tensor's
//! GGUF name (`gguf-py`'s `TensorNameMap`).

use crate::llm::{LlmConfig, ModelType};

/// llama.cpp's architecture for `config`: Mistral is LLaMA's (`convert_hf_to_gguf.py` writes
/// `MistralForCausalLM` as `llama`).
pub(super) fn architecture(config: &LlmConfig) -> &'static str {
    match config.model_type {
        ModelType::Llama | ModelType::Mistral => "llama",
        ModelType::Qwen2 => "qwen2",
        ModelType::Qwen3 => "qwen3",
    }
}

/// Whether llama.cpp's architecture rotates the query and key heads in GPT-J's interleaved
/// layout, so that their rows are permuted from Hugging Face's half-split one
/// ([`permute_rows`]): `llama` does; `qwen2` and `qwen3` rotate as Hugging Face does (NeoX).
pub(super) fn interleaved_rope(arch: &str) -> bool {
    arch == "llama"
}

/// The GGUF name of the Hugging Face tensor `name`, or `None` for one llama.cpp has no name for.
pub(super) fn gguf_name(name: &str) -> Option<String> {
    let fixed = match name {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(fixed) = fixed {
        return Some(fixed.to_string());
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = part.rsplit_once('.')?;
    let module = match module {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "post_attention_layernorm" => "ffn_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    matches!(kind, "weight" | "bias").then(|| format!("blk.{layer}.{module}.{kind}"))
}

/// How many heads the rows of a query or key tensor hold, for [`permute_rows`]: `None` for
/// every other tensor.
pub(super) fn rotated_heads(name: &str, config: &LlmConfig) -> Option<usize> {
    if name.contains(".self_attn.q_proj.") {
        Some(config.num_attention_heads)
    } else if name.contains(".self_attn.k_proj.") {
        Some(config.num_key_value_heads)
    } else {
        None
    }
}

/// `values`, rows of `cols` (a `[heads · head_dim, cols]` weight, or a bias with `cols` 1),
/// with each head's rows reordered from Hugging Face's half-split rotary layout to the
/// interleaved one: row `2i` of a head takes row `i`, row `2i + 1` row `i + head_dim / 2`
/// (`convert_hf_to_gguf.py`'s `LlamaModel.permute`).
pub(super) fn permute_rows(values: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let rows = values.len() / cols;
    let half = rows / heads / 2;
    let mut out = Vec::with_capacity(values.len());
    for head in 0..heads {
        for i in 0..half {
            for from in [i, i + half] {
                let row = head * 2 * half + from;
                out.extend_from_slice(&values[row * cols..(row + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_cpp() {
        let cases = [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("model.layers.3.self_attn.q_proj.bias", "blk.3.attn_q.bias"),
            (
                "model.layers.0.self_attn.k_norm.weight",
                "blk.0.attn_k_norm.weight",
            ),
            (
                "model.layers.11.mlp.down_proj.weight",
                "blk.11.ffn_down.weight",
            ),
            (
                "model.layers.2.post_attention_layernorm.weight",
                "blk.2.ffn_norm.weight",
            ),
            ("lm_head.weight", "output.weight"),
        ];
        for (hf, gguf) in cases {
            assert_eq!(gguf_name(hf).as_deref(), Some(gguf), "{hf}");
        }
        assert_eq!(
            gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq"),
            None
        );
    }

    /// One head of 4 rows: `[a, b, c, d]` (halves `[a, b]`, `[c, d]`) becomes `[a, c, b, d]`.
    #[test]
    fn rows_interleave_the_halves_of_each_head() {
        let rows: Vec<f32> = (0..8).map(|r| r as f32).collect();
        assert_eq!(
            permute_rows(&rows, 2, 1),
            [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]
        );
        let wide: Vec<f32> = (0..8).map(|v| v as f32).collect();
        assert_eq!(
            permute_rows(&wide, 1, 2),
            [0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]
        );
    }
}
