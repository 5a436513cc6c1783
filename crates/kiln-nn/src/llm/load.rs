//! Loading a Hugging Face model folder: `config.json`, then the weights of
//! `model.safetensors` or of every shard its `model.safetensors.index.json` names, through
//! burn-store, converted to f32 whatever the file's float type.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use burn::tensor::DType;
use burn_store::{
    ChainAdapter, ModuleAdapter, ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore,
    TensorSnapshot,
};
use kiln_kernels::KernelBackend;

use super::{CausalLm, LlmConfig, LlmError};

const CONFIG: &str = "config.json";
const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

/// Reads the folder's `config.json`.
///
/// # Errors
/// [`LlmError::NoConfig`], or what [`LlmConfig::from_file`] refuses.
pub fn load_config(dir: &Path) -> Result<LlmConfig, LlmError> {
    let path = dir.join(CONFIG);
    if !path.is_file() {
        return Err(LlmError::NoConfig {
            dir: dir.display().to_string(),
        });
    }
    LlmConfig::from_file(&path)
}

/// The model of the folder `dir` on `device`, in f32: its config, and every weight of its
/// safetensors files.
///
/// # Errors
/// A folder without a config or weights, a config Kiln does not build, a tensor missing from
/// every file or of another shape than the config says (named).
pub fn load<B: KernelBackend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(LlmConfig, CausalLm<B>), LlmError> {
    let config = load_config(dir)?;
    let mut model = config.init::<B>(device);
    let expected: BTreeSet<String> = model
        .collect(None, None, false)
        .iter()
        .map(TensorSnapshot::full_path)
        .collect();
    let mut applied = HashSet::new();
    for file in weight_files(dir)? {
        let mut store = SafetensorsStore::from_file(file.clone())
            .with_from_adapter(ChainAdapter::new(PyTorchToBurnAdapter, ToF32))
            // burn-store renames `weight` to `gamma` for Layer/BatchNorm, not for RmsNorm.
            .with_key_remapping(r"^(.*norm)\.weight$", "$1.gamma")
            // A layer's projections hold the pretrained Linear as `base`, beside an adapter.
            .with_key_remapping(r"^(.*_proj)\.(weight|bias)$", "$1.base.$2")
            // Each shard holds part of the model; the union is checked below.
            .allow_partial(true);
        let tensor_error = |reason: String| LlmError::Tensor {
            file: file.display().to_string(),
            reason,
        };
        let result = model
            .load_from(&mut store)
            .map_err(|e| tensor_error(e.to_string()))?;
        if let Some(error) = result.errors.first() {
            return Err(tensor_error(error.to_string()));
        }
        applied.extend(result.applied);
    }
    let missing: Vec<&String> = expected.iter().filter(|p| !applied.contains(*p)).collect();
    if let Some(first) = missing.first() {
        return Err(LlmError::MissingTensor {
            tensor: hf_name(first),
            dir: dir.display().to_string(),
            count: missing.len(),
        });
    }
    Ok((config, model))
}

/// A parameter's Hugging Face name from its Burn path.
fn hf_name(path: &str) -> String {
    let path = path.replace("_proj.base.", "_proj.");
    path.strip_suffix(".gamma")
        .map_or_else(|| path.clone(), |p| format!("{p}.weight"))
}

/// The safetensors files of `dir`: the shards its index names, or its single file.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, LlmError> {
    let index = dir.join(INDEX);
    if index.is_file() {
        let io = |e: &dyn std::fmt::Display| LlmError::Io {
            path: index.display().to_string(),
            reason: e.to_string(),
        };
        let text = std::fs::read_to_string(&index).map_err(|e| io(&e))?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| io(&e))?;
        let map = json
            .get("weight_map")
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| io(&"no weight_map object"))?;
        let shards: BTreeSet<&str> = map.values().filter_map(serde_json::Value::as_str).collect();
        return shards
            .into_iter()
            .map(|shard| {
                let path = dir.join(shard);
                if path.is_file() {
                    Ok(path)
                } else {
                    Err(LlmError::Io {
                        path: path.display().to_string(),
                        reason: format!("a shard {INDEX} names is missing"),
                    })
                }
            })
            .collect();
    }
    let single = dir.join(SINGLE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    Err(LlmError::NoWeights {
        dir: dir.display().to_string(),
    })
}

/// Converts every half- or double-precision tensor to f32 as it is read: Kiln computes the
/// base in f32 (bf16 and f16 checkpoints are common, and a Flex matmul of mixed dtypes fails).
#[derive(Debug, Clone, Copy)]
struct ToF32;

impl ModuleAdapter for ToF32 {
    fn adapt(&self, snapshot: &TensorSnapshot) -> TensorSnapshot {
        if !matches!(snapshot.dtype, DType::F16 | DType::BF16 | DType::F64) {
            return snapshot.clone();
        }
        let read = snapshot.clone_data_fn();
        TensorSnapshot::from_closure(
            Rc::new(move || Ok(read()?.convert_dtype(DType::F32))),
            DType::F32,
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
