//! A fine-tuned model out as a Hugging Face folder: the adapters merged into the base
//! weights ([`CausalLm::merge_lora`]) and the whole model written as `model.safetensors` under
//! Hugging Face's names, beside the base folder's `config.json` ([`CausalLm::save_pretrained`]),
//! so `from_pretrained` loads it without PEFT.

use std::path::Path;

use burn_store::{BurnToPyTorchAdapter, ModuleSnapshot, SafetensorsStore};

use super::{CausalLm, LlmError};
use crate::tensor_parallel::ShardedBackend;

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

    /// Writes the model into `dir` as a Hugging Face folder: `model.safetensors` (f32, Hugging
    /// Face's names and layouts, `format: pt`), and the `config.json` and (when it has one)
    /// `tokenizer.json` of `base_dir`, the folder the base was loaded from. Adapters are written merged; call [`Self::save_peft`] to keep
    /// them apart instead.
    ///
    /// # Errors
    /// [`LlmError::Io`] when a file cannot be written or the base's config read.
    pub fn save_pretrained(&self, dir: &Path, base_dir: &Path) -> Result<(), LlmError> {
        let io = |path: &Path, e: &dyn std::fmt::Display| LlmError::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(|e| io(dir, &e))?;
        // A loader reads the shards an index names before a single file: the new weights
        // beside an old index would never be read.
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            return Err(io(
                &index,
                &"the folder holds a sharded checkpoint; save into another folder",
            ));
        }
        let merged = self.clone().merge_lora();
        let path = dir.join("model.safetensors");
        let mut store = SafetensorsStore::from_file(path.clone())
            .with_to_adapter(BurnToPyTorchAdapter)
            .with_key_remapping(r"^(.*norm)\.gamma$", "$1.weight")
            .with_key_remapping(r"^(.*_proj)\.base\.(weight|bias)$", "$1.$2")
            .metadata("format", "pt")
            .overwrite(true);
        merged.save_into(&mut store).map_err(|e| io(&path, &e))?;
        // The base folder's config, and its tokenizer when it has one, so the folder is
        // complete. Saved into the folder it came from, they are already in place: copying a
        // file onto itself would truncate it.
        let same = |a: &Path, b: &Path| {
            a.canonicalize()
                .ok()
                .zip(b.canonicalize().ok())
                .is_some_and(|(a, b)| a == b)
        };
        for (name, required) in [("config.json", true), ("tokenizer.json", false)] {
            let (from, to) = (base_dir.join(name), dir.join(name));
            if (required || from.is_file()) && !same(&from, &to) {
                std::fs::copy(&from, &to).map_err(|e| io(&from, &e))?;
            }
        }
        Ok(())
    }
}
