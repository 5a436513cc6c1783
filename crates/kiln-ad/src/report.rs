//! The evaluation report: the three curves, the control, and the acceptance checks.

use kiln_kernels::KernelBackend;
use serde::{Deserialize, Serialize};

use crate::config::AdConfig;
use crate::env::Cell;
use crate::eval::{Curve, Memory, in_context, optimal_return, random_policy, source_algorithm};
use crate::model::AdTransformer;

/// The gain (last-10 mean minus episode-1 mean) below which the one-episode control counts as
/// not improving: half the least gain the acceptance asks of AD.
pub const CONTROL_MAX_GAIN: f64 = 1.5;

/// The least fraction of the source's mean return over all episodes that AD's must reach.
pub const PACE: f64 = 0.8;

/// Everything the evaluation measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// Held-out goals evaluated on.
    pub goals: Vec<Cell>,
    /// Runs per goal.
    pub seeds: usize,
    /// Consecutive episodes per run.
    pub episodes: usize,
    /// Mean best return over the goals.
    pub optimal: f64,
    /// The model with its context carried across episodes.
    pub ad: Curve,
    /// The model with its context cut to the current episode.
    pub control: Curve,
    /// Tabular Q-learning from scratch.
    pub source: Curve,
    /// Uniformly random actions.
    pub random: Curve,
    /// The acceptance checks on these curves.
    pub acceptance: Acceptance,
}

/// The checks of in-context learning.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Acceptance {
    /// AD's last-10 mean is ≥ 3 × and ≥ 3 more than its episode-1 mean.
    pub ad_improves: bool,
    /// AD's last-10 mean is ≥ 10 × the random policy's mean.
    pub beats_random: bool,
    /// The one-episode control gains less than [`CONTROL_MAX_GAIN`].
    pub control_flat: bool,
    /// AD's mean over all episodes is ≥ [`PACE`] × the source's: it learns in context about
    /// as fast as the algorithm it was distilled from.
    #[serde(default)]
    pub keeps_pace: bool,
    /// All of the above.
    pub passed: bool,
}

impl Acceptance {
    /// Applies the checks.
    pub fn check(ad: &Curve, control: &Curve, source: &Curve, random: &Curve) -> Self {
        let ad_improves = ad.last10 >= 3.0 * ad.first && ad.last10 >= ad.first + 3.0;
        let beats_random = ad.last10 >= 10.0 * random.mean;
        let control_flat = control.last10 - control.first < CONTROL_MAX_GAIN;
        let keeps_pace = ad.mean >= PACE * source.mean;
        Self {
            ad_improves,
            beats_random,
            control_flat,
            keeps_pace,
            passed: ad_improves && beats_random && control_flat && keeps_pace,
        }
    }
}

/// Evaluates `model` on `goals` (the held-out goals) as `config.eval` says, with the control,
/// the source and the random policy on the same runs. `on_step(done, total)` reports the
/// model's environment steps (AD and control).
pub fn evaluate<B: KernelBackend>(
    model: &AdTransformer<B>,
    config: &AdConfig,
    goals: &[Cell],
    device: &B::Device,
    on_step: &mut dyn FnMut(usize, usize),
) -> EvalReport {
    let (room, eval) = (config.env, &config.eval);
    let per_run = eval.episodes * room.horizon;
    let total = 2 * per_run;
    let seed = config.seed;
    let ad = in_context(
        model,
        room,
        eval,
        seed,
        goals,
        Memory::AcrossEpisodes,
        device,
        &mut |s| on_step(s, total),
    );
    let control = in_context(
        model,
        room,
        eval,
        seed,
        goals,
        Memory::OneEpisode,
        device,
        &mut |s| on_step(per_run + s, total),
    );
    let source = source_algorithm(room, goals, &config.source, eval, seed ^ 0x50_0000);
    let random = random_policy(room, goals, eval, seed);
    let acceptance = Acceptance::check(&ad, &control, &source, &random);
    EvalReport {
        goals: goals.to_vec(),
        seeds: eval.seeds,
        episodes: eval.episodes,
        optimal: optimal_return(room, goals),
        ad,
        control,
        source,
        random,
        acceptance,
    }
}

impl EvalReport {
    /// A few lines for a terminal.
    pub fn summary(&self) -> String {
        let line = |name: &str, c: &Curve| {
            format!(
                "{name:<8} episode 1 {:>5.2}   last 10 {:>5.2}   mean {:>5.2}",
                c.first, c.last10, c.mean
            )
        };
        let a = &self.acceptance;
        let mark = |ok: bool| if ok { "yes" } else { "NO" };
        [
            format!(
                "{} held-out goals x {} seeds x {} episodes (optimal mean return {:.2})",
                self.goals.len(),
                self.seeds,
                self.episodes,
                self.optimal
            ),
            line("AD", &self.ad),
            line("control", &self.control),
            line("source", &self.source),
            line("random", &self.random),
            format!(
                "AD improves in context: {}; >= 10x random: {}; one-episode control flat: {}; \
                 mean >= {PACE}x the source's: {}",
                mark(a.ad_improves),
                mark(a.beats_random),
                mark(a.control_flat),
                mark(a.keeps_pace)
            ),
        ]
        .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(first: f64, rest: f64) -> Curve {
        let mut r = vec![rest; 40];
        r[0] = first;
        Curve::new(r)
    }

    #[test]
    fn acceptance_needs_every_check() {
        let random = curve(0.3, 0.3);
        let check = |ad: Curve, control: Curve, random: &Curve| {
            Acceptance::check(&ad, &control, &curve(0.3, 12.0), random)
        };
        let good = check(curve(1.0, 12.0), curve(1.0, 1.2), &random);
        assert!(good.passed);
        // 3x but not +3.
        assert!(!check(curve(0.5, 2.0), curve(1.0, 1.0), &random).ad_improves);
        // Beats random by less than 10x.
        assert!(!check(curve(1.0, 12.0), curve(1.0, 1.0), &curve(2.0, 2.0)).beats_random);
        // A control that improves means memorised goals.
        assert!(!check(curve(1.0, 12.0), curve(1.0, 6.0), &random).control_flat);
        // Learns in context, but more slowly than the source: 9.5 is 0.79 of its 12.
        let slow = check(curve(1.0, 9.5), curve(1.0, 1.0), &random);
        assert!(slow.ad_improves && !slow.keeps_pace && !slow.passed);
        assert!(check(curve(1.0, 9.8), curve(1.0, 1.0), &random).keeps_pace);
    }
}
