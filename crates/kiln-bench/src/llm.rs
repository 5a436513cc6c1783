//! The pretrained-LLM benchmark: a LLaMA-shaped checkpoint of a chosen size with random
//! weights, written as a Hugging Face folder; the host memory of loading it in f32 and in 4
//! bits; and the tokens per second of LoRA (or QLoRA) fine-tuning it through strategies side
//! by side.
//!
//! Loading is measured in a fresh process per mode (the system keeps a process's peak, not a
//! phase's), which the `kiln bench llm` command starts; [`measure_load`] is what that process
//! runs.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant};

use burn::backend::Flex;
use burn::data::dataset::InMemDataset;
use burn::tensor::backend::AutodiffBackend;
use kiln_core::data::DataSource;
use kiln_core::fit::{Training, fit};
use kiln_core::optim::PerformanceConfig;
use kiln_core::plan::{Plan, PlanRequest};
use kiln_core::strategy::{PerformanceSpec, StepOutput, StrategyConfigs, StrategyKind};
use kiln_kernels::FusedAdamWConfig;
use kiln_nn::llm::{CausalLm, LlmConfig, LlmError, LmBatcher, LmItem, LoraSpec, TARGET_MODULES};
use kiln_nn::llm::{load, load_4bit};
use kiln_nn::lora::QuantConfig;
use kiln_nn::tensor_parallel::ShardedBackend;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::memory::{AnonPeak, anon_bytes, peak_host_bytes};
use crate::stats::Summary;

/// The shape of the generated model: LLaMA's (grouped-query attention, SwiGLU, an untied
/// head; 4 key/value heads and a 32,000-token vocabulary but for the tiny one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LlmSize {
    /// 2 layers of width 64 and a 256-token vocabulary (0.1 M parameters): a smoke test.
    Tiny,
    /// 12 layers of width 768 (125 M parameters).
    M100,
    /// 16 layers of width 1536 (501 M parameters).
    M500,
}

impl LlmSize {
    /// The model's `config.json`, as `transformers` writes a `LlamaConfig`.
    pub fn config_json(self) -> serde_json::Value {
        let (layers, hidden, heads, kv_heads, intermediate, vocab) = match self {
            Self::Tiny => (2, 64, 4, 2, 128, 256),
            Self::M100 => (12, 768, 12, 4, 2048, 32_000),
            Self::M500 => (16, 1536, 12, 4, 4096, 32_000),
        };
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "hidden_size": hidden,
            "intermediate_size": intermediate,
            "num_attention_heads": heads,
            "num_hidden_layers": layers,
            "num_key_value_heads": kv_heads,
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": false,
            "vocab_size": vocab,
            "torch_dtype": "float32",
        })
    }
}

impl FromStr for LlmSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tiny" => Ok(Self::Tiny),
            "100m" => Ok(Self::M100),
            "500m" => Ok(Self::M500),
            other => Err(format!("unknown size '{other}'; use tiny, 100m or 500m")),
        }
    }
}

impl fmt::Display for LlmSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tiny => "tiny",
            Self::M100 => "100m",
            Self::M500 => "500m",
        })
    }
}

/// Writes a model of `size` with freshly initialised weights into `dir` as a Hugging Face
/// folder: an f32 `model.safetensors`, then `config.json`, so that a folder with a config
/// holds a whole model even if writing was interrupted.
///
/// # Errors
/// A file that cannot be written.
pub fn write_checkpoint(size: LlmSize, dir: &Path) -> Result<LlmConfig, LlmError> {
    write_model(&size.config_json(), dir)
}

/// Writes a model of `config` (a `config.json`'s value) with freshly initialised weights into
/// `dir`, as [`write_checkpoint`] does.
///
/// # Errors
/// A file that cannot be written, or a config Kiln does not take.
pub fn write_model(config: &serde_json::Value, dir: &Path) -> Result<LlmConfig, LlmError> {
    let io = |e: std::io::Error| LlmError::Io {
        path: dir.display().to_string(),
        reason: e.to_string(),
    };
    // The config waits in a folder of its own, which save_pretrained copies it from last.
    let staging = dir.join(".config");
    std::fs::create_dir_all(&staging).map_err(io)?;
    let text = serde_json::to_string_pretty(config).expect("a JSON value");
    std::fs::write(staging.join("config.json"), &text).map_err(io)?;
    let config = LlmConfig::from_json(&text)?;
    config
        .init::<Flex>(&Default::default())
        .save_pretrained(dir, &staging)?;
    std::fs::remove_dir_all(&staging).map_err(io)?;
    Ok(config)
}

/// What loading a folder cost the host, measured in a process that did nothing before.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadMemory {
    /// Projections quantised to 4 bits as they were read.
    pub four_bit: bool,
    /// Parameters of the model.
    pub parameters: usize,
    /// Bytes of the folder's safetensors files.
    pub file_bytes: u64,
    /// Seconds the load took.
    pub seconds: f64,
    /// The process's peak resident set (`VmHWM`), mapped file pages included.
    pub peak_rss_bytes: u64,
    /// The peak of anonymous memory while loading (sampled every millisecond), less what the
    /// process held before.
    pub peak_anon_bytes: u64,
    /// Anonymous memory the loaded model holds, less what the process held before.
    pub held_bytes: u64,
}

impl LoadMemory {
    /// Bytes held per parameter once loaded.
    pub fn bytes_per_parameter(&self) -> f64 {
        self.held_bytes as f64 / self.parameters as f64
    }
}

/// Loads the folder `dir` on the CPU, in f32 or with its projections in 4 bits (NF4), and
/// reports the host memory it took. Run it in a fresh process: the system's peak counts
/// everything the process did before.
///
/// # Errors
/// A folder that does not load.
pub fn measure_load(dir: &Path, four_bit: bool) -> Result<LoadMemory, LlmError> {
    let file_bytes = std::fs::read_dir(dir)
        .map_err(|e| LlmError::Io {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    let before = anon_bytes().unwrap_or(0);
    let sampler = AnonPeak::start(Duration::from_millis(1));
    let started = Instant::now();
    let device = Default::default();
    let (config, model) = if four_bit {
        load_4bit::<Flex>(dir, &device, &QuantConfig::new())?
    } else {
        load::<Flex>(dir, &device)?
    };
    let seconds = started.elapsed().as_secs_f64();
    let held = anon_bytes().unwrap_or(0).saturating_sub(before);
    let peak = sampler.finish().saturating_sub(before);
    drop(model);
    Ok(LoadMemory {
        four_bit,
        parameters: config.parameters(),
        file_bytes,
        seconds,
        peak_rss_bytes: peak_host_bytes().unwrap_or(0),
        peak_anon_bytes: peak,
        held_bytes: held,
    })
}

/// A fine-tuning run to time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinetuneCase {
    /// The strategy.
    pub strategy: StrategyKind,
    /// Its ranks (a pipeline's are its stages).
    pub world: usize,
}

impl fmt::Display for FinetuneCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}×{}", self.strategy, self.world)
    }
}

/// How the fine-tuning runs are set up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FinetuneSetup {
    /// Quantise the base to 4 bits (QLoRA).
    pub four_bit: bool,
    /// Sequences per optimizer step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// The adapters' rank (on all seven projections, alpha = rank).
    pub lora_rank: usize,
    /// Untimed steps first.
    pub warmup: usize,
    /// Timed steps.
    pub steps: usize,
    /// Recompute each decoder layer's activations in the backward.
    #[serde(default)]
    pub gradient_checkpointing: bool,
}

/// The throughput of one case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FinetuneResult {
    /// What ran.
    pub case: FinetuneCase,
    /// Milliseconds per timed step.
    pub step_ms: Summary,
    /// Trained tokens per second at the median step.
    pub tokens_per_s: f64,
    /// The last step's loss.
    pub final_loss: f64,
    /// The process's peak resident set after the run.
    pub peak_rss_bytes: u64,
    /// The most any rank held at once, counted (`KILN_COUNT_MEMORY=1`); `None` uncounted.
    #[serde(default)]
    pub peak_rank_bytes: Option<u64>,
}

/// Fine-tunes the folder `dir` with fresh adapters through every case in turn, on the CPU, on
/// random token sequences (every token trained), and times its steps, on backend `B`: a case of
/// `world` ranks runs on the first `world` of `devices`.
///
/// # Errors
/// A folder that does not load, too few devices, or a plan or run that fails.
pub fn finetune_throughput<B>(
    dir: &Path,
    cases: &[FinetuneCase],
    setup: &FinetuneSetup,
    devices: &[B::Device],
) -> Result<Vec<FinetuneResult>, Box<dyn std::error::Error>>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    let device = devices.first().ok_or("no device to fine-tune on")?;
    let (config, base) = if setup.four_bit {
        load_4bit::<B>(dir, device, &QuantConfig::new())?
    } else {
        load::<B>(dir, device)?
    };
    let spec = LoraSpec {
        rank: setup.lora_rank,
        alpha: setup.lora_rank as f32,
        target_modules: TARGET_MODULES.map(String::from).to_vec(),
        use_rslora: false,
        dropout: 0.0,
    };
    let start = base
        .with_lora(&spec)?
        .with_gradient_checkpointing(setup.gradient_checkpointing);
    let total = setup.warmup + setup.steps;
    let items = random_sequences(&config, setup.batch * total, setup.seq_len);
    let mut results = Vec::with_capacity(cases.len());
    for &case in cases {
        let ranks = devices.get(..case.world).ok_or_else(|| {
            format!(
                "{case} needs {} devices, {} given",
                case.world,
                devices.len()
            )
        })?;
        results.push(time_case::<B>(&start, case, setup, items.clone(), ranks)?);
    }
    Ok(results)
}

fn time_case<B>(
    start: &CausalLm<B>,
    case: FinetuneCase,
    setup: &FinetuneSetup,
    items: Vec<LmItem>,
    devices: &[B::Device],
) -> Result<FinetuneResult, Box<dyn std::error::Error>>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    let mut configs = StrategyConfigs::default();
    if case.strategy == StrategyKind::Pipeline {
        configs.pipeline.stages = case.world;
    }
    configs.pipeline.micro_batches = 2.min(setup.batch);
    let plan = Plan::resolve(
        PlanRequest::new(case.strategy, setup.batch)
            .with_world(case.world)
            .with_configs(configs),
    )?;
    let steps = setup.warmup + setup.steps;
    let training = Training {
        steps,
        seed: 0,
        lr: &|_| 1e-4,
        resume: None,
        keep_optimizer_state: false,
        save_every: None,
        eval_every: None,
        lengths: None,
        stop: None,
    };
    // The optimizer `kiln finetune` trains with.
    let optim = PerformanceSpec::new(FusedAdamWConfig::new(), PerformanceConfig::default())?;
    let mut ends = Vec::with_capacity(steps + 1);
    let mut last_loss = f64::NAN;
    ends.push(Instant::now());
    let mut hook = |_, out: &StepOutput| {
        ends.push(Instant::now());
        last_loss = out.loss;
    };
    let data = DataSource::new(InMemDataset::new(items), LmBatcher::new(setup.seq_len));
    let (_, record) = fit(
        &plan,
        &training,
        devices.to_vec(),
        start.clone(),
        &optim,
        data,
        &mut hook,
    )?;
    let times: Vec<f64> = ends
        .windows(2)
        .skip(setup.warmup)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .collect();
    let step_ms = Summary::of(&times).ok_or("no timed step")?;
    Ok(FinetuneResult {
        case,
        tokens_per_s: (setup.batch * setup.seq_len) as f64 / (step_ms.median / 1e3),
        step_ms,
        final_loss: last_loss,
        peak_rss_bytes: peak_host_bytes().unwrap_or(0),
        peak_rank_bytes: record.ranks.iter().filter_map(|r| r.peak_bytes).max(),
    })
}

/// `n` sequences of `seq_len + 1` random tokens of the model's vocabulary, every target
/// trained.
pub(crate) fn random_sequences(config: &LlmConfig, n: usize, seq_len: usize) -> Vec<LmItem> {
    let mut rng = StdRng::seed_from_u64(0);
    (0..n)
        .map(|_| {
            let tokens = (0..=seq_len)
                .map(|_| rng.random_range(0..config.vocab_size as u32))
                .collect();
            LmItem::all_trained(tokens)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_checkpoint_loads_and_fine_tunes_through_single_and_ddp() {
        let dir = std::env::temp_dir().join(format!("kiln-bench-llm-{}", std::process::id()));
        let config = write_checkpoint(LlmSize::Tiny, &dir).unwrap();
        assert_eq!(config.num_hidden_layers, 2);
        let memory = measure_load(&dir, true).unwrap();
        assert_eq!(memory.parameters, config.parameters());
        assert!(memory.file_bytes >= 4 * config.parameters() as u64);
        let setup = FinetuneSetup {
            four_bit: true,
            batch: 4,
            seq_len: 8,
            lora_rank: 4,
            warmup: 1,
            steps: 2,
            gradient_checkpointing: false,
        };
        let cases = [
            FinetuneCase {
                strategy: StrategyKind::Single,
                world: 1,
            },
            FinetuneCase {
                strategy: StrategyKind::Ddp,
                world: 2,
            },
        ];
        let devices = vec![Default::default(); 2];
        let results =
            finetune_throughput::<burn::backend::Autodiff<Flex>>(&dir, &cases, &setup, &devices)
                .unwrap();
        assert_eq!(results.len(), 2);
        for r in &results {
            assert!(r.tokens_per_s > 0.0 && r.final_loss.is_finite(), "{r:?}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
