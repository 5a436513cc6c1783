//! A workload's step timed on one device, as three costs the cost model scales to any layout.
//!
//! FLOPs over a device's peak predict large models on GPUs, whose steps are their matmuls. A
//! small model on a CPU core spends much of its step dispatching ops, whatever their size, and
//! updating its parameters: costs that do not shrink when a batch is split. So a model that is
//! here to run is timed at a few batch sizes and micro-batch counts on one device, and the
//! step's time is fitted as `per_update + micro_batches · per_micro_batch + samples ·
//! per_sample` (least squares): the three parts a layout divides differently.

use serde::{Deserialize, Serialize};

/// One timed step on one device: its samples, the micro-batches they were cut into, and its
/// seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Samples of the step.
    pub samples: usize,
    /// Micro-batches (forward and backward passes) the samples were cut into.
    pub micro_batches: usize,
    /// Seconds of one step (a median over several).
    pub seconds: f64,
    /// How much the steps' times varied: their interquartile range over their median.
    #[serde(default)]
    pub spread: f64,
    /// How many steps the median is of (0 where not recorded).
    #[serde(default)]
    pub steps: usize,
    /// The rank's peak bytes over the steps, where the process counts its memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<u64>,
}

/// A workload's costs on one device, the whole model. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Seconds of forward and backward per sample.
    pub per_sample: f64,
    /// Seconds of a forward and backward that do not grow with its samples (every op's
    /// dispatch).
    pub per_micro_batch: f64,
    /// Seconds of a step spent once, whatever its micro-batches: the optimizer's update of
    /// every parameter.
    pub per_update: f64,
    /// The timings it was fitted to.
    pub timings: Vec<Timing>,
    /// A step alone on the machine over the same step timed beside the other cores' copies
    /// (the costs above are timed so): below 1 where ranks slow each other down on a shared
    /// memory bus, above 1 where a small step's thread hand-offs wake cores that sleep. 1
    /// when not timed.
    #[serde(default = "one")]
    pub alone: f64,
    /// Seconds a step of several ranks spends beyond what its compute and collectives
    /// predict: waking each rank's threads and meeting at the step's end, timed on the
    /// model's own ranks (see [`Measured::with_rendezvous`]). 0 when not timed.
    #[serde(default)]
    pub rendezvous: f64,
    /// Seconds each hand-off of a micro-batch between pipeline stages costs beyond the
    /// collective's probed latency and bandwidth: the receiving rank woken, timed on the
    /// model's own stages (see [`Measured::with_handoff`]). 0 when not timed.
    #[serde(default)]
    pub handoff: f64,
    /// Seconds each tensor-parallel all-reduce inside a block costs beyond the collective's
    /// probed latency and bandwidth: the shards' threads meeting mid-block, while they
    /// compute, timed on the model's own shards (see [`Measured::with_tp_call`]). 0 when not
    /// timed.
    #[serde(default)]
    pub tp_call: f64,
    /// The share of a block's per-sample work that tensor parallelism does not split (the
    /// norms, residuals and element-wise work run whole on every shard), fitted to the
    /// model's own shards. 0 when not timed.
    #[serde(default)]
    pub tp_unsplit: f64,
    /// How ranks beyond the cores share them ([`Cluster::crowding`](super::Cluster::crowding)):
    /// 1 where the step goes at the pace of the most crowded core (`⌈ranks / cores⌉` ranks'
    /// turns), 0 where the cores' time divides evenly among the ranks (`ranks / cores`),
    /// fitted between on the model's own replicas, one more than two cores. 1 when not timed.
    #[serde(default = "one")]
    pub crowded: f64,
}

/// The serde default of a factor that is 1 unless measured.
pub(super) fn one() -> f64 {
    1.0
}

/// Timings that cannot be fitted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "the step timings cannot be fitted ({0}): time at least three steps that differ in their \
     samples and in their micro-batches"
)]
pub struct FitError(String);

impl Measured {
    /// The costs that fit `timings` best (least squares, each relative to its step's time)
    /// among those none of which is negative.
    ///
    /// # Errors
    /// [`FitError`] for fewer than three timings, a time that is not positive and finite, or
    /// timings that do not vary in both samples and micro-batches.
    pub fn fit(timings: &[Timing]) -> Result<Self, FitError> {
        if timings.len() < 3 {
            return Err(FitError(format!("{} timing(s)", timings.len())));
        }
        if let Some(t) = timings
            .iter()
            .find(|t| !(t.seconds.is_finite() && t.seconds > 0.0) || t.micro_batches == 0)
        {
            return Err(FitError(format!("{t:?}")));
        }
        let (a, y, yy) = normal_equations(timings);
        let [update, micro_batch, sample] =
            non_negative(a, y, yy).ok_or_else(|| FitError("they do not vary enough".into()))?;
        Ok(Self {
            per_sample: sample,
            per_micro_batch: micro_batch,
            per_update: update,
            timings: timings.to_vec(),
            alone: 1.0,
            rendezvous: 0.0,
            handoff: 0.0,
            tp_call: 0.0,
            tp_unsplit: 0.0,
            crowded: 1.0,
        })
    }

    /// The same costs with a pipeline step of `handoffs` hand-offs between stages timed at
    /// `seconds` where the cost model, with these costs, predicts `predicted` seconds: the
    /// difference (none if negative) shared among the hand-offs.
    pub fn with_handoff(self, seconds: f64, predicted: f64, handoffs: usize) -> Self {
        Self {
            handoff: (seconds - predicted).max(0.0) / handoffs.max(1) as f64,
            ..self
        }
    }

    /// The same costs with a tensor-parallel step of `calls` all-reduces inside its blocks
    /// timed at `seconds` where the cost model, with these costs, predicts `predicted`
    /// seconds: the difference (none if negative) shared among the calls.
    pub fn with_tp_call(self, seconds: f64, predicted: f64, calls: usize) -> Self {
        Self {
            tp_call: (seconds - predicted).max(0.0) / calls.max(1) as f64,
            ..self
        }
    }

    /// The same costs with the step alone timed at `alone` seconds, against the fitted step
    /// of the same `samples` in one micro-batch.
    pub fn with_alone(self, samples: usize, alone: f64) -> Self {
        let loaded = self.seconds(samples, 1);
        let ratio = alone / loaded;
        Self {
            alone: match ratio.is_finite() && ratio > 0.0 {
                true => ratio,
                false => 1.0,
            },
            ..self
        }
    }

    /// The same costs with a step of several ranks timed at `seconds` where the cost model,
    /// with these costs, predicts `predicted` seconds: the difference (none if negative) is
    /// the ranks' rendezvous, a cost of every step of more than one rank. Thread wake-ups
    /// cost tens of microseconds each on a machine of few cores, and a step has several (the
    /// ranks' workers, their intra-op pools, each collective): more than a small model's
    /// step on a core, and no collective's probe sees them all.
    pub fn with_rendezvous(self, seconds: f64, predicted: f64) -> Self {
        Self {
            rendezvous: (seconds - predicted).max(0.0),
            ..self
        }
    }

    /// How precisely the steps were timed: the median over the timings of their median's
    /// standard error, as a share of it. Layouts whose predicted times differ by less are the
    /// same to the planner.
    ///
    /// The median of `n` steps is far more precise than one step: for independent normal
    /// noise its standard error is `1.25 σ / √n`, and the interquartile range (the `spread`)
    /// is `1.35 σ`, so `0.93 · spread / √n`. A timing without its count of steps stands for
    /// one step. A shared machine's speed also drifts between steps, so this is the least a
    /// prediction may err, not all of it; it is used because choosing by it proved better.
    /// (The spread itself served here until 2026-11-27: at 8 to 41 % on this project's
    /// shared 2-core machine, it had `auto` take the simplest layout within up to two
    /// fifths of the fastest. Of its 408 choices in 34 runs of `kiln bench plan`, 270 were
    /// the measured fastest, 3.5 % behind it on average. The same predictions chosen among
    /// by the median's precision (5 to 16 %, each timing's steps estimated from its
    /// seconds) give 292, 2.8 % behind; eight runs since, 65 of 96, 1.8 % behind.)
    pub fn noise(&self) -> f64 {
        let mut errors: Vec<f64> = self
            .timings
            .iter()
            .map(|t| 0.93 * t.spread / (t.steps.max(1) as f64).sqrt())
            .collect();
        errors.sort_by(f64::total_cmp);
        errors.get(errors.len() / 2).copied().unwrap_or(0.0)
    }

    /// The rank's peak memory as a line in the micro-batch's samples, `(bytes whatever the
    /// batch, bytes per sample)`, from the timings of one micro-batch whose peaks were
    /// counted; `None` without two such timings of different sizes.
    pub fn memory_line(&self) -> Option<(f64, f64)> {
        let points: Vec<(f64, f64)> = self
            .timings
            .iter()
            .filter(|t| t.micro_batches == 1)
            .filter_map(|t| Some((t.samples as f64, t.peak_bytes? as f64)))
            .collect();
        let (small, large) = (
            points.iter().min_by(|a, b| a.0.total_cmp(&b.0))?,
            points.iter().max_by(|a, b| a.0.total_cmp(&b.0))?,
        );
        if large.0 <= small.0 {
            return None;
        }
        let per_sample = ((large.1 - small.1) / (large.0 - small.0)).max(0.0);
        Some(((large.1 - per_sample * large.0).max(0.0), per_sample))
    }

    /// The fitted time of a step of `samples` in `micro_batches`, the whole model on one
    /// device.
    pub fn seconds(&self, samples: usize, micro_batches: usize) -> f64 {
        self.per_update
            + micro_batches as f64 * self.per_micro_batch
            + samples as f64 * self.per_sample
    }
}

/// The normal equations `(RᵀR, Rᵀt, tᵀt)` of `seconds = u + m · a + s · b` over `timings`,
/// rows scaled to relative error: a step of 1 ms counts as much as one of 100 ms.
fn normal_equations(timings: &[Timing]) -> ([[f64; 3]; 3], [f64; 3], f64) {
    let (mut a, mut y, mut yy) = ([[0.0f64; 3]; 3], [0.0f64; 3], 0.0);
    for t in timings {
        let w = 1.0 / t.seconds;
        let x = [w, t.micro_batches as f64 * w, t.samples as f64 * w];
        let target = t.seconds * w;
        yy += target * target;
        for i in 0..3 {
            y[i] += x[i] * target;
            for j in 0..3 {
                a[i][j] += x[i] * x[j];
            }
        }
    }
    (a, y, yy)
}

/// The non-negative `x` that minimises `|R x - t|²`, given the normal equations `a = RᵀR`,
/// `y = Rᵀt` and `yy = tᵀt`: the least squares of every subset of the three costs (the others
/// held at 0) that comes out non-negative, the one of least residual. `None` when `a` is
/// singular: the timings cannot separate the three costs.
///
/// A noisy timing can pull one cost below 0 in the free fit. Clamping it to 0 afterwards
/// leaves the other two fitted as if it were still negative (a step's samples then cost
/// nothing and its dispatch too much); refitting them without it is the constrained optimum,
/// and with three unknowns the seven subsets are cheaper to try than an active-set method.
fn non_negative(a: [[f64; 3]; 3], y: [f64; 3], yy: f64) -> Option<[f64; 3]> {
    // A pinned cost's row has a diagonal of the system's own scale, not 1, so that the
    // solver's test of a vanishing pivot does not take it for one.
    let scale = a.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
    const ALL: u8 = 0b111;
    let mut best = ([0.0; 3], yy);
    for subset in 1..=ALL {
        let free = |i: usize| subset & (1 << i) != 0;
        // The normal equations of the free costs; the others pinned to 0 by rows of their own.
        let (mut sub, mut rhs) = (a, y);
        for (i, (row, target)) in sub.iter_mut().zip(&mut rhs).enumerate() {
            for (j, value) in row.iter_mut().enumerate() {
                if !(free(i) && free(j)) {
                    *value = if i == j { scale } else { 0.0 };
                }
            }
            if !free(i) {
                *target = 0.0;
            }
        }
        let Some(x) = solve(sub, rhs) else {
            // The free fit of all three is the system itself.
            match subset {
                ALL => return None,
                _ => continue,
            }
        };
        if x.iter().any(|&v| v < 0.0) {
            continue;
        }
        // |R x - t|² = xᵀ a x - 2 xᵀ y + tᵀ t.
        let quadratic: f64 = (0..3)
            .map(|i| x[i] * ((0..3).map(|j| a[i][j] * x[j]).sum::<f64>() - 2.0 * y[i]))
            .sum();
        let residual = quadratic + yy;
        if residual < best.1 {
            best = (x, residual);
        }
    }
    Some(best.0)
}

/// `x` with `a · x = y`, by Gaussian elimination with partial pivoting; `None` when `a` is
/// singular.
fn solve(mut a: [[f64; 3]; 3], mut y: [f64; 3]) -> Option<[f64; 3]> {
    let scale = a.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
    for col in 0..3 {
        let pivot = (col..3).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() <= scale * 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        y.swap(col, pivot);
        let pivot_row = a[col];
        for row in col + 1..3 {
            let f = a[row][col] / pivot_row[col];
            for (value, above) in a[row].iter_mut().zip(pivot_row).skip(col) {
                *value -= f * above;
            }
            y[row] -= f * y[col];
        }
    }
    let mut x = [0.0; 3];
    for row in (0..3).rev() {
        let rest: f64 = (row + 1..3).map(|k| a[row][k] * x[k]).sum();
        x[row] = (y[row] - rest) / a[row][row];
    }
    Some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(samples: usize, micro_batches: usize, seconds: f64) -> Timing {
        Timing {
            samples,
            micro_batches,
            seconds,
            spread: 0.0,
            steps: 0,
            peak_bytes: None,
        }
    }

    #[test]
    fn the_three_costs_are_recovered_from_exact_timings() {
        let truth = |s: usize, m: usize| 2e-3 + m as f64 * 5e-4 + s as f64 * 1e-5;
        let timings: Vec<_> = [(64, 1), (16, 1), (64, 4), (32, 2)]
            .into_iter()
            .map(|(s, m)| timing(s, m, truth(s, m)))
            .collect();
        let fit = Measured::fit(&timings).unwrap();
        assert!((fit.per_update - 2e-3).abs() < 1e-9, "{fit:?}");
        assert!((fit.per_micro_batch - 5e-4).abs() < 1e-9, "{fit:?}");
        assert!((fit.per_sample - 1e-5).abs() < 1e-12, "{fit:?}");
        assert!((fit.seconds(128, 8) - truth(128, 8)).abs() < 1e-9);
    }

    /// The fit's squared relative error over `timings`: what [`Measured::fit`] minimises.
    fn residual(fit: &Measured, timings: &[Timing]) -> f64 {
        timings
            .iter()
            .map(|t| (fit.seconds(t.samples, t.micro_batches) / t.seconds - 1.0).powi(2))
            .sum()
    }

    #[test]
    fn a_cost_that_noise_pulls_below_zero_is_zero_and_the_others_refitted() {
        // A small model's step under noise: the batch whole timed faster than its quarter,
        // so the free fit's samples cost less than nothing.
        let timings = [
            timing(32, 1, 2.0e-3),
            timing(8, 1, 2.1e-3),
            timing(8, 8, 5.0e-3),
            timing(32, 4, 3.2e-3),
        ];
        let fit = Measured::fit(&timings).unwrap();
        assert_eq!(fit.per_sample, 0.0, "{fit:?}");
        assert!(fit.per_update > 0.0 && fit.per_micro_batch > 0.0, "{fit:?}");
        // The free fit, clamped as it used to be, fits worse.
        let (a, y, _) = normal_equations(&timings);
        let [u, m, s] = solve(a, y).unwrap();
        assert!(s < 0.0, "the free fit is negative: {s}");
        let clamped = Measured {
            per_update: u.max(0.0),
            per_micro_batch: m.max(0.0),
            per_sample: 0.0,
            ..fit.clone()
        };
        let best = residual(&fit, &timings);
        assert!(best < residual(&clamped, &timings), "{fit:?} {clamped:?}");
        // And no non-negative neighbour fits better: the constrained optimum.
        for (du, dm, ds) in [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, -1, 0), (-1, 1, 0)] {
            for sign in [-1.0, 1.0] {
                let step = |v: f64, d: i32| (v + sign * f64::from(d) * 1e-6).max(0.0);
                let near = Measured {
                    per_update: step(fit.per_update, du),
                    per_micro_batch: step(fit.per_micro_batch, dm),
                    per_sample: step(fit.per_sample, ds) * 1e-2,
                    ..fit.clone()
                };
                assert!(residual(&near, &timings) >= best - 1e-15, "{near:?}");
            }
        }
    }

    #[test]
    fn timings_that_cannot_separate_the_costs_are_refused() {
        let same_micro_batches = [timing(64, 1, 3e-3), timing(16, 1, 2e-3), timing(8, 1, 1e-3)];
        assert!(Measured::fit(&same_micro_batches).is_err());
        assert!(Measured::fit(&same_micro_batches[..2]).is_err());
        let broken = [timing(64, 1, 3e-3), timing(16, 1, 0.0), timing(64, 4, 1e-3)];
        assert!(Measured::fit(&broken).is_err());
    }

    #[test]
    fn what_several_ranks_cost_beyond_their_parts_is_measured_against_the_model() {
        let fit = Measured::fit(&[
            timing(64, 1, 3e-3),
            timing(16, 1, 1.5e-3),
            timing(64, 4, 4e-3),
        ])
        .unwrap();
        let alone = fit.clone().with_alone(64, 1.2 * fit.seconds(64, 1));
        assert!((alone.alone - 1.2).abs() < 1e-9, "{alone:?}");
        let met = fit.clone().with_rendezvous(5e-3, 4e-3);
        assert!((met.rendezvous - 1e-3).abs() < 1e-12);
        assert_eq!(
            fit.clone().with_rendezvous(3e-3, 4e-3).rendezvous,
            0.0,
            "never negative"
        );
        let handed = fit.with_handoff(5e-3, 4e-3, 4);
        assert!((handed.handoff - 2.5e-4).abs() < 1e-12);
    }

    #[test]
    fn the_noise_is_the_precision_of_the_medians_not_the_spread_of_a_step() {
        let timings: Vec<Timing> = [(64, 1), (16, 1), (64, 4), (32, 2)]
            .into_iter()
            .zip([(0.2, 4), (0.05, 1), (0.6, 4), (0.9, 1)])
            .map(|((s, m), (spread, steps))| Timing {
                spread,
                steps,
                ..timing(s, m, 1e-3 * s as f64)
            })
            .collect();
        let fit = Measured::fit(&timings).unwrap();
        // Standard errors 0.093, 0.0465, 0.279 and 0.837: the upper middle one (over `n`
        // rather than `√n` it would be 0.1395).
        assert!((fit.noise() - 0.279).abs() < 1e-12, "{}", fit.noise());
        // Timings without their count of steps stand for one step each: their spreads.
        let uncounted: Vec<Timing> = timings.iter().map(|t| Timing { steps: 0, ..*t }).collect();
        let fit = Measured::fit(&uncounted).unwrap();
        assert!((fit.noise() - 0.93 * 0.6).abs() < 1e-12, "{}", fit.noise());
    }
}
