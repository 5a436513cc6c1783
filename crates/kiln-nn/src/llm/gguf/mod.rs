//! A Hugging Face model folder out as one GGUF file, the format llama.cpp, Ollama and LM
//! Studio load: llama.cpp's tensor names and metadata ([`names`], [`metadata`]), the
//! tokenizer's vocabulary, merges, token types, special ids and chat template ([`vocab`]), and
//! the weights in f16, bf16 or q8_0 ([`tensors`]), as llama.cpp's own `convert_hf_to_gguf.py`
//! writes them.
//!
//! The file is written by candle's GGUF writer (`candle_core::quantized::gguf_file`, version
//! 2, which llama.cpp reads) and its ggml block quantisation: nothing of the format is
//! Kiln's own. The export reads the folder's safetensors one shard at a time, so it holds one
//! shard and the converted weights, never the model twice in f32. A fine-tuned model is merged
//! into a folder first (`kiln export merged`, `kiln finetune --merged`).

mod metadata;
mod names;
mod tensors;
mod vocab;

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use kiln_core::output::{OutputError, folder_of, sync_folder};

use super::{LlmError, load_config};

/// The weights' type in the file; 1-D tensors (norms, biases) stay f32, as llama.cpp keeps
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufType {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// 8-bit blocks of 32 with an f16 scale each (8.5 bits per weight). A matrix whose rows are
    /// not a multiple of 32 stays f16, as llama.cpp's converter leaves it.
    Q8_0,
}

impl GgufType {
    /// llama.cpp's `general.file_type` (`LLAMA_FTYPE_MOSTLY_*`).
    fn file_type(self) -> u32 {
        match self {
            Self::F16 => 1,
            Self::Q8_0 => 7,
            Self::Bf16 => 32,
        }
    }
}

impl std::fmt::Display for GgufType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::Q8_0 => "q8_0",
        })
    }
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufReport {
    /// llama.cpp's architecture name (`llama`, `qwen2`, `qwen3`).
    pub architecture: &'static str,
    /// Tensors written.
    pub tensors: usize,
    /// Tokens in the vocabulary written.
    pub tokens: usize,
    /// Bytes of the file.
    pub bytes: u64,
}

/// Writes the model folder `dir` (its `config.json`, `tokenizer.json` and weights; a LLaMA,
/// Mistral, Qwen2 or Qwen3) as the GGUF file `out` with weights of type `ty`. The file is
/// written beside `out` and renamed over it once complete: a failure leaves `out` as it was.
///
/// # Errors
/// The folder's config, tokenizer or weights that cannot be read or are not a model GGUF can
/// name ([`LlmError::Export`]: a tokenizer that is not BPE, a tensor llama.cpp has no name
/// for); [`LlmError::Output`] when `out` cannot be written.
pub fn export_gguf(dir: &Path, out: &Path, ty: GgufType) -> Result<GgufReport, LlmError> {
    let config = load_config(dir)?;
    let arch = names::architecture(&config);
    let mut kv = metadata::model(&config, arch, ty, dir);
    let tokens = vocab::tokenizer(dir, &config, &mut kv)?;
    let tensors = tensors::convert(dir, &config, ty)?;
    let name = out
        .file_name()
        .map_or_else(|| "model.gguf".into(), |n| n.to_string_lossy().into_owned());
    let staged = folder_of(out).join(format!(".{name}.partial"));
    let write = || -> Result<(), String> {
        let file = std::fs::File::create(&staged).map_err(|e| e.to_string())?;
        let mut w = std::io::BufWriter::new(file);
        let kv: Vec<(&str, &Value)> = kv.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let ts: Vec<(&str, &candle_core::quantized::QTensor)> =
            tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        gguf_file::write(&mut w, &kv, &ts).map_err(|e| e.to_string())?;
        let file = w.into_inner().map_err(|e| e.to_string())?;
        file.sync_all().map_err(|e| e.to_string())
    };
    if let Err(reason) = write() {
        std::fs::remove_file(&staged).ok();
        return Err(OutputError::io("write", &staged, std::io::Error::other(reason)).into());
    }
    std::fs::rename(&staged, out).map_err(|e| OutputError::io("rename", out, e))?;
    sync_folder(folder_of(out))?;
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(GgufReport {
        architecture: arch,
        tensors: tensors.len(),
        tokens,
        bytes,
    })
}
