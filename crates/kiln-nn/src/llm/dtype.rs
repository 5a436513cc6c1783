//! The float dtype weights are stored in: converted as they are read (Kiln computes the base in
//! f32) and as they are written (a merged model in its base's dtype), and the dtype a model
//! folder stores.

use std::path::Path;
use std::rc::Rc;

use burn::tensor::DType;
use burn_store::{ModuleAdapter, ModuleStore, SafetensorsStore, TensorSnapshot};

use super::LlmError;
use super::folder::weight_files;

/// Converts every float tensor of another float dtype to `to` as it passes, lazily (one
/// tensor at a time, when it is read or written); other tensors pass unchanged.
#[derive(Debug, Clone, Copy)]
pub(super) struct ConvertFloats {
    /// The dtype every float tensor leaves in.
    pub to: DType,
}

impl ModuleAdapter for ConvertFloats {
    fn adapt(&self, snapshot: &TensorSnapshot) -> TensorSnapshot {
        let float = matches!(
            snapshot.dtype,
            DType::F64 | DType::F32 | DType::F16 | DType::BF16
        );
        if !float || snapshot.dtype == self.to {
            return snapshot.clone();
        }
        let (read, to) = (snapshot.clone_data_fn(), self.to);
        TensorSnapshot::from_closure(
            Rc::new(move || Ok(read()?.convert_dtype(to))),
            to,
            snapshot.shape.clone(),
            snapshot.path_stack.clone().unwrap_or_default(),
            snapshot.container_stack.clone().unwrap_or_default(),
            snapshot.tensor_id.unwrap_or_default(),
        )
    }

    fn clone_box(&self) -> Box<dyn ModuleAdapter> {
        Box::new(*self)
    }
}

/// The float dtype most of the weights of the model folder `dir` are stored in (by
/// elements; a bf16 checkpoint may keep a few tensors in f32), read from the files' headers
/// alone.
///
/// # Errors
/// A folder without weights, or a weights file that cannot be read.
pub fn stored_dtype(dir: &Path) -> Result<DType, LlmError> {
    let mut counts: Vec<(DType, usize)> = Vec::new();
    for file in weight_files(dir)? {
        let mut store = SafetensorsStore::from_file(&file);
        let snapshots = store.get_all_snapshots().map_err(|e| LlmError::Tensor {
            file: file.display().to_string(),
            reason: e.to_string(),
        })?;
        for snapshot in snapshots.values() {
            if matches!(
                snapshot.dtype,
                DType::F32 | DType::F16 | DType::BF16 | DType::F64
            ) {
                let elements: usize = snapshot.shape.iter().product();
                match counts.iter_mut().find(|(d, _)| *d == snapshot.dtype) {
                    Some((_, n)) => *n += elements,
                    None => counts.push((snapshot.dtype, elements)),
                }
            }
        }
    }
    Ok(counts
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .map_or(DType::F32, |(d, _)| d))
}

/// transformers' name of a float dtype, as `config.json`'s `torch_dtype` writes it.
pub(super) fn torch_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        DType::F64 => "float64",
        _ => "float32",
    }
}
