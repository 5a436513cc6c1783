//! What the strategy benchmark writes: the JSON report, its Markdown table, and the
//! comparison with an earlier report.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::models::Round;
use super::{Matrix, Scenario};
use crate::stats::Summary;

/// A whole run: what was measured and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The backend the ranks ran on.
    pub backend: String,
    /// The matrix that ran.
    pub matrix: Matrix,
    /// One entry per scenario, in the matrix's order.
    pub results: Vec<ScenarioResult>,
}

/// One scenario's figures over its rounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioResult {
    /// The scenario.
    pub scenario: Scenario,
    /// Samples per optimizer step.
    pub batch: usize,
    /// Milliseconds per optimizer step, over the rounds.
    pub step_ms: Summary,
    /// Samples per second of the median round.
    pub samples_per_s: f64,
    /// Each rank's time per step in the median round.
    pub ranks: Vec<RankTimes>,
}

/// One rank's time per optimizer step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankTimes {
    /// The rank.
    pub rank: usize,
    /// Forward, backward and optimizer, in milliseconds.
    pub compute_ms: f64,
    /// Gradient and parameter synchronisation, in milliseconds.
    pub communication_ms: f64,
    /// Waiting for another pipeline stage, in milliseconds.
    pub idle_ms: f64,
    /// Bytes of the parameters the rank holds.
    #[serde(default)]
    pub param_bytes: u64,
    /// Bytes of the gradients the rank holds during a step.
    #[serde(default)]
    pub grad_bytes: u64,
    /// Bytes of the rank's optimizer state.
    #[serde(default)]
    pub optimizer_bytes: u64,
    /// Tensor-parallel calls per step (inside forward and backward).
    #[serde(default)]
    pub tp_calls: f64,
    /// Elements the rank sent into its tensor-parallel group per step.
    #[serde(default)]
    pub tp_elements: f64,
    /// Milliseconds per step in those calls, waiting for peers included: part of
    /// `compute_ms`, since they run inside the forward and backward.
    #[serde(default)]
    pub tp_ms: f64,
    /// Most bytes of host memory the rank held at once; `None` when the process does not
    /// count its memory.
    #[serde(default)]
    pub peak_bytes: Option<u64>,
}

impl ScenarioResult {
    pub(super) fn new(scenario: Scenario, rounds: &[Round], steps: usize) -> Self {
        let per_step = |d: std::time::Duration| 1e3 * d.as_secs_f64() / steps as f64;
        let step_ms: Vec<f64> = rounds.iter().map(|r| per_step(r.wall)).collect();
        let summary = Summary::of(&step_ms).expect("a scenario runs at least one round");
        let median = rounds
            .iter()
            .zip(&step_ms)
            .find(|(_, ms)| **ms == summary.median)
            .map(|(round, _)| round)
            .expect("the median is one of the rounds");
        Self {
            scenario,
            batch: median.batch,
            step_ms: summary,
            samples_per_s: 1e3 * median.batch as f64 / summary.median,
            ranks: median
                .ranks
                .iter()
                .map(|s| RankTimes {
                    rank: s.rank,
                    compute_ms: per_step(s.compute),
                    communication_ms: per_step(s.communication),
                    idle_ms: per_step(s.idle),
                    param_bytes: s.param_bytes,
                    grad_bytes: s.grad_bytes,
                    optimizer_bytes: s.optimizer_bytes,
                    tp_calls: s.shard_traffic.calls as f64 / steps as f64,
                    tp_elements: s.shard_traffic.elements as f64 / steps as f64,
                    tp_ms: per_step(s.shard_traffic.time),
                    peak_bytes: s.peak_bytes,
                })
                .collect(),
        }
    }

    /// The largest bytes of parameters plus optimizer state over the ranks: what the busiest
    /// device holds besides activations.
    fn held_bytes(&self) -> u64 {
        self.ranks
            .iter()
            .map(|r| r.param_bytes + r.optimizer_bytes)
            .max()
            .unwrap_or(0)
    }

    /// The largest peak memory over the ranks, when counted.
    fn peak_bytes(&self) -> Option<u64> {
        self.ranks.iter().filter_map(|r| r.peak_bytes).max()
    }

    /// The mean over ranks of (compute, tensor-parallel calls within it, communication,
    /// idle) per step.
    fn mean_times(&self) -> (f64, f64, f64, f64) {
        let n = self.ranks.len().max(1) as f64;
        let sum = |f: fn(&RankTimes) -> f64| self.ranks.iter().map(f).sum::<f64>() / n;
        (
            sum(|r| r.compute_ms),
            sum(|r| r.tp_ms),
            sum(|r| r.communication_ms),
            sum(|r| r.idle_ms),
        )
    }
}

impl Report {
    /// The result of `model`'s `single` scenario: the baseline of speed-ups.
    pub fn baseline(&self, scenario: &Scenario) -> Option<&ScenarioResult> {
        self.results.iter().find(|r| {
            r.scenario.model == scenario.model
                && r.scenario.strategy == kiln_core::strategy::StrategyKind::Single
        })
    }
}

/// The report as a Markdown table, one row per scenario, with the speed-up over `single`
/// on the same model and the ideal (the world size).
pub fn markdown(report: &Report) -> String {
    let m = &report.matrix;
    let mut out = format!(
        "Strategies on {} ({:?} scale): {} warm-up + {} timed steps per round, {} round(s) in \
         rotating order, 1 intra-op thread per rank. Step time: median (min–max) over rounds; \
         rank times: mean over ranks, per step, in the median round (tp ms: the part of compute \
         spent in tensor-parallel calls inside the forward and backward); held: the most bytes \
         of parameters and optimizer state on one rank; peak: the most bytes of host memory one \
         rank held at once (activations and buffers included; – when not counted).\n\n",
        report.backend, m.scale, m.warmup, m.steps, m.rounds
    );
    out.push_str(
        "| model | strategy | world | batch | step ms | samples/s | speed-up (ideal) | compute ms | tp ms | comm ms | idle ms | held KiB | peak KiB |\n",
    );
    out.push_str(
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in &report.results {
        let s = &r.scenario;
        let speedup = report
            .baseline(s)
            .map(|b| format!("{:.2}× ({})", r.samples_per_s / b.samples_per_s, s.world))
            .unwrap_or_else(|| "–".into());
        let (compute, tp, comm, idle) = r.mean_times();
        let peak = r
            .peak_bytes()
            .map_or_else(|| "–".to_string(), |b| format!("{:.0}", b as f64 / 1024.0));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.2} ({:.2}–{:.2}) | {:.0} | {speedup} | {compute:.2} | {tp:.2} | {comm:.2} | {idle:.2} | {:.0} | {peak} |",
            s.model,
            s.strategy,
            s.world,
            r.batch,
            r.step_ms.median,
            r.step_ms.min,
            r.step_ms.max,
            r.samples_per_s,
            r.held_bytes() as f64 / 1024.0,
        );
    }
    out
}

/// One scenario's throughput next to an earlier run's.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// The scenario.
    pub scenario: Scenario,
    /// Samples per second now, if this run had the scenario.
    pub new: Option<f64>,
    /// Samples per second in the earlier run, if it had the scenario with the same batch.
    pub old: Option<f64>,
}

impl Comparison {
    /// `new / old`: above 1 is faster now.
    pub fn ratio(&self) -> Option<f64> {
        Some(self.new? / self.old?)
    }
}

/// Whether `old` measured what a run on `backend` at `scale` measures: ratios between
/// different backends or sizes would compare different things.
///
/// # Errors
/// A one-line reason when they differ.
pub fn comparable(old: &Report, backend: &str, scale: super::Scale) -> Result<(), String> {
    if old.backend != backend || old.matrix.scale != scale {
        return Err(format!(
            "the earlier report measured {} at {:?} scale but this run is {backend} at {scale:?} \
             scale; compare runs of the same backend and scale",
            old.backend, old.matrix.scale
        ));
    }
    Ok(())
}

/// Each scenario of `new` against the same scenario (and batch) of `old`, then the scenarios
/// only `old` had, and a table of them.
pub fn compare(new: &Report, old: &Report) -> (Vec<Comparison>, String) {
    let mut rows: Vec<Comparison> = new
        .results
        .iter()
        .map(|r| Comparison {
            scenario: r.scenario,
            new: Some(r.samples_per_s),
            old: old
                .results
                .iter()
                .find(|o| o.scenario == r.scenario && o.batch == r.batch)
                .map(|o| o.samples_per_s),
        })
        .collect();
    rows.extend(
        old.results
            .iter()
            .filter(|o| !new.results.iter().any(|r| r.scenario == o.scenario))
            .map(|o| Comparison {
                scenario: o.scenario,
                new: None,
                old: Some(o.samples_per_s),
            }),
    );
    let mut table = String::from(
        "| model | strategy | world | samples/s old | samples/s new | new / old |\n| --- | --- | ---: | ---: | ---: | ---: |\n",
    );
    let cell = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |v| format!("{v:.0}"));
    for c in &rows {
        let s = &c.scenario;
        let ratio = match (c.new, c.old) {
            (Some(_), Some(_)) => format!("{:.2}×", c.ratio().unwrap_or(f64::NAN)),
            (Some(_), None) => "new scenario (or batch)".into(),
            _ => "not run now".into(),
        };
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} | {ratio} |",
            s.model,
            s.strategy,
            s.world,
            cell(c.old),
            cell(c.new)
        );
    }
    (rows, table)
}
