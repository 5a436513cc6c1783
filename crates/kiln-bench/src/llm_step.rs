//! The users' fine-tuning step, counted: a small LLaMA loaded from a Hugging Face folder, LoRA
//! (or QLoRA on a 4-bit base) of rank 8 on all seven projections, trained by `Single` with the
//! fused AdamW as `kiln finetune` does (in bf16 or f16 with the compute-dtype copies `fit` sets
//! up). Its launches per decoder layer are the difference
//! between a two-layer and a one-layer model's steps.

use std::path::Path;

use burn::data::dataset::InMemDataset;
use burn::tensor::backend::AutodiffBackend;
use kiln_core::data::DataSource;
use kiln_core::optim::{MixedPrecision, Precision};
use kiln_core::strategy::{Single, SingleConfig, Strategy};
use kiln_kernels::{FusedAdamWConfig, LowCopies};
use kiln_nn::llm::{LlmConfig, LlmError, LmBatcher, LoraSpec, TARGET_MODULES, load, load_4bit};
use kiln_nn::lora::QuantConfig;
use kiln_nn::tensor_parallel::ShardedBackend;

use crate::launches::{Counts, measure_step};
use crate::llm::{random_sequences, write_model};

/// Sequences per step of the launch test ([`LlmStep::default`]).
pub const BATCH: usize = 2;
/// Tokens per sequence.
pub const SEQ_LEN: usize = 16;

/// The `config.json` of a LLaMA of `layers` layers of width 64 (4 heads, 2 key-value heads,
/// SwiGLU width 128, a 256-token vocabulary, an untied head).
pub fn config_json(layers: usize) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_hidden_layers": layers,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
        "vocab_size": 256,
        "torch_dtype": "float32",
    })
}

/// Writes the model of [`config_json`] with fresh weights into `dir`.
///
/// # Errors
/// A file that cannot be written.
pub fn write(layers: usize, dir: &Path) -> Result<LlmConfig, LlmError> {
    write_model(&config_json(layers), dir)
}

/// Which fine-tuning step to count.
#[derive(Clone, Copy, Debug)]
pub struct LlmStep {
    /// QLoRA on a 4-bit base rather than LoRA on an f32 one.
    pub four_bit: bool,
    /// The precision the step computes in (`MixedPrecision`, f32 master weights).
    pub precision: Precision,
    /// Sequences per step, of [`SEQ_LEN`] tokens.
    pub batch: usize,
}

impl Default for LlmStep {
    /// LoRA in f32 at [`BATCH`] sequences.
    fn default() -> Self {
        Self {
            four_bit: false,
            precision: Precision::F32,
            batch: BATCH,
        }
    }
}

/// What one decoder layer adds to a step, and what a two-layer model's step costs whole.
#[derive(Clone, Copy, Debug)]
pub struct LayerCounts {
    /// Launches per decoder layer: a two-layer model's step less a one-layer model's.
    pub per_layer: u64,
    /// The two-layer model's launches and host synchronisations per step (the most over the
    /// counted steps).
    pub step: Counts,
}

/// [`count`]s `step` on a one-layer and a two-layer model, written afresh into a temporary
/// folder, one counted step each; their difference is what a decoder layer launches.
///
/// # Errors
/// A folder that cannot be written or loaded.
pub fn per_layer<B>(
    step: LlmStep,
    device: &B::Device,
) -> Result<LayerCounts, Box<dyn std::error::Error>>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    let dir = std::env::temp_dir().join(format!("kiln-llm-launches-{}", std::process::id()));
    let mut per_step = Vec::new();
    for layers in [1, 2] {
        let folder = dir.join(layers.to_string());
        write(layers, &folder)?;
        let counts = count::<B>(&folder, step, 1, device)?;
        per_step.push(Counts {
            launches: counts.iter().map(|c| c.launches).max().unwrap_or(0),
            host_syncs: counts.iter().map(|c| c.host_syncs).max().unwrap_or(0),
        });
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(LayerCounts {
        per_layer: per_step[1].launches - per_step[0].launches,
        step: per_step[1],
    })
}

/// The launches (and host synchronisations) of each of `steps` steps, after two warm-up steps,
/// of fine-tuning the model in `dir` on `device` as `step` says. Needs
/// [`crate::launches::install`]'s subscriber.
///
/// # Errors
/// A folder that does not load.
pub fn count<B>(
    dir: &Path,
    step: LlmStep,
    steps: usize,
    device: &B::Device,
) -> Result<Vec<Counts>, Box<dyn std::error::Error>>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    let LlmStep {
        four_bit,
        precision,
        batch,
    } = step;
    let (config, base) = if four_bit {
        load_4bit::<B>(dir, device, &QuantConfig::new())?
    } else {
        load::<B>(dir, device)?
    };
    let spec = LoraSpec {
        rank: 8,
        alpha: 8.0,
        target_modules: TARGET_MODULES.map(String::from).to_vec(),
        use_rslora: false,
        dropout: 0.0,
    };
    let model = MixedPrecision::new(base.with_lora(&spec)?, precision);
    let optim = FusedAdamWConfig::new().init::<B, _>();
    // One rank and the fused AdamW, as `fit` sets them up in a lower precision: the gradients
    // reach it uncast, it writes the next step's compute-dtype parameters as it steps, and the
    // frozen base's copies are kept across steps.
    let (model, optim) = match precision {
        Precision::F32 => (model, optim),
        _ => {
            let copies = LowCopies::new(precision.dtype());
            copies.set_on(true);
            let model = model
                .with_low_precision_grads()
                .with_low_copies(copies.clone());
            (model, optim.with_low_copies(copies))
        }
    };
    let items = random_sequences(&config, batch * (steps + 2), SEQ_LEN);
    let data = DataSource::new(InMemDataset::new(items), LmBatcher::new(SEQ_LEN));
    let single = SingleConfig {
        grad_accumulation: 1,
        threads_per_rank: Some(1),
    };
    let mut strategy = Single::new(model, optim, data, device.clone(), single)?;
    let mut per_step = Vec::with_capacity(steps);
    for i in 0..steps + 2 {
        let indices: Vec<usize> = (i * batch..(i + 1) * batch).collect();
        let counts = measure_step::<B, _, _>(device, || strategy.step(&indices, 1e-4))?;
        if i >= 2 {
            per_step.push(counts);
        }
    }
    Ok(per_step)
}
