//! The users' fine-tuning step, counted: a small LLaMA loaded from a Hugging Face folder, LoRA
//! (or QLoRA on a 4-bit base) of rank 8 on all seven projections, trained by `Single` with the
//! fused AdamW as `kiln finetune` does. Its launches per decoder layer are the difference
//! between a two-layer and a one-layer model's steps.

use std::path::Path;

use burn::data::dataset::InMemDataset;
use burn::tensor::backend::AutodiffBackend;
use kiln_core::data::DataSource;
use kiln_core::optim::{MixedPrecision, Precision};
use kiln_core::strategy::{Single, SingleConfig, Strategy};
use kiln_kernels::FusedAdamWConfig;
use kiln_nn::llm::{LlmConfig, LlmError, LmBatcher, LoraSpec, TARGET_MODULES, load, load_4bit};
use kiln_nn::lora::QuantConfig;
use kiln_nn::tensor_parallel::ShardedBackend;

use crate::launches::{Counts, measure_step};
use crate::llm::{random_sequences, write_model};

/// Sequences per step.
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

/// The launches (and host synchronisations) of each of `steps` steps, after two warm-up steps,
/// of fine-tuning the model in `dir` on `device`: LoRA, or QLoRA when `four_bit`, in
/// `precision`. Needs [`crate::launches::install`]'s subscriber.
///
/// # Errors
/// A folder that does not load.
pub fn count<B>(
    dir: &Path,
    four_bit: bool,
    precision: Precision,
    steps: usize,
    device: &B::Device,
) -> Result<Vec<Counts>, Box<dyn std::error::Error>>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
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
    let items = random_sequences(&config, BATCH * (steps + 2), SEQ_LEN);
    let data = DataSource::new(InMemDataset::new(items), LmBatcher::new(SEQ_LEN));
    let single = SingleConfig {
        grad_accumulation: 1,
        threads_per_rank: Some(1),
    };
    let optim = FusedAdamWConfig::new().init::<B, _>();
    let mut strategy = Single::new(model, optim, data, device.clone(), single)?;
    let mut per_step = Vec::with_capacity(steps);
    for i in 0..steps + 2 {
        let batch: Vec<usize> = (i * BATCH..(i + 1) * BATCH).collect();
        let counts = measure_step::<B, _, _>(device, || strategy.step(&batch, 1e-4))?;
        if i >= 2 {
            per_step.push(counts);
        }
    }
    Ok(per_step)
}
