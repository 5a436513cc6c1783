//! Loading a Hugging Face model folder: `config.json`, then the weights of
//! `model.safetensors` or of every shard its `model.safetensors.index.json` names, through
//! burn-store, converted to f32 whatever the file's float type.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, Int, Tensor, TensorData};
use burn_store::{
    ChainAdapter, ModuleSnapshot, ModuleStore, PyTorchToBurnAdapter, SafetensorsStore,
};
use kiln_kernels::quant::{HostQuantized, QuantizedWeight};

use super::dtype::ConvertFloats;
use super::error::non_finite;
use super::folder::{regular_file, weight_files};
use super::{CausalLm, LlmConfig, LlmError, Proj, QuantizedBase};
use crate::lora::QuantConfig;
use crate::tensor_parallel::ShardedBackend;

const CONFIG: &str = "config.json";

/// Reads the folder's `config.json`.
///
/// # Errors
/// [`LlmError::NoConfig`], or what [`LlmConfig::from_file`] refuses.
pub fn load_config(dir: &Path) -> Result<LlmConfig, LlmError> {
    match regular_file(dir, CONFIG)? {
        Some(path) => LlmConfig::from_file(&path),
        None => Err(LlmError::NoConfig {
            dir: dir.display().to_string(),
        }),
    }
}

/// The model of the folder `dir` on `device`, in f32: its config, and every weight of its
/// safetensors files.
///
/// # Errors
/// A folder without a config or weights, a config Kiln does not build, a tensor missing from
/// every file or of another shape than the config says (named).
pub fn load<B: ShardedBackend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(LlmConfig, CausalLm<B>), LlmError> {
    let config = load_config(dir)?;
    let files = weight_files(dir)?;
    let mut model = config.init::<B>(device);
    fill(&mut model, dir, &files)?;
    Ok((config, model))
}

/// The model of the folder `dir` on `device` with every projection of every layer held in 4
/// bits (`quant`'s format, Kiln's blocks of 64), QLoRA's frozen base. Each projection is
/// read, converted to f32, quantised and dropped before the next is read, so the host holds
/// the 4-bit model plus one projection in f32 (and the memory-mapped file pages the kernel
/// may reclaim), never the whole model in f32. The embedding, the norms and the head stay in
/// f32.
///
/// # Errors
/// As [`load`].
pub fn load_4bit<B: ShardedBackend>(
    dir: &Path,
    device: &B::Device,
    quant: &QuantConfig,
) -> Result<(LlmConfig, CausalLm<B>), LlmError> {
    let config = load_config(dir)?;
    let files = weight_files(dir)?;
    let mut model = {
        let mut shards = Shards::open(&files)?;
        config.build(device, &mut |path,
                                    d_in,
                                    d_out,
                                    bias|
         -> Result<_, LlmError> {
            // Checkpoints hold `nn.Linear` weights as [out, in].
            let weight = shards.read(&format!("{path}.base.weight"), &[d_out, d_in])?;
            let host = HostQuantized::quantize_transposed(
                &weight,
                d_in,
                d_out,
                quant.format,
                quant.scales,
            );
            drop(weight);
            let bias = match bias {
                true => {
                    let values = shards.read(&format!("{path}.base.bias"), &[d_out])?;
                    let tensor = Tensor::from_data(TensorData::new(values, [d_out]), device);
                    Some(Param::from_tensor(tensor).set_require_grad(false))
                }
                false => None,
            };
            Ok(Proj::quantized(QuantizedBase {
                weight: QuantizedWeight::from_host(&host, quant.scales, device),
                bias,
            }))
        })?
    };
    fill(&mut model, dir, &files)?;
    Ok((config, model))
}

/// Loads every full-precision parameter of `model` from `files` (the 4-bit projections are
/// already filled), and checks that every one was found.
fn fill<B: ShardedBackend>(
    model: &mut CausalLm<B>,
    dir: &Path,
    files: &[PathBuf],
) -> Result<(), LlmError> {
    let all = parameter_paths(model);
    let expected: BTreeSet<String> = all
        .keys()
        .filter(|path| !path.contains(".quantized."))
        .cloned()
        .collect();
    let mut unused = Vec::new();
    for file in files {
        let mut store = open(file);
        let snapshots = store
            .get_all_snapshots()
            .map_err(|e| tensor_error(file, e))?;
        let mut wrong = snapshots.iter().filter_map(|(path, snapshot)| {
            let want = checkpoint_shape(path, all.get(path)?);
            (snapshot.shape.as_slice() != want.as_slice()).then_some((path, snapshot, want))
        });
        if let Some((path, snapshot, want)) = wrong.next() {
            let more = wrong.count();
            return Err(tensor_error(
                file,
                format!(
                    "{} is {:?}, but the config makes it {want:?}{}; the config.json does not \
                     describe these weights",
                    hf_name(path),
                    snapshot.shape.as_slice(),
                    match more {
                        0 => String::new(),
                        n => format!(" ({n} more tensor(s) differ)"),
                    }
                ),
            ));
        }
        for (path, snapshot) in snapshots {
            check_float(file, path, snapshot.dtype)?;
            if !all.contains_key(path) && !quantized_source(&all, path) {
                unused.push(hf_name(path));
            }
        }
    }
    warn_unused(dir, &unused);
    let mut applied = HashSet::new();
    for file in files {
        let mut store = open(file)
            // Kiln computes the base in f32 (bf16 and f16 checkpoints are common, and a Flex
            // matmul of mixed dtypes fails).
            .with_from_adapter(ChainAdapter::new(
                PyTorchToBurnAdapter,
                ConvertFloats { to: DType::F32 },
            ))
            // Each shard holds part of the model; the union is checked below.
            .allow_partial(true);
        let result = model
            .load_from(&mut store)
            .map_err(|e| tensor_error(file, e))?;
        if let Some(error) = result.errors.first() {
            return Err(tensor_error(file, error));
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
    check_finite(model, dir)
}

/// The shape a checkpoint stores the parameter at `path` of Burn's `shape` in: PyTorch keeps
/// a linear layer's weight as `[out, in]`, Burn as `[in, out]`.
fn checkpoint_shape(path: &str, shape: &[usize]) -> Vec<usize> {
    let linear = path.ends_with("_proj.base.weight") || path == "lm_head.weight";
    match (linear, shape) {
        (true, [d_in, d_out]) => vec![*d_out, *d_in],
        _ => shape.to_vec(),
    }
}

/// Refuses a tensor that is not stored as floats: Kiln's parameters are float tensors, and
/// Burn would panic deep in its load rather than say which tensor it was.
fn check_float(file: &Path, path: &str, dtype: DType) -> Result<(), LlmError> {
    if matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64) {
        return Ok(());
    }
    Err(tensor_error(
        file,
        format!(
            "{} is stored as {dtype:?}; Kiln loads float weights (F32, F16, BF16, F64): \
             convert the checkpoint, or dequantise it first",
            hf_name(path)
        ),
    ))
}

/// Whether the file's tensor `path` is the source of a projection held in 4 bits (read by
/// [`Shards`], not by the store).
fn quantized_source(all: &BTreeMap<String, Vec<usize>>, path: &str) -> bool {
    let Some(proj) = path
        .strip_suffix(".base.weight")
        .or_else(|| path.strip_suffix(".base.bias"))
    else {
        return false;
    };
    let prefix = format!("{proj}.quantized.");
    all.range(prefix.clone()..)
        .next()
        .is_some_and(|(p, _)| p.starts_with(&prefix))
}

/// Tensors of the folder that no parameter of the model takes: named, in one warning, since a
/// config that does not describe its weights is either a wrong config or a model Kiln builds
/// only in part.
fn warn_unused(dir: &Path, unused: &[String]) {
    // Rotary frequencies some exporters store are recomputed from the config.
    let unused: Vec<&String> = unused
        .iter()
        .filter(|name| !name.ends_with("rotary_emb.inv_freq"))
        .collect();
    if let Some(first) = unused.first() {
        tracing::warn!(
            "{} holds {} tensor(s) the config does not use, ignored: {first}{}",
            dir.display(),
            unused.len(),
            if unused.len() > 1 { ", …" } else { "" }
        );
    }
}

/// Refuses a model with a NaN or an infinite weight: it would train to NaN or generate
/// garbage with no other sign. Each parameter's finding stays on the device, and all of them are
/// read at once: a read per parameter (two per tensor, 222 for a 100 M LLaMA) made the device
/// wait for the host at each.
pub(crate) fn check_finite<B: ShardedBackend>(
    model: &CausalLm<B>,
    dir: &Path,
) -> Result<(), LlmError> {
    /// Every parameter's path and its finding: 2 for a NaN, 1 for an infinity, 0 for neither.
    struct Findings<B: Backend> {
        stack: Vec<String>,
        paths: Vec<String>,
        found: Vec<Tensor<B, 1, Int>>,
    }
    impl<B: Backend> ModuleVisitor<B> for Findings<B> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.stack.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.stack.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            let nan = t.clone().is_nan().any().int().mul_scalar(2);
            self.found.push(nan.max_pair(t.is_inf().any().int()));
            self.paths.push(self.stack.join("."));
        }
    }
    let mut findings = Findings {
        stack: Vec::new(),
        paths: Vec::new(),
        found: Vec::new(),
    };
    model.visit(&mut findings);
    if findings.found.is_empty() {
        return Ok(());
    }
    let found = Tensor::cat(findings.found, 0).into_data();
    let found = found.iter::<i64>();
    match found.zip(findings.paths).find(|(f, _)| *f != 0) {
        Some((f, path)) => Err(LlmError::NonFinite {
            tensor: hf_name(&path),
            file: dir.display().to_string(),
            what: if f >= 2 { "NaN" } else { "infinite" },
        }),
        None => Ok(()),
    }
}

/// Every parameter's path in `model` (`model.layers.0.input_layernorm.gamma`), read without
/// touching a value: `ModuleSnapshot::collect` would initialise each freshly built parameter
/// (random values the load then replaces), a whole model's worth of memory for nothing.
fn parameter_paths<B: ShardedBackend>(model: &CausalLm<B>) -> BTreeMap<String, Vec<usize>> {
    #[derive(Default)]
    struct Paths {
        stack: Vec<String>,
        paths: BTreeMap<String, Vec<usize>>,
    }
    impl Paths {
        fn record(&mut self, shape: burn::tensor::Shape) {
            self.paths.insert(self.stack.join("."), shape.to_vec());
        }
    }
    impl<B: Backend> ModuleVisitor<B> for Paths {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.stack.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.stack.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.record(param.lazy_shape());
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            self.record(param.lazy_shape());
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
            self.record(param.lazy_shape());
        }
    }
    let mut visitor = Paths::default();
    model.visit(&mut visitor);
    visitor.paths
}

/// A weight file's store, its names mapped to the model's paths.
fn open(file: &Path) -> SafetensorsStore {
    SafetensorsStore::from_file(file)
        // burn-store renames `weight` to `gamma` for Layer/BatchNorm, not for RmsNorm.
        .with_key_remapping(r"^(.*norm)\.weight$", "$1.gamma")
        // A layer's projections hold the pretrained Linear as `base`, beside an adapter.
        .with_key_remapping(r"^(.*_proj)\.(weight|bias)$", "$1.base.$2")
}

fn tensor_error(file: &Path, reason: impl std::fmt::Display) -> LlmError {
    LlmError::Tensor {
        file: file.display().to_string(),
        reason: reason.to_string(),
    }
}

/// The weight files of a folder, read one tensor at a time by the model's path.
struct Shards {
    files: Vec<(PathBuf, SafetensorsStore)>,
    owner: HashMap<String, usize>,
}

impl Shards {
    fn open(files: &[PathBuf]) -> Result<Self, LlmError> {
        let mut owner = HashMap::new();
        let mut opened = Vec::with_capacity(files.len());
        for (i, file) in files.iter().enumerate() {
            let mut store = open(file);
            let snapshots = store
                .get_all_snapshots()
                .map_err(|e| tensor_error(file, e))?;
            for (key, snapshot) in snapshots {
                check_float(file, key, snapshot.dtype)?;
                owner.insert(key.clone(), i);
            }
            opened.push((file.clone(), store));
        }
        Ok(Self {
            files: opened,
            owner,
        })
    }

    /// The tensor at the model path `path`, checked to be of `shape`, as f32 values.
    fn read(&mut self, path: &str, shape: &[usize]) -> Result<Vec<f32>, LlmError> {
        let Some(&i) = self.owner.get(path) else {
            return Err(LlmError::MissingTensor {
                tensor: hf_name(path),
                dir: self.files[0]
                    .0
                    .parent()
                    .map_or_else(String::new, |d| d.display().to_string()),
                count: 1,
            });
        };
        let (file, store) = &mut self.files[i];
        let snapshot = store
            .get_snapshot(path)
            .map_err(|e| tensor_error(file, e))?
            .ok_or_else(|| tensor_error(file, format!("{} vanished", hf_name(path))))?;
        if snapshot.shape.as_slice() != shape {
            return Err(tensor_error(
                file,
                format!(
                    "{} is {:?}, but the config makes it {shape:?}",
                    hf_name(path),
                    snapshot.shape.as_slice()
                ),
            ));
        }
        let data = snapshot.to_data().map_err(|e| tensor_error(file, e))?;
        let values = data
            .convert_dtype(DType::F32)
            .into_vec::<f32>()
            .map_err(|e| tensor_error(file, format!("{}: {e:?}", hf_name(path))))?;
        // Quantised, a NaN would hide in a block's scale; refused while still in f32.
        if let Some(what) = non_finite(&values) {
            return Err(LlmError::NonFinite {
                tensor: hf_name(path),
                file: file.display().to_string(),
                what,
            });
        }
        Ok(values)
    }
}

/// A parameter's Hugging Face name from its Burn path.
fn hf_name(path: &str) -> String {
    let path = path.replace("_proj.base.", "_proj.");
    path.strip_suffix(".gamma")
        .map_or_else(|| path.clone(), |p| format!("{p}.weight"))
}
