//! A fine-tuned model out as a Hugging Face folder: the adapters merged into the base
//! weights ([`CausalLm::merge_lora`]) and the whole model written as `model.safetensors` under
//! Hugging Face's names, beside the base folder's `config.json` ([`CausalLm::save_pretrained`]),
//! so `from_pretrained` loads it without PEFT.

use std::path::Path;

use burn::tensor::DType;
use burn_store::{BurnToPyTorchAdapter, ChainAdapter, ModuleSnapshot, SafetensorsStore};
use kiln_core::output::{OutputError, Staging};

use super::dtype::{ConvertFloats, torch_name};
use super::folder::{INDEX, SINGLE as WEIGHTS, regular_file};
use super::{CausalLm, LlmError};
use crate::tensor_parallel::ShardedBackend;

/// The files of a model folder besides its config and weights that a merged model keeps:
/// the tokenizer (fast and slow), its special tokens and chat template, and the generation
/// settings (end-of-turn tokens, sampling defaults).
pub const COMPANIONS: [&str; 9] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "tokenizer.model",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
];

impl<B: ShardedBackend> CausalLm<B> {
    /// This model with every adapter folded into its base weight (`W + scale·A·B`) and
    /// removed: one matmul per projection again, and a plain checkpoint to save. A 4-bit base
    /// is decoded to f32 first, so the result is a full-precision model.
    pub fn merge_lora(mut self) -> Self {
        for (_, _, proj) in self.projections_mut() {
            proj.merge();
        }
        self
    }

    /// Writes the model into `dir` as a Hugging Face folder in the dtype its base is stored in
    /// ([`super::stored_dtype`] of `base_dir`, the folder the base was loaded from; f32 for a
    /// base folder without weights, a model built from its config): see
    /// [`Self::save_pretrained_as`].
    ///
    /// # Errors
    /// As [`Self::save_pretrained_as`], and a base folder whose weights cannot be read.
    pub fn save_pretrained(&self, dir: &Path, base_dir: &Path) -> Result<(), LlmError> {
        let dtype = match super::stored_dtype(base_dir) {
            Err(LlmError::NoWeights { .. }) => DType::F32,
            stored => stored?,
        };
        self.save_pretrained_as(dir, base_dir, dtype)
    }

    /// Writes the model into `dir` as a Hugging Face folder: `model.safetensors` in `dtype`
    /// (f32, bf16 or f16; the merge computed in f32 and rounded once; Hugging Face's names and
    /// layouts, `format: pt`), sharded past [`MAX_SHARD_BYTES`] as transformers shards, and
    /// the `config.json` of `base_dir` (its `torch_dtype` set to `dtype`), with every
    /// tokenizer and generation file the base folder has ([`COMPANIONS`]). Adapters are
    /// written merged; call [`Self::save_peft`] to keep them apart instead.
    ///
    /// The folder is written beside `dir` and swapped in whole: a crash or a full disk leaves
    /// the previous folder as it was.
    ///
    /// # Errors
    /// [`LlmError::Output`] when a file cannot be written; [`LlmError::NonFinite`] for a
    /// merged weight that is NaN or infinite; the base's config missing.
    pub fn save_pretrained_as(
        &self,
        dir: &Path,
        base_dir: &Path,
        dtype: DType,
    ) -> Result<(), LlmError> {
        self.save_pretrained_sharded(dir, base_dir, dtype, MAX_SHARD_BYTES)
    }

    /// [`Self::save_pretrained_as`] with shards of at most `max_shard_bytes` (one tensor
    /// larger than that is a shard alone): `model-00001-of-0000n.safetensors`, in the model's
    /// order, and `model.safetensors.index.json` naming each tensor's (transformers'
    /// `max_shard_size`); one `model.safetensors` when everything fits.
    ///
    /// # Errors
    /// As [`Self::save_pretrained_as`].
    pub fn save_pretrained_sharded(
        &self,
        dir: &Path,
        base_dir: &Path,
        dtype: DType,
        max_shard_bytes: u64,
    ) -> Result<(), LlmError> {
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(LlmError::Adapter(format!(
                "a merged model is written in f32, bf16 or f16, not {dtype:?}"
            )));
        }
        let merged = self.clone().merge_lora();
        // A merged NaN (a diverged adapter, a damaged base) would replace a good model with
        // one that generates garbage.
        super::load::check_finite(&merged, Path::new("the merged model (nothing was written)"))?;
        let staging = Staging::new(dir)?;
        let shards = shards(&merged, dtype, max_shard_bytes);
        let count = shards.len();
        let mut weight_map = serde_json::Map::new();
        let mut total = 0u64;
        for (i, (paths, bytes)) in shards.into_iter().enumerate() {
            let name = match count {
                1 => WEIGHTS.to_string(),
                _ => format!("model-{:05}-of-{count:05}.safetensors", i + 1),
            };
            let path = staging.path().join(&name);
            let failed = |e: OutputError| LlmError::Output(staging.named(&name, e));
            let mut store = SafetensorsStore::from_file(path.clone())
                .with_full_paths(paths)
                .with_to_adapter(ChainAdapter::new(
                    BurnToPyTorchAdapter,
                    ConvertFloats { to: dtype },
                ))
                .with_key_remapping(r"^(.*norm)\.gamma$", "$1.weight")
                .with_key_remapping(r"^(.*_proj)\.base\.(weight|bias)$", "$1.$2")
                .metadata("format", "pt")
                .overwrite(true);
            let io = |op, e: String| failed(OutputError::io(op, &path, std::io::Error::other(e)));
            merged
                .save_into(&mut store)
                .map_err(|e| io("write", e.to_string()))?;
            sync_file(&path).map_err(failed)?;
            total += bytes;
            if count > 1 {
                // The names as written (after the remapping), read back from the header.
                let file = std::fs::File::open(&path).map_err(|e| io("read", e.to_string()))?;
                let header = read_header_names(file).map_err(|e| io("read", e))?;
                for key in header {
                    weight_map.insert(key, name.clone().into());
                }
            }
        }
        if count > 1 {
            let index = serde_json::json!({
                "metadata": { "total_size": total },
                "weight_map": weight_map,
            });
            let text = serde_json::to_string_pretty(&index).unwrap_or_default();
            let path = staging.path().join(INDEX);
            kiln_core::output::write_synced(&path, text.as_bytes())
                .map_err(|e| LlmError::Output(staging.named(INDEX, e)))?;
        }
        // The base folder's config, and every tokenizer and generation file it has, so that
        // the folder is complete: an instruct model keeps its chat template and end of turn.
        let files = std::iter::once(("config.json", true))
            .chain(COMPANIONS.iter().map(|&name| (name, false)));
        for (name, required) in files {
            let Some(from) = regular_file(base_dir, name)? else {
                if required {
                    return Err(LlmError::NoConfig {
                        dir: base_dir.display().to_string(),
                    });
                }
                continue;
            };
            let to = staging.path().join(name);
            let copied = match name {
                "config.json" => config_in(&from, dtype).and_then(|text| std::fs::write(&to, text)),
                _ => std::fs::copy(&from, &to).map(drop),
            };
            copied.map_err(|e| {
                LlmError::Output(staging.named(name, OutputError::io("copy", &to, e)))
            })?;
            sync_file(&to).map_err(|e| LlmError::Output(staging.named(name, e)))?;
        }
        // Weights of an earlier model in the folder (an index and its shards, a pickle) would
        // be read before, or beside, the new ones.
        staging.commit(|name| {
            name == INDEX
                || name.starts_with("pytorch_model")
                || (name.starts_with("model") && name.ends_with(".safetensors"))
        })?;
        Ok(())
    }
}

/// The text of the config `path` with its dtype (`torch_dtype`, and transformers 5's
/// `dtype`) set to `dtype`: transformers loads a checkpoint in the dtype its config names.
fn config_in(path: &Path, dtype: DType) -> std::io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    let mut config: serde_json::Value =
        serde_json::from_str(&text).map_err(std::io::Error::other)?;
    if let Some(fields) = config.as_object_mut() {
        let name = serde_json::Value::from(torch_name(dtype));
        let named = ["torch_dtype", "dtype"].map(|key| fields.contains_key(key));
        for (key, present) in ["torch_dtype", "dtype"].iter().zip(named) {
            if present {
                fields.insert((*key).to_string(), name.clone());
            }
        }
        if !named.contains(&true) {
            fields.insert("torch_dtype".into(), name);
        }
    }
    serde_json::to_string_pretty(&config).map_err(std::io::Error::other)
}

/// The most bytes of weights in one file of a saved model: transformers' default
/// `max_shard_size` ("5GB").
pub const MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// The Burn paths of `model`'s tensors cut into shards of at most `max_bytes` once written in
/// `dtype`, in the model's order, with each shard's bytes.
fn shards<B: ShardedBackend>(
    model: &CausalLm<B>,
    dtype: DType,
    max_bytes: u64,
) -> Vec<(Vec<String>, u64)> {
    let width = dtype.size() as u64;
    let mut shards: Vec<(Vec<String>, u64)> = vec![(Vec::new(), 0)];
    for snapshot in model.collect(None, None, false) {
        let bytes = snapshot.shape.num_elements() as u64 * width;
        let last = shards.last_mut().expect("one shard at least");
        if !last.0.is_empty() && last.1 + bytes > max_bytes {
            shards.push((Vec::new(), 0));
        }
        let last = shards.last_mut().expect("one shard at least");
        last.0.push(snapshot.full_path());
        last.1 += bytes;
    }
    shards
}

/// The tensor names in the header of a safetensors file.
fn read_header_names(mut file: std::fs::File) -> Result<Vec<String>, String> {
    use std::io::Read;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| e.to_string())?;
    let len = usize::try_from(u64::from_le_bytes(len)).map_err(|e| e.to_string())?;
    let mut header = vec![0u8; len];
    file.read_exact(&mut header).map_err(|e| e.to_string())?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| e.to_string())?;
    Ok(header
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k != "__metadata__")
        .collect())
}

/// Syncs a file written by a library that does not.
fn sync_file(path: &Path) -> Result<(), OutputError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| OutputError::io("sync", path, e))
}
