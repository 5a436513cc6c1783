//! The JSON summary of a training run (`--json`).

use kiln_core::strategy::RankReport;

/// One run's results: the keys other tools and tests compare.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrainReport {
    /// The strategy that ran (`auto` resolved).
    pub strategy: String,
    /// Why it was chosen.
    pub strategy_reason: String,
    /// The ranks along the plan's axes (`dp=2 × tp=2`).
    pub mesh: String,
    /// The model.
    pub model: String,
    /// The backend.
    pub backend: String,
    /// Ranks.
    pub world: usize,
    /// Optimizer steps this run trained.
    pub steps: usize,
    /// The checkpoint's step this run resumed from; absent for a fresh run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<usize>,
    /// The step the run ended at (`resumed_from + steps`).
    pub last_step: usize,
    /// The checkpoint saved at the end, when the run saves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saved: Option<String>,
    /// Samples per step over all ranks.
    pub global_batch: usize,
    /// Micro-batches per rank and step.
    pub grad_accumulation: usize,
    /// Seed.
    pub seed: u64,
    /// Loss of the first step.
    pub first_loss: Option<f64>,
    /// Loss of the last step.
    pub final_loss: Option<f64>,
    /// Steps the NaN guard skipped.
    pub skipped_steps: usize,
    /// f64 sum of every final parameter value.
    pub param_sum: f64,
    /// f64 sum of squares of every final parameter value.
    pub param_sq_sum: f64,
    /// Parameter values.
    pub param_count: u64,
    /// Seconds of the training loop.
    pub wall_s: f64,
    /// Samples trained per second.
    pub samples_per_s: f64,
    /// Per-rank totals.
    pub ranks: Vec<RankReport>,
    /// This process's high-water mark of resident memory, in bytes (Linux's `VmHWM`): an
    /// independent bound on its ranks' `peak_bytes` together; `null` where unknown.
    pub peak_resident_bytes: Option<u64>,
}
