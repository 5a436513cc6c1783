//! The folder's weights as GGUF tensors: read from its safetensors one shard at a time (f32,
//! bf16 or f16), the query and key rows permuted where llama.cpp rotates interleaved pairs,
//! and converted by candle's ggml types; LLaMA 3's rotary rescaling as llama.cpp's
//! `rope_freqs.weight`.

use std::path::Path;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use safetensors::{Dtype, SafeTensors};

use super::{GgufType, names};
use crate::llm::{LlmConfig, LlmError, RopeScaling, folder::weight_files};

/// Every tensor of the folder `dir` under its GGUF name, in llama.cpp's order (the embedding,
/// the blocks in order, the final norm and the head).
pub(super) fn convert(
    dir: &Path,
    config: &LlmConfig,
    ty: GgufType,
) -> Result<Vec<(String, QTensor)>, LlmError> {
    let arch = names::architecture(config);
    let mut out = Vec::new();
    for file in weight_files(dir)? {
        let fail = |reason: String| LlmError::Tensor {
            file: file.display().to_string(),
            reason,
        };
        let bytes = std::fs::read(&file).map_err(|e| LlmError::io(&file, e))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| fail(e.to_string()))?;
        for (name, view) in st.tensors() {
            let Some(gguf) = names::gguf_name(&name) else {
                return Err(LlmError::Export {
                    format: "GGUF",
                    what: format!("{name} of {}", file.display()),
                    reason: "llama.cpp has no name for this tensor in a LLaMA, Mistral or Qwen \
                             model"
                        .into(),
                });
            };
            let dtype = match view.dtype() {
                Dtype::F32 => DType::F32,
                Dtype::BF16 => DType::BF16,
                Dtype::F16 => DType::F16,
                other => {
                    return Err(fail(format!(
                        "{name} is {other:?}; expected f32, bf16 or f16"
                    )));
                }
            };
            let shape = view.shape().to_vec();
            let read = Tensor::from_raw_buffer(view.data(), dtype, &shape, &Device::Cpu)
                .and_then(|t| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>());
            let mut values = read.map_err(|e| fail(format!("{name}: {e}")))?;
            if names::interleaved_rope(arch)
                && let Some(heads) = names::rotated_heads(&name, config)
            {
                let cols = shape.get(1).copied().unwrap_or(1);
                values = names::permute_rows(&values, heads, cols);
            }
            let tensor = ggml(values, &shape, ty).map_err(|e| fail(format!("{name}: {e}")))?;
            out.push((gguf, tensor));
        }
    }
    if let Some(factors) = rope_factors(config) {
        let n = factors.len();
        let tensor = ggml(factors, &[n], ty).map_err(|e| LlmError::Export {
            format: "GGUF",
            what: "rope_freqs.weight".into(),
            reason: e.to_string(),
        })?;
        out.push(("rope_freqs.weight".into(), tensor));
    }
    out.sort_by_key(|(name, _)| order(name));
    Ok(out)
}

/// `values` of `shape` (Hugging Face's `[out, in]`: ggml reads it as `ne = [in, out]`) as a
/// ggml tensor: vectors in f32, as llama.cpp keeps norms and biases; matrices in `ty`, but
/// q8_0 only for rows of whole blocks of 32 (f16 otherwise, as llama.cpp's converter falls
/// back).
fn ggml(values: Vec<f32>, shape: &[usize], ty: GgufType) -> candle_core::Result<QTensor> {
    let cols = shape.last().copied().unwrap_or(1);
    let dtype = match (shape.len(), ty) {
        (0 | 1, _) => GgmlDType::F32,
        (_, GgufType::F16) => GgmlDType::F16,
        (_, GgufType::Bf16) => GgmlDType::BF16,
        (_, GgufType::Q8_0) if cols.is_multiple_of(32) => GgmlDType::Q8_0,
        (_, GgufType::Q8_0) => GgmlDType::F16,
    };
    QTensor::quantize(&Tensor::from_vec(values, shape, &Device::Cpu)?, dtype)
}

/// LLaMA 3's rescaling as the factor each rotary frequency is divided by, llama.cpp's
/// `rope_freqs.weight` (`convert_hf_to_gguf.py`'s `LlamaModel.generate_extra_tensors`).
fn rope_factors(config: &LlmConfig) -> Option<Vec<f32>> {
    let Some(RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    }) = config.rope_scaling
    else {
        return None;
    };
    let dim = config.head_dim;
    let context = original_max_position_embeddings as f64;
    let (low_wavelen, high_wavelen) = (context / low_freq_factor, context / high_freq_factor);
    let factors = (0..dim / 2).map(|i| {
        let freq = 1.0 / config.rope_theta.powf((2 * i) as f64 / dim as f64);
        let wavelen = 2.0 * std::f64::consts::PI / freq;
        let f = if wavelen < high_wavelen {
            1.0
        } else if wavelen > low_wavelen {
            factor
        } else {
            let smooth =
                (context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
            1.0 / ((1.0 - smooth) / factor + smooth)
        };
        f as f32
    });
    Some(factors.collect())
}

/// Where a tensor goes in the file: the embedding, the blocks in order (each block's tensors
/// by name), the rotary factors, the final norm, the head.
fn order(name: &str) -> (usize, usize, String) {
    if name == "token_embd.weight" {
        return (0, 0, String::new());
    }
    if let Some(rest) = name.strip_prefix("blk.")
        && let Some((layer, part)) = rest.split_once('.')
    {
        return (1, layer.parse().unwrap_or(usize::MAX), part.to_string());
    }
    (2, 0, name.to_string())
}
