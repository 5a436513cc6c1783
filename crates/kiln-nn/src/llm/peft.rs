//! LoRA adapters on a [`CausalLm`], in PEFT's layout: `adapter_config.json` and
//! `adapter_model.safetensors` with PEFT's tensor names
//! (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`, `A` as `[r, in]`, `B` as
//! `[out, r]`), so `PeftModel.from_pretrained` reads what Kiln saves and Kiln reads what PEFT
//! saves.

use std::collections::HashMap;
use std::path::Path;

use burn::module::{Module, Param};
use burn::tensor::{DType, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use kiln_core::output::Staging;

use super::error::non_finite;
use super::{CausalLm, LlmConfig, LlmError, Proj};
use crate::lora::LoraAdapter;
use crate::tensor_parallel::ShardedBackend;

const CONFIG: &str = "adapter_config.json";
const WEIGHTS: &str = "adapter_model.safetensors";

/// The projections an adapter may target, by their Hugging Face names.
pub const TARGET_MODULES: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// PEFT's name for every linear layer but the output head: here, the seven projections.
pub const ALL_LINEAR: &str = "all-linear";

/// `names` with PEFT's [`ALL_LINEAR`] put as the seven projections it stands for, so that the
/// adapters' config lists what was adapted, as PEFT's own saved configs do.
pub fn expand_target_modules(names: &[String]) -> Vec<String> {
    match names {
        [one] if one == ALL_LINEAR => TARGET_MODULES.map(String::from).to_vec(),
        _ => names.to_vec(),
    }
}

#[cfg(test)]
mod all_linear_tests {
    use super::*;

    #[test]
    fn all_linear_is_the_seven_projections() {
        let all = expand_target_modules(&[ALL_LINEAR.to_string()]);
        assert_eq!(all, TARGET_MODULES.map(String::from).to_vec());
        let two = vec!["q_proj".to_string(), "v_proj".to_string()];
        assert_eq!(expand_target_modules(&two), two);
    }
}

/// LoRA's settings, as PEFT's `adapter_config.json` holds them.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    /// The rank `r`.
    pub rank: usize,
    /// `lora_alpha`.
    pub alpha: f32,
    /// The projections adapted (`q_proj`, …), in every layer.
    pub target_modules: Vec<String>,
    /// rsLoRA's scale `α/√r` instead of `α/r`.
    pub use_rslora: bool,
    /// `lora_dropout`: the probability that an input feature is zeroed before the adapter
    /// (not before the base) while training, as PEFT drops it; 0 for none.
    pub dropout: f64,
}

impl LoraSpec {
    /// The factor the adapter's output is multiplied by.
    pub fn scale(&self) -> f32 {
        if self.use_rslora {
            self.alpha / (self.rank as f32).sqrt()
        } else {
            self.alpha / self.rank as f32
        }
    }

    /// Checks the rank and the target modules.
    ///
    /// # Errors
    /// [`LlmError::Adapter`] naming the problem.
    pub fn validate(&self) -> Result<(), LlmError> {
        if self.rank == 0 {
            return Err(LlmError::Adapter("the LoRA rank must be at least 1".into()));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(LlmError::Adapter(format!(
                "lora_alpha must be a positive number, got {}; the adapters' output is scaled \
                 by alpha / rank (16 is the usual start)",
                self.alpha
            )));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(LlmError::Adapter(format!(
                "lora_dropout must be at least 0 and below 1, got {} (0.05 and 0.1 are usual)",
                self.dropout
            )));
        }
        if self.target_modules.is_empty() {
            return Err(LlmError::Adapter("no target module given".into()));
        }
        for (i, t) in self.target_modules.iter().enumerate() {
            if self.target_modules[..i].contains(t) {
                return Err(LlmError::Adapter(format!(
                    "target module '{t}' is given twice; name each module once"
                )));
            }
        }
        if let Some(bad) = self
            .target_modules
            .iter()
            .find(|t| !TARGET_MODULES.contains(&t.as_str()))
        {
            return Err(LlmError::Adapter(format!(
                "target module '{bad}' does not exist in this model; the modules are {}",
                TARGET_MODULES.join(", ")
            )));
        }
        Ok(())
    }
}

impl LoraSpec {
    /// Checks the rank against the model `config` describes, before anything is loaded: at
    /// most the narrower side of every projection targeted.
    ///
    /// # Errors
    /// [`LlmError::Adapter`] naming the projection and the largest rank it takes.
    pub fn check_model(&self, config: &LlmConfig) -> Result<(), LlmError> {
        let (d, f) = (config.hidden_size, config.intermediate_size);
        let (q, kv) = (
            config.num_attention_heads * config.head_dim,
            config.num_key_value_heads * config.head_dim,
        );
        for target in &self.target_modules {
            let [d_in, d_out] = match target.as_str() {
                "q_proj" => [d, q],
                "k_proj" | "v_proj" => [d, kv],
                "o_proj" => [q, d],
                "gate_proj" | "up_proj" => [d, f],
                _ => [f, d],
            };
            rank_fits(self.rank, target, d_in, d_out)?;
        }
        Ok(())
    }
}

/// A rank beyond a projection's narrower side adds nothing a full update would not, and a
/// typo (a rank of 10^6) would otherwise allocate until the process dies.
fn rank_fits(rank: usize, proj: &str, d_in: usize, d_out: usize) -> Result<(), LlmError> {
    if rank <= d_in.min(d_out) {
        return Ok(());
    }
    Err(LlmError::Adapter(format!(
        "the LoRA rank {rank} is larger than {proj} ({d_in} → {d_out}) can use; give a rank of \
         at most {}",
        d_in.min(d_out)
    )))
}

impl<B: ShardedBackend> CausalLm<B> {
    /// Every projection of every layer, in order, with its Hugging Face path
    /// (`model.layers.0.self_attn.q_proj`) and module name (`q_proj`).
    pub fn projections_mut(&mut self) -> Vec<(String, &'static str, &mut Proj<B>)> {
        let mut all = Vec::new();
        for (i, layer) in self.model.layers.iter_mut().enumerate() {
            let attn = format!("model.layers.{i}.self_attn");
            let mlp = format!("model.layers.{i}.mlp");
            let a = &mut layer.self_attn;
            let m = &mut layer.mlp;
            for (name, proj) in [
                ("q_proj", &mut a.q_proj),
                ("k_proj", &mut a.k_proj),
                ("v_proj", &mut a.v_proj),
                ("o_proj", &mut a.o_proj),
            ] {
                all.push((format!("{attn}.{name}"), name, proj));
            }
            for (name, proj) in [
                ("gate_proj", &mut m.gate_proj),
                ("up_proj", &mut m.up_proj),
                ("down_proj", &mut m.down_proj),
            ] {
                all.push((format!("{mlp}.{name}"), name, proj));
            }
        }
        all
    }

    /// This model with its every weight frozen and fresh adapters (PEFT's start: `A`
    /// Kaiming-uniform, `B` zero, so the output is unchanged) on the projections `spec`
    /// targets: what LoRA fine-tuning trains.
    ///
    /// # Errors
    /// [`LlmError::Adapter`] for a zero rank or a target module the model does not have.
    pub fn with_lora(mut self, spec: &LoraSpec) -> Result<Self, LlmError> {
        spec.validate()?;
        // Checked over every projection before any adapter is allocated.
        for (path, name, proj) in self.projections_mut() {
            let [d_in, d_out] = proj.dims();
            if spec.target_modules.iter().any(|t| t == name) {
                rank_fits(spec.rank, &path, d_in, d_out)?;
            }
        }
        let mut model = self.no_grad();
        for (_, name, proj) in model.projections_mut() {
            if spec.target_modules.iter().any(|t| t == name) {
                let [d_in, d_out] = proj.dims();
                let device = proj.device();
                proj.lora = Some(LoraAdapter::new(d_in, d_out, spec.rank, &device));
                proj.scale = spec.scale();
                proj.dropout = spec.dropout;
            }
        }
        Ok(model)
    }

    /// Writes the adapters into `dir` in PEFT's layout; `base_model` is recorded as
    /// `base_model_name_or_path`.
    ///
    /// # Errors
    /// [`LlmError::Adapter`] when the model has no adapter; [`LlmError::Io`] when a file
    /// cannot be written.
    pub fn save_peft(&self, dir: &Path, spec: &LoraSpec, base_model: &str) -> Result<(), LlmError> {
        let mut model = self.clone();
        let mut tensors: Vec<(String, Vec<u8>, Vec<usize>)> = Vec::new();
        for (path, _, proj) in model.projections_mut() {
            if let Some(adapter) = &proj.lora {
                // PEFT's A is [r, in] and B [out, r]: Kiln's transposed.
                for (which, t) in [("lora_A", adapter.a.val()), ("lora_B", adapter.b.val())] {
                    let t = t.transpose();
                    let shape = t.dims().to_vec();
                    let data = t.into_data().convert::<f32>();
                    let name = format!("base_model.model.{path}.{which}.weight");
                    let values = data.as_slice::<f32>().unwrap_or_default();
                    if let Some(what) = non_finite(values) {
                        // Written, they would replace good adapters with ones that give NaN.
                        return Err(LlmError::NonFinite {
                            tensor: name,
                            file: "the trained adapters (nothing was written)".into(),
                            what,
                        });
                    }
                    tensors.push((name, data.as_bytes().to_vec(), shape));
                }
            }
        }
        if tensors.is_empty() {
            return Err(LlmError::Adapter("the model has no adapter to save".into()));
        }
        let weights = dir.join(WEIGHTS);
        let views = tensors
            .iter()
            .map(|(name, bytes, shape)| {
                TensorView::new(Dtype::F32, shape.clone(), bytes).map(|v| (name.clone(), v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| write_error(&weights, &e))?;
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        let bytes =
            safetensors::serialize(views, Some(metadata)).map_err(|e| write_error(&weights, &e))?;
        let config = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model,
            "r": spec.rank,
            "lora_alpha": spec.alpha,
            "lora_dropout": spec.dropout,
            "target_modules": spec.target_modules,
            "use_rslora": spec.use_rslora,
            "use_dora": false,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "modules_to_save": null,
            "layers_to_transform": null,
        });
        let text = serde_json::to_string_pretty(&config)
            .map_err(|e| write_error(&dir.join(CONFIG), &e))?;
        // Both files land together or not at all: never a config of one run beside the
        // weights of another.
        let mut staging = Staging::new(dir)?;
        staging.write(WEIGHTS, &bytes)?;
        staging.write(CONFIG, text.as_bytes())?;
        // An older PEFT's pickle beside new safetensors would be a second, stale answer.
        staging.commit(|name| name == "adapter_model.bin")?;
        Ok(())
    }

    /// This model with the adapters of the PEFT folder `dir` attached (and every base weight
    /// frozen).
    ///
    /// # Errors
    /// A folder without `adapter_config.json` or `adapter_model.safetensors`, PEFT settings
    /// Kiln does not apply (DoRA, per-layer ranks, bias training, modules to save), or a
    /// tensor missing or of another shape (named).
    pub fn load_peft(self, dir: &Path) -> Result<(Self, LoraSpec), LlmError> {
        let spec = read_spec(&dir.join(CONFIG))?;
        let mut model = self.with_lora(&spec)?;
        let path = dir.join(WEIGHTS);
        let path = super::folder::regular_file(dir, WEIGHTS)?.unwrap_or(path);
        let bytes = std::fs::read(&path).map_err(|e| LlmError::io(&path, e))?;
        let tensor_error = |reason: String| LlmError::Tensor {
            file: path.display().to_string(),
            reason,
        };
        let file = SafeTensors::deserialize(&bytes).map_err(|e| tensor_error(e.to_string()))?;
        let mut used = 0;
        for (hf_path, _, proj) in model.projections_mut() {
            let Some(adapter) = proj.lora.as_mut() else {
                continue;
            };
            let device = adapter.a.device();
            for (which, param) in [("lora_A", &mut adapter.a), ("lora_B", &mut adapter.b)] {
                let name = format!("base_model.model.{hf_path}.{which}.weight");
                let view = file
                    .tensor(&name)
                    .map_err(|_| tensor_error(format!("{name} is missing")))?;
                let dtype = match view.dtype() {
                    Dtype::F32 => DType::F32,
                    Dtype::BF16 => DType::BF16,
                    Dtype::F16 => DType::F16,
                    other => return Err(tensor_error(format!("{name} is {other:?}"))),
                };
                let [rows, cols] = param.dims();
                // Kiln's shape transposed is PEFT's.
                if view.shape() != [cols, rows] {
                    return Err(tensor_error(format!(
                        "{name} is {:?}, but this model's adapter needs {:?}",
                        view.shape(),
                        [cols, rows]
                    )));
                }
                let data = TensorData::from_bytes_vec(view.data().to_vec(), [cols, rows], dtype)
                    .convert_dtype(DType::F32);
                let values = data.as_slice::<f32>().unwrap_or_default();
                if let Some(what) = non_finite(values) {
                    return Err(LlmError::NonFinite {
                        tensor: name,
                        file: path.display().to_string(),
                        what,
                    });
                }
                let t = Tensor::<B, 2>::from_data(data, &device).transpose();
                *param = Param::initialized(param.id, t.require_grad());
                used += 1;
            }
        }
        let lora_tensors = file.names().iter().filter(|n| n.contains("lora_")).count();
        if lora_tensors != used {
            return Err(tensor_error(format!(
                "holds {lora_tensors} LoRA tensors but its config targets {used} in this model"
            )));
        }
        Ok((model, spec))
    }
}

fn write_error(path: &Path, e: &dyn std::fmt::Display) -> LlmError {
    LlmError::Output(kiln_core::output::OutputError::io(
        "encode",
        path,
        std::io::Error::other(e.to_string()),
    ))
}

/// Warns when the adapters of `adapter_dir` record another base model than `base_dir`:
/// applied to a model they were not trained on, adapters of the right shapes still load and
/// produce text, only meaningless text.
pub fn check_peft_base(adapter_dir: &Path, base_dir: &Path) {
    let Ok(text) = std::fs::read_to_string(adapter_dir.join(CONFIG)) else {
        return;
    };
    let Some(recorded) = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|json| {
            json.get("base_model_name_or_path")?
                .as_str()
                .map(str::to_string)
        })
        .filter(|name| !name.is_empty())
    else {
        return;
    };
    if !same_base(&recorded, base_dir) {
        tracing::warn!(
            "the adapters in {} were trained on {recorded}, not on {}; applied to another base \
             they give meaningless output",
            adapter_dir.display(),
            base_dir.display()
        );
    }
}

/// Whether `recorded`, an adapter's `base_model_name_or_path`, names the folder `base_dir`:
/// the same path, or a hub name (`org/name`) whose `name` is a folder of the path or whose
/// cache folder (`models--org--name`) holds it.
fn same_base(recorded: &str, base_dir: &Path) -> bool {
    let canonical = |p: &Path| p.canonicalize().ok();
    let base = base_dir.to_string_lossy();
    let last = recorded
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(recorded);
    canonical(Path::new(recorded)).is_some_and(|r| Some(r) == canonical(base_dir))
        || base.contains(&format!("models--{}", recorded.replace('/', "--")))
        || base_dir
            .components()
            .any(|c| c.as_os_str().to_string_lossy() == last)
}

/// PEFT's `adapter_config.json`, refusing what Kiln does not apply.
fn read_spec(path: &Path) -> Result<LoraSpec, LlmError> {
    let bad = |reason: String| LlmError::Config {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| LlmError::io(path, e))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if let Some(kind) = json
        .get("peft_type")
        .and_then(|v| v.as_str())
        .filter(|k| *k != "LORA")
    {
        return Err(bad(format!("peft_type '{kind}' is not LoRA")));
    }
    let truthy = |key: &str| json.get(key).is_some_and(|v| v.as_bool() == Some(true));
    let present = |key: &str| {
        json.get(key)
            .is_some_and(|v| !(v.is_null() || v.as_object().is_some_and(|o| o.is_empty())))
    };
    for key in ["use_dora", "lora_bias"] {
        if truthy(key) {
            return Err(bad(format!("{key} = true is not supported")));
        }
    }
    for key in [
        "rank_pattern",
        "alpha_pattern",
        "layers_to_transform",
        "modules_to_save",
    ] {
        if present(key) {
            return Err(bad(format!("{key} is not supported")));
        }
    }
    if let Some(bias) = json
        .get("bias")
        .and_then(|v| v.as_str())
        .filter(|b| *b != "none")
    {
        return Err(bad(format!("bias '{bias}' is not supported (only 'none')")));
    }
    let targets = match json.get("target_modules") {
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("target_modules must be names".into()))?,
        _ => return Err(bad("target_modules must be a list of module names".into())),
    };
    let field = |key: &str| {
        json.get(key)
            .ok_or_else(|| bad(format!("{key} is missing")))
    };
    let rank = field("r")?
        .as_u64()
        .and_then(|r| usize::try_from(r).ok())
        .ok_or_else(|| bad(format!("r must be a whole number, got {}", json["r"])))?;
    let alpha = field("lora_alpha")?.as_f64().ok_or_else(|| {
        bad(format!(
            "lora_alpha must be a number, got {}",
            json["lora_alpha"]
        ))
    })?;
    let spec = LoraSpec {
        rank,
        alpha: alpha as f32,
        target_modules: targets,
        use_rslora: truthy("use_rslora"),
        dropout: match json.get("lora_dropout") {
            None | Some(serde_json::Value::Null) => 0.0,
            Some(v) => v
                .as_f64()
                .ok_or_else(|| bad(format!("lora_dropout must be a number, got {v}")))?,
        },
    };
    spec.validate()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adapter_s_base_is_recognised_by_path_hub_name_or_cache_folder() {
        let cache = Path::new("/h/hub/models--HuggingFaceTB--SmolLM2-135M/snapshots/abc");
        assert!(same_base("HuggingFaceTB/SmolLM2-135M", cache));
        assert!(same_base(
            "HuggingFaceTB/SmolLM2-135M",
            Path::new("/m/SmolLM2-135M")
        ));
        assert!(same_base("/m/SmolLM2-135M/", Path::new("/m/SmolLM2-135M")));
        assert!(!same_base("meta-llama/Llama-3.2-1B", cache));
        assert!(!same_base(
            "HuggingFaceTB/SmolLM2-360M",
            Path::new("/m/SmolLM2-135M")
        ));
    }
}
