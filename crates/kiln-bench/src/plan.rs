//! The planner's predictions against measurements: every candidate layout the cost model
//! estimates for a model on this machine, trained and timed, with the error of each
//! prediction, the rank correlation of predicted and measured step times, and whether `auto`'s
//! choice was the measured fastest.
//!
//! The benchmark runs in rounds, and each round calibrates the planner afresh before it times
//! the candidates, as `auto` measures the machine just before its run: a prediction is judged
//! against the timing of its own round. A shared machine's speed drifts by a third over
//! minutes, and a calibration compared with timings taken minutes later would measure that
//! drift, not the cost model. A candidate's row is its median round.

use std::fmt::Write;

use kiln_core::plan::cost::{Layout, Measured, StageSplit, StepTime};
use kiln_core::strategy::StrategyKind;
use serde::{Deserialize, Serialize};

/// One round's prediction and timing of a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RoundTiming {
    /// The step the round's calibration predicts (seconds).
    pub predicted: f64,
    /// The median of the round's timed steps (seconds).
    pub measured: f64,
    /// Whether the round's calibration has `auto` choose it.
    pub chosen: bool,
}

impl RoundTiming {
    /// The prediction's error: predicted over measured, minus one.
    pub fn error(&self) -> f64 {
        self.predicted / self.measured.max(f64::MIN_POSITIVE) - 1.0
    }
}

/// The round whose error is the median of `rounds`' (a round, so the upper of the two middle
/// ones for an even count); `None` for no rounds.
pub fn median_round(rounds: &[RoundTiming]) -> Option<usize> {
    let mut order: Vec<usize> = (0..rounds.len()).collect();
    order.sort_by(|&a, &b| rounds[a].error().total_cmp(&rounds[b].error()));
    order.get(rounds.len() / 2).copied()
}

/// One candidate, predicted and measured: its median round (see [`median_round`]).
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
    /// The blocks of each stage it ran with (one entry without stages).
    #[serde(default)]
    pub blocks: Vec<usize>,
    /// The median round's predicted step, by part (seconds).
    pub predicted: StepTime,
    /// The median round's measured step: the median of its timed steps (seconds).
    pub measured: f64,
    /// Every round's timed steps' interquartile range over their median.
    pub spread: f64,
    /// The median round's predicted bytes of the most loaded rank.
    pub predicted_bytes: f64,
    /// Measured peak bytes of the most loaded rank over every round (`KILN_COUNT_MEMORY=1`),
    /// if counted.
    pub measured_bytes: Option<u64>,
    /// Whether `auto` chooses it at this world size: in the most rounds, the earliest on a
    /// tie (see [`mark_chosen`]).
    pub chosen: bool,
    /// Each round's prediction and timing, in the order the rounds ran.
    #[serde(default)]
    pub rounds: Vec<RoundTiming>,
}

impl PlanRow {
    /// The row's own prediction and timing (its median round's), as a round.
    pub fn as_round(&self) -> RoundTiming {
        RoundTiming {
            predicted: self.predicted.total,
            measured: self.measured,
            chosen: self.chosen,
        }
    }

    /// The prediction's error: predicted over measured, minus one.
    pub fn error(&self) -> f64 {
        self.as_round().error()
    }

    /// The memory prediction's error, when memory was counted.
    pub fn memory_error(&self) -> Option<f64> {
        self.measured_bytes
            .map(|m| self.predicted_bytes / (m.max(1) as f64) - 1.0)
    }
}

/// Marks as chosen, in each model's world, the row `auto` chose in the most rounds (the one
/// it chose first on a tie), and no other.
pub fn mark_chosen(rows: &mut [PlanRow]) {
    let mut groups: Vec<(String, usize)> =
        rows.iter().map(|r| (r.model.clone(), r.world)).collect();
    groups.dedup();
    for (model, world) in groups {
        // (rounds chosen, minus the first round chosen): the most, then the earliest.
        let votes = |r: &PlanRow| {
            let chosen = r.rounds.iter().filter(|t| t.chosen).count();
            let first = r.rounds.iter().position(|t| t.chosen).unwrap_or(usize::MAX);
            (chosen, std::cmp::Reverse(first))
        };
        let best = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.model == model && r.world == world)
            .filter(|(_, r)| r.rounds.iter().any(|t| t.chosen))
            .max_by_key(|(_, r)| votes(r))
            .map(|(i, _)| i);
        for (i, r) in rows.iter_mut().enumerate() {
            if r.model == model && r.world == world {
                r.chosen = Some(i) == best;
            }
        }
    }
}

/// A model's calibration: what the planner measured before predicting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The built-in model.
    pub model: String,
    /// The round it calibrated (from 1).
    #[serde(default = "first")]
    pub round: usize,
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

/// The round of a report calibrated once, before its rounds.
fn first() -> usize {
    1
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

fn layout(row: &PlanRow) -> String {
    let l = &row.layout;
    let blocks: Vec<String> = row.blocks.iter().map(usize::to_string).collect();
    format!(
        "dp{} pp{} tp{}, {}×{}{}{}{}",
        l.dp,
        l.pp,
        l.tp,
        l.micro_batches,
        l.micro_batch,
        if l.recompute { " rec" } else { "" },
        match l.shard_state.zero_stage() {
            0 => String::new(),
            stage => format!(" zero{stage}"),
        },
        match l.split {
            StageSplit::Even => String::new(),
            split => format!(" {} {}", split.name(), blocks.join("+")),
        }
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
            layout(r),
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
        let rounds = rounds_of(&rows);
        let within = rows.iter().filter(|r| r.error().abs() <= 0.2).count();
        let always = rows
            .iter()
            .filter(|r| (0..rounds).all(|k| round(r, k).error().abs() <= 0.2))
            .count();
        let worst = rows.iter().map(|r| r.error().abs()).fold(0.0, f64::max);
        let correlations: Vec<f64> = (0..rounds)
            .map(|k| {
                let (predicted, measured): (Vec<f64>, Vec<f64>) = rows
                    .iter()
                    .map(|r| (round(r, k).predicted, round(r, k).measured))
                    .unzip();
                spearman(&predicted, &measured)
            })
            .collect();
        let (low, high) = correlations
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &c| {
                (l.min(c), h.max(c))
            });
        let _ = writeln!(
            out,
            "- {model}: {within} of {} predictions within 20 % in their median round (worst \
             {:.0} %), {always} in every one of {rounds} round(s); rank correlation of \
             predicted and measured steps {:.2}, the median of the rounds' ({low:.2} to \
             {high:.2}).",
            rows.len(),
            worst * 100.0,
            crate::stats::Summary::of(&correlations).map_or(0.0, |s| s.median),
        );
        let mut worlds: Vec<usize> = rows.iter().map(|r| r.world).collect();
        worlds.dedup();
        for world in worlds {
            let here: Vec<&PlanRow> = rows.iter().copied().filter(|r| r.world == world).collect();
            if let Some(line) = verdict(&here, rounds) {
                let _ = writeln!(out, "  - world {world}: {line}.");
            }
        }
    }
    out
}

/// The rounds every row of `rows` has: one, the row itself, for a report without rounds.
fn rounds_of(rows: &[&PlanRow]) -> usize {
    rows.iter()
        .map(|r| r.rounds.len().max(1))
        .min()
        .unwrap_or(0)
}

/// `row`'s round `k`; the row itself as its one round when it has none.
fn round(row: &PlanRow, k: usize) -> RoundTiming {
    row.rounds.get(k).copied().unwrap_or_else(|| row.as_round())
}

/// A candidate's measured speed over the rounds: the median of its rounds' timings, so that
/// one round's burst of other work on the machine neither helps nor hurts it.
fn speed(row: &PlanRow, rounds: usize) -> f64 {
    let times: Vec<f64> = (0..rounds).map(|k| round(row, k).measured).collect();
    crate::stats::Summary::of(&times).map_or(row.measured, |s| s.median)
}

/// Whether `auto`'s choice in one world (`here`) was the measured fastest over the rounds.
fn verdict(here: &[&PlanRow], rounds: usize) -> Option<String> {
    let chosen = here.iter().find(|r| r.chosen)?;
    let times_chosen = (0..rounds).filter(|&k| round(chosen, k).chosen).count();
    let fastest = here
        .iter()
        .min_by(|a, b| speed(a, rounds).total_cmp(&speed(b, rounds)))
        .expect("a world has candidates");
    let how = match chosen.layout == fastest.layout {
        true => "the measured fastest".to_string(),
        false => format!(
            "{:.0} % behind the measured fastest ({} {})",
            (speed(chosen, rounds) / speed(fastest, rounds) - 1.0) * 100.0,
            fastest.strategy.name(),
            layout(fastest)
        ),
    };
    Some(format!(
        "auto chooses {} {} (in {times_chosen} of {rounds} round(s)): {how}",
        chosen.strategy.name(),
        layout(chosen),
    ))
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

    fn timing(predicted: f64, measured: f64, chosen: bool) -> RoundTiming {
        RoundTiming {
            predicted,
            measured,
            chosen,
        }
    }

    /// A row of `world` at `dp`, whose rounds are `rounds`, its row their median.
    fn row(world: usize, dp: usize, rounds: Vec<RoundTiming>) -> PlanRow {
        let m = median_round(&rounds).unwrap();
        let total = rounds[m].predicted;
        PlanRow {
            model: "mlp".into(),
            world,
            strategy: match dp == world {
                true => StrategyKind::Ddp,
                false => StrategyKind::Pipeline,
            },
            layout: Layout {
                dp,
                pp: world / dp,
                tp: 1,
                micro_batches: 1,
                micro_batch: 8,
                recompute: false,
                shard_state: kiln_core::plan::ShardState::None,
                split: StageSplit::Even,
            },
            blocks: Vec::new(),
            predicted: StepTime {
                compute: total,
                update: 0.0,
                bubble: 0.0,
                data_parallel: 0.0,
                tensor_parallel: 0.0,
                pipeline: 0.0,
                sync: 0.0,
                total,
            },
            measured: rounds[m].measured,
            spread: 0.0,
            predicted_bytes: 1.0,
            measured_bytes: None,
            chosen: false,
            rounds,
        }
    }

    #[test]
    fn the_median_round_is_the_one_whose_error_is_the_median() {
        let rounds = [
            timing(1.3, 1.0, false),
            timing(0.95, 1.0, false),
            timing(1.1, 1.0, false),
        ];
        assert_eq!(median_round(&rounds), Some(2));
        // Of two, the upper, as a summary's median.
        assert_eq!(median_round(&rounds[..2]), Some(0));
        assert_eq!(median_round(&[]), None);
    }

    #[test]
    fn auto_s_choice_is_the_row_it_chose_in_the_most_rounds_the_earliest_on_a_tie() {
        let mut rows = vec![
            row(
                2,
                2,
                vec![
                    timing(1.0, 1.0, false),
                    timing(1.0, 1.0, true),
                    timing(1.0, 1.0, true),
                ],
            ),
            row(
                2,
                1,
                vec![
                    timing(1.0, 1.0, true),
                    timing(1.0, 1.0, false),
                    timing(1.0, 1.0, false),
                ],
            ),
            row(4, 4, vec![timing(1.0, 1.0, false), timing(1.0, 1.0, true)]),
            row(4, 2, vec![timing(1.0, 1.0, true), timing(1.0, 1.0, false)]),
        ];
        // A stale mark is cleared.
        rows[1].chosen = true;
        mark_chosen(&mut rows);
        let chosen: Vec<bool> = rows.iter().map(|r| r.chosen).collect();
        assert_eq!(chosen, [true, false, false, true]);
    }

    #[test]
    fn the_summary_judges_auto_s_choice_by_each_candidate_s_speed_over_the_rounds() {
        // Auto chose dp2 in both rounds, and dp2 is 11 % slower than dp1 over them (the
        // medians of their rounds' timings, 1.05 and 0.95).
        // dp2's errors are +5 % and +25 %, dp1's +10 % in both.
        let mut rows = vec![
            row(
                2,
                2,
                vec![timing(1.05, 1.0, true), timing(1.375, 1.1, true)],
            ),
            row(
                2,
                1,
                vec![timing(0.99, 0.9, false), timing(1.1, 1.0, false)],
            ),
        ];
        mark_chosen(&mut rows);
        let report = PlanReport {
            backend: "flex".into(),
            global_batch: 8,
            cores: 2,
            calibrations: Vec::new(),
            rows,
        };
        let table = markdown(&report);
        // dp2's median round is its second (+25 %).
        assert!(table.contains("| +25 % |"), "{table}");
        assert!(
            table.contains("1 of 2 predictions within 20 % in their median round (worst 25 %), 1 in every one of 2 round(s)"),
            "{table}"
        );
        assert!(
            table.contains(
                "auto chooses ddp dp2 pp1 tp1, 1×8 (in 2 of 2 round(s)): 11 % behind the measured \
                 fastest (pipeline dp1 pp2 tp1, 1×8)"
            ),
            "{table}"
        );
    }
}
