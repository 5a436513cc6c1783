//! The planner's predictions against measurements: every candidate layout the cost model
//! estimates for a model on this machine, trained and timed, with the error of each
//! prediction, the rank correlation of predicted and measured step times, and whether `auto`'s
//! choice was the measured fastest.

use std::fmt::Write;

use kiln_core::plan::cost::{Layout, Measured, StepTime};
use kiln_core::strategy::StrategyKind;
use serde::{Deserialize, Serialize};

/// One candidate, predicted and measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanRow {
    /// The built-in model.
    pub model: String,
    /// Ranks.
    pub world: usize,
    /// The strategy that ran it.
    pub strategy: StrategyKind,
    /// Its mesh and micro-batches.
    pub layout: Layout,
    /// The predicted step, by part (seconds).
    pub predicted: StepTime,
    /// The measured step: the median over every round's timed steps (seconds).
    pub measured: f64,
    /// The timed steps' interquartile range over their median.
    pub spread: f64,
    /// Predicted bytes of the most loaded rank.
    pub predicted_bytes: f64,
    /// Measured peak bytes of the most loaded rank (`KILN_COUNT_MEMORY=1`), if counted.
    pub measured_bytes: Option<u64>,
    /// Whether `auto` chooses it at this world size.
    pub chosen: bool,
}

impl PlanRow {
    /// The prediction's error: predicted over measured, minus one.
    pub fn error(&self) -> f64 {
        self.predicted.total / self.measured.max(f64::MIN_POSITIVE) - 1.0
    }

    /// The memory prediction's error, when memory was counted.
    pub fn memory_error(&self) -> Option<f64> {
        self.measured_bytes
            .map(|m| self.predicted_bytes / (m.max(1) as f64) - 1.0)
    }
}

/// A model's calibration: what the planner measured before predicting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The built-in model.
    pub model: String,
    /// Its step's costs on one core.
    pub measured: Measured,
    /// The collective's latency (seconds) between two ranks.
    pub latency: f64,
    /// The collective's bandwidth (bytes per second) between two ranks.
    pub bandwidth: f64,
}

/// What `kiln bench plan` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    /// The backend the candidates ran on (`flex`, `cuda`, ...).
    #[serde(default = "flex")]
    pub backend: String,
    /// Samples per step.
    pub global_batch: usize,
    /// The machine's cores.
    pub cores: usize,
    /// Each model's calibration.
    pub calibrations: Vec<Calibration>,
    /// Every candidate of every model and world.
    pub rows: Vec<PlanRow>,
}

/// The backend of a report written before reports named theirs.
fn flex() -> String {
    "flex".into()
}

/// Spearman's rank correlation of `a` and `b` (ties share their mean rank); 0 for fewer than
/// two pairs.
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    fn ranks(v: &[f64]) -> Vec<f64> {
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by(|&i, &j| v[i].total_cmp(&v[j]));
        let mut ranks = vec![0.0; v.len()];
        let mut i = 0;
        while i < order.len() {
            let mut j = i;
            while j + 1 < order.len() && v[order[j + 1]] == v[order[i]] {
                j += 1;
            }
            let mean = (i + j) as f64 / 2.0;
            for &k in &order[i..=j] {
                ranks[k] = mean;
            }
            i = j + 1;
        }
        ranks
    }
    let n = a.len().min(b.len());
    if n < 2 {
        return 0.0;
    }
    let (ra, rb) = (ranks(&a[..n]), ranks(&b[..n]));
    let mean = (n - 1) as f64 / 2.0;
    let (mut cov, mut va, mut vb) = (0.0, 0.0, 0.0);
    for (x, y) in ra.iter().zip(&rb) {
        cov += (x - mean) * (y - mean);
        va += (x - mean) * (x - mean);
        vb += (y - mean) * (y - mean);
    }
    match va * vb {
        d if d > 0.0 => cov / d.sqrt(),
        _ => 0.0,
    }
}

fn layout(l: &Layout) -> String {
    format!(
        "dp{} pp{} tp{}, {}×{}{}",
        l.dp,
        l.pp,
        l.tp,
        l.micro_batches,
        l.micro_batch,
        if l.recompute { " rec" } else { "" }
    )
}

/// The report as Markdown: every row, then each model's summary.
pub fn markdown(report: &PlanReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Global batch {}, backend {}, {} core(s).\n\n| model | world | strategy | layout | predicted ms \
         | measured ms (spread) | error | predicted KiB | peak KiB | error | auto |\n\
         | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        report.global_batch, report.backend, report.cores
    );
    for r in &report.rows {
        let (peak, memory_error) = match (r.measured_bytes, r.memory_error()) {
            (Some(b), Some(e)) => (
                format!("{:.0}", b as f64 / 1024.0),
                format!("{:+.0} %", e * 100.0),
            ),
            _ => ("-".into(), "-".into()),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.3} | {:.3} ({:.0} %) | {:+.0} % | {:.0} | {} | {} | {} |",
            r.model,
            r.world,
            r.strategy.name(),
            layout(&r.layout),
            r.predicted.total * 1e3,
            r.measured * 1e3,
            r.spread * 100.0,
            r.error() * 100.0,
            r.predicted_bytes / 1024.0,
            peak,
            memory_error,
            if r.chosen { "chosen" } else { "" }
        );
    }
    let mut models: Vec<&str> = report.rows.iter().map(|r| r.model.as_str()).collect();
    models.dedup();
    let _ = writeln!(out);
    for model in models {
        let rows: Vec<&PlanRow> = report.rows.iter().filter(|r| r.model == model).collect();
        let within = rows.iter().filter(|r| r.error().abs() <= 0.2).count();
        let worst = rows.iter().map(|r| r.error().abs()).fold(0.0, f64::max);
        let predicted: Vec<f64> = rows.iter().map(|r| r.predicted.total).collect();
        let measured: Vec<f64> = rows.iter().map(|r| r.measured).collect();
        let _ = writeln!(
            out,
            "- {model}: {within} of {} predictions within 20 % (worst {:.0} %); rank \
             correlation of predicted and measured steps {:.2}.",
            rows.len(),
            worst * 100.0,
            spearman(&predicted, &measured)
        );
        let mut worlds: Vec<usize> = rows.iter().map(|r| r.world).collect();
        worlds.dedup();
        for world in worlds {
            let here: Vec<&&PlanRow> = rows.iter().filter(|r| r.world == world).collect();
            let fastest = here
                .iter()
                .min_by(|a, b| a.measured.total_cmp(&b.measured))
                .expect("a world has candidates");
            let Some(chosen) = here.iter().find(|r| r.chosen) else {
                continue;
            };
            let verdict = match chosen.layout == fastest.layout {
                true => "the measured fastest".to_string(),
                false => format!(
                    "{:.0} % behind the measured fastest ({} {})",
                    (chosen.measured / fastest.measured - 1.0) * 100.0,
                    fastest.strategy.name(),
                    layout(&fastest.layout)
                ),
            };
            let _ = writeln!(
                out,
                "  - world {world}: auto chooses {} {}: {verdict}.",
                chosen.strategy.name(),
                layout(&chosen.layout)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_correlation_sees_order_not_scale() {
        assert!((spearman(&[1.0, 2.0, 3.0], &[10.0, 200.0, 3000.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        assert_eq!(spearman(&[1.0], &[1.0]), 0.0);
        let tied = spearman(&[1.0, 1.0, 2.0], &[1.0, 2.0, 3.0]);
        assert!(tied > 0.8 && tied < 1.0, "{tied}");
    }
}
