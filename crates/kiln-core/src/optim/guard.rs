//! The guard that runs between the gradient synchronisation and the optimizer step.
//!
//! A step goes: each rank inspects its own gradients (one pass: the squared norm of every
//! gradient, which is non-finite exactly when the gradient is) → it writes a *finding code* in
//! its own slot of a world-sized vector that rides in the gradient all-reduce's last bucket, so
//! after the sum every rank knows which ranks saw what, with no extra collective → every rank
//! settles the same way from the same facts: skip, halt, or clip by the global norm and step.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;

use super::inspect::{grad_squares, param_path};
use super::{LossScale, NanPolicy, NonFinite, NonFiniteValue, PerformanceConfig};

/// PyTorch's `clip_grad_norm_` adds this to the norm, so a zero norm never divides.
const CLIP_EPS: f64 = 1e-6;

/// What the guard did in one step, as [`StepOutput`](crate::strategy::StepOutput) reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuardReport {
    /// The global L2 norm of the gradients before clipping (over every rank and shard);
    /// non-finite when the step was skipped for a non-finite value.
    pub grad_norm: f64,
    /// Whether every rank skipped the optimizer step.
    pub skipped: bool,
    /// The loss scale this step's gradients were computed with, under a dynamic loss scale.
    pub loss_scale: Option<f64>,
}

/// One rank's view of its own gradients before they are synchronised.
pub(crate) struct Local {
    /// 0 when finite, 1 for a non-finite loss, `2 + ordinal` for the first parameter whose
    /// gradient is not finite. Small integers are exact in f32, so sums of codes of which at
    /// most one per slot is non-zero are exact too.
    pub code: f32,
    /// `Σ g²` over the rank's gradients, reused when nothing is summed afterwards.
    pub squares: f64,
}

/// The decision of one step.
pub(crate) struct Settled {
    /// The gradients to step with, or `None` to skip the step.
    pub grads: Option<GradientsParams>,
    /// What to multiply the gradients by before the step: the clipping factor over the loss
    /// scale (1 for neither). The optimizer applies it ([`GuardedOptimizer::step_scaled`]).
    ///
    /// [`GuardedOptimizer::step_scaled`]: super::GuardedOptimizer::step_scaled
    pub factor: f64,
    /// What is reported.
    pub report: GuardReport,
}

impl Settled {
    /// No guard: the gradients go to the optimizer as they are.
    pub fn unguarded(grads: GradientsParams) -> Self {
        Self {
            grads: Some(grads),
            factor: 1.0,
            report: GuardReport {
                grad_norm: f64::NAN,
                skipped: false,
                loss_scale: None,
            },
        }
    }
}

/// The stability guards of a [`PerformanceConfig`], applied by the strategies, and the
/// dynamic loss scale when there is one.
#[derive(Debug, Clone)]
pub struct Guard {
    config: PerformanceConfig,
    scale: Option<LossScale>,
    /// One past the last step a skip was logged for, shared by the clones every rank holds:
    /// every rank settles the same skip, and the log says it once.
    logged: Arc<AtomicU64>,
}

impl Guard {
    pub(crate) fn new(config: PerformanceConfig) -> Self {
        Self {
            config,
            scale: None,
            logged: Arc::default(),
        }
    }

    /// This guard, unscaling gradients by `scale` and adjusting it.
    pub(crate) fn with_loss_scale(self, scale: LossScale) -> Self {
        Self {
            scale: Some(scale),
            ..self
        }
    }

    /// The dynamic loss scale, if any.
    pub fn loss_scale(&self) -> Option<&LossScale> {
        self.scale.as_ref()
    }

    /// The configuration applied.
    pub fn config(&self) -> &PerformanceConfig {
        &self.config
    }

    /// Inspects this rank's gradients, whose `Σ g²` is `squares` (non-finite exactly when a
    /// gradient is), and whether its loss was finite.
    pub(crate) fn inspect<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        module: &M,
        grads: &GradientsParams,
        loss_finite: bool,
        squares: f64,
    ) -> Local {
        let code = if !loss_finite {
            1.0
        } else if squares.is_finite() {
            0.0
        } else {
            // Rare: only now is it worth a pass per parameter, to name the first culprit.
            grad_squares::<B, M>(module, grads)
                .iter()
                .find(|(_, s)| !s.is_finite())
                .map_or(0.0, |&(ordinal, _)| 2.0 + ordinal as f32)
        };
        Local { code, squares }
    }

    /// The world-sized vector of finding codes this rank contributes: its code in its slot.
    pub(crate) fn codes(local: &Local, rank: usize, world_size: usize) -> Vec<f32> {
        let mut codes = vec![0.0; world_size];
        codes[rank] = local.code;
        codes
    }

    /// Decides the step from every rank's finding `codes` (summed, indexed by rank) and the
    /// squared global norm of the synchronised gradients. `name` names a parameter by ordinal
    /// when this rank holds it (`None` for another pipeline stage's rank). Clipping is left to
    /// the optimizer: [`Settled::factor`] says by how much.
    ///
    /// # Errors
    /// [`NonFinite`] under [`NanPolicy::Halt`]; every rank builds the same one.
    pub(crate) fn settle(
        &self,
        grads: GradientsParams,
        codes: &[f32],
        global_squares: f64,
        step: u64,
        name: impl Fn(usize, usize) -> Option<String>,
    ) -> Result<Settled, NonFinite> {
        // Under a loss scale the gradients are `scale` times too large; the norm is reported
        // and clipped unscaled.
        let scale = self.scale.as_ref().map(|s| s.of_step(step));
        let norm = global_squares.sqrt() / scale.unwrap_or(1.0);
        let affected: Vec<(usize, f32)> = codes
            .iter()
            .copied()
            .enumerate()
            .filter(|&(_, c)| c != 0.0)
            .collect();
        let overflow = !affected.is_empty() || !norm.is_finite();
        if let Some(loss_scale) = &self.scale {
            loss_scale.update(step, overflow);
            if overflow {
                // Expected now and then with a loss scale: skipped, and the scale backs off.
                tracing::debug!(
                    "step {step}: gradients overflowed at loss scale {}; skipped",
                    scale.unwrap_or(1.0)
                );
                return Ok(Settled {
                    grads: None,
                    factor: 1.0,
                    report: GuardReport {
                        grad_norm: norm,
                        skipped: true,
                        loss_scale: scale,
                    },
                });
            }
        }
        if overflow {
            // A non-finite loss makes every gradient behind it non-finite too: it is the cause
            // to name, wherever it appeared; otherwise the lowest rank's first gradient.
            let first = affected
                .iter()
                .find(|&&(_, c)| c == 1.0)
                .or(affected.first());
            let report = match first {
                Some(&(rank, code)) => NonFinite {
                    step,
                    rank: Some(rank),
                    shard: None,
                    value: if code == 1.0 {
                        NonFiniteValue::Loss
                    } else {
                        let ordinal = (code - 2.0) as usize;
                        NonFiniteValue::Gradient {
                            param: name(rank, ordinal),
                            ordinal,
                        }
                    },
                    ranks_affected: affected.len(),
                },
                None => NonFinite {
                    step,
                    rank: None,
                    shard: None,
                    value: NonFiniteValue::NormOverflow,
                    ranks_affected: 0,
                },
            };
            return match self.config.nan_policy {
                NanPolicy::Halt => Err(report),
                NanPolicy::Skip => {
                    if self.logged.fetch_max(step + 1, Ordering::Relaxed) <= step {
                        tracing::warn!(
                            "skipped the step: {}; if it recurs, lower the learning rate or \
                             set clip_norm",
                            report.summary()
                        );
                    }
                    Ok(Settled {
                        grads: None,
                        factor: 1.0,
                        report: GuardReport {
                            grad_norm: norm,
                            skipped: true,
                            loss_scale: scale,
                        },
                    })
                }
            };
        }
        let clip_factor = match self.config.clip_norm {
            Some(max) if norm > max => max / (norm + CLIP_EPS),
            _ => 1.0,
        };
        Ok(Settled {
            grads: Some(grads),
            // Unscaling and clipping are one multiplication.
            factor: clip_factor / scale.unwrap_or(1.0),
            report: GuardReport {
                grad_norm: norm,
                skipped: false,
                loss_scale: scale,
            },
        })
    }

    /// [`Self::settle`] for a module whose synchronised gradients are whole on this rank
    /// (every strategy but the pipeline): the global norm is theirs, and every parameter has
    /// a name here. `local` is reused when the gradients were not summed since; otherwise
    /// `squares` makes the pass over them.
    pub(crate) fn settle_replica<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        module: &M,
        grads: GradientsParams,
        codes: &[f32],
        local: Option<Local>,
        step: u64,
        squares: impl FnOnce(&GradientsParams) -> f64,
    ) -> Result<Settled, NonFinite> {
        let global = match local {
            Some(local) => local.squares,
            None => squares(&grads),
        };
        self.settle(grads, codes, global, step, |_, ordinal| {
            param_path::<B, M>(module, ordinal)
        })
    }
}
