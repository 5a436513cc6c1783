//! The JSON summary of a fine-tuning run (`--json`).

/// One fine-tuning run's results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FinetuneReport {
    /// The model folder.
    pub model: String,
    /// The strategy that ran (`auto` resolved).
    pub strategy: String,
    /// Ranks.
    pub world: usize,
    /// The backend.
    pub backend: String,
    /// Whether the base was held in 4 bits.
    pub load_in_4bit: bool,
    /// Whether every weight trained (no adapters).
    pub full: bool,
    /// Optimizer steps trained by this run.
    pub steps: usize,
    /// The checkpoint step the run resumed from.
    pub resumed_from: Option<usize>,
    /// The checkpoint step folder saved last, if any.
    pub saved: Option<String>,
    /// Sequences per step, all ranks together.
    pub global_batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// The first step's loss.
    pub first_loss: f64,
    /// The last step's loss.
    pub final_loss: f64,
    /// Every step's loss.
    pub losses: Vec<f64>,
    /// Seconds spent training.
    pub wall_s: f64,
    /// Sequence positions (padding included) per second of training.
    pub tokens_per_s: f64,
    /// The process's peak resident memory, every rank of it together (Linux), in bytes.
    pub peak_host_bytes: Option<u64>,
    /// Each rank's totals, as `kiln train --json` reports them: times, traffic, the bytes it
    /// holds, and its counted peak and held bytes (with `KILN_COUNT_MEMORY=1`).
    pub ranks: Vec<kiln_core::strategy::RankReport>,
    /// The adapters' folder; with `full`, the whole model's.
    pub adapters: String,
    /// The merged model's folder, if written.
    pub merged: Option<String>,
    /// Every held-out evaluation, in step order (none without `--eval-data` or
    /// `--eval-split`).
    pub evals: Vec<super::eval::EvalPoint>,
    /// The evaluation of the lowest loss.
    pub best_eval: Option<super::eval::EvalPoint>,
    /// The checkpoint step of the lowest eval loss, kept whatever `--keep` says.
    pub best_checkpoint: Option<String>,
}
