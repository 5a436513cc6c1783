//! The dynamic loss scale for f16 training: the loss is multiplied by a large factor before
//! the backward, so that small gradients do not underflow f16, and the gradients are divided by
//! it before the optimizer step. An overflow (a non-finite gradient) skips the step and halves
//! the scale; a run of clean steps doubles it. PyTorch's `GradScaler` does the same.

use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use super::GuardConfigError;

/// Configuration of a [`LossScale`]; the defaults are PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LossScaleConfig {
    /// The first scale.
    pub initial: f64,
    /// What the scale is multiplied by after `growth_interval` clean steps in a row.
    pub growth_factor: f64,
    /// What the scale is multiplied by after an overflow.
    pub backoff_factor: f64,
    /// Clean steps in a row before the scale grows.
    pub growth_interval: u64,
}

impl Default for LossScaleConfig {
    fn default() -> Self {
        Self {
            initial: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

impl LossScaleConfig {
    /// Checks that the settings can work.
    ///
    /// # Errors
    /// [`GuardConfigError::LossScale`] naming the bad setting.
    pub fn validate(&self) -> Result<(), GuardConfigError> {
        let bad = |what: &'static str, value: f64| Err(GuardConfigError::LossScale { what, value });
        if !(self.initial > 0.0 && self.initial.is_finite()) {
            return bad("initial must be a positive finite number", self.initial);
        }
        if !(self.growth_factor >= 1.0 && self.growth_factor.is_finite()) {
            return bad("growth_factor must be at least 1", self.growth_factor);
        }
        if !(self.backoff_factor > 0.0 && self.backoff_factor < 1.0) {
            return bad(
                "backoff_factor must be between 0 and 1",
                self.backoff_factor,
            );
        }
        if self.growth_interval == 0 {
            return bad("growth_interval must be at least 1", 0.0);
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct State {
    scale: f64,
    clean_steps: u64,
    /// The last step decided: every rank of a process shares this state and decides each
    /// step the same way, so only the first decision of a step counts.
    last_step: u64,
    /// The scale `last_step` was computed with, for the ranks that settle it after the first
    /// one has already changed the scale.
    scale_of_last_step: f64,
}

/// The dynamic loss scale, shared by the [`MixedPrecision`](super::MixedPrecision) model
/// (which scales the loss) and the [`PerformanceOptimizer`](super::PerformanceOptimizer)'s
/// guard (which unscales the gradients and adjusts the scale). Clones share the state.
#[derive(Debug, Clone)]
pub struct LossScale {
    config: LossScaleConfig,
    state: Arc<Mutex<State>>,
}

impl LossScale {
    /// A scale starting at `config.initial`.
    ///
    /// # Errors
    /// [`GuardConfigError::LossScale`] for settings that cannot work.
    pub fn new(config: LossScaleConfig) -> Result<Self, GuardConfigError> {
        config.validate()?;
        Ok(Self {
            config,
            state: Arc::new(Mutex::new(State {
                scale: config.initial,
                clean_steps: 0,
                last_step: 0,
                scale_of_last_step: config.initial,
            })),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current scale: what the next step's loss is multiplied by.
    pub fn value(&self) -> f64 {
        self.state().scale
    }

    /// The scale `step`'s gradients were computed with, whether or not another rank has
    /// already settled that step and changed the scale.
    pub(crate) fn of_step(&self, step: u64) -> f64 {
        let state = self.state();
        if step == state.last_step {
            state.scale_of_last_step
        } else {
            state.scale
        }
    }

    /// Records how `step` went: an overflow backs the scale off, a run of clean steps grows
    /// it. Later calls for the same step (from the other ranks) change nothing.
    pub(crate) fn update(&self, step: u64, overflow: bool) {
        let mut state = self.state();
        if step <= state.last_step {
            return;
        }
        state.last_step = step;
        state.scale_of_last_step = state.scale;
        if overflow {
            state.scale *= self.config.backoff_factor;
            state.clean_steps = 0;
        } else {
            state.clean_steps += 1;
            if state.clean_steps >= self.config.growth_interval {
                state.scale *= self.config.growth_factor;
                state.clean_steps = 0;
            }
        }
    }

    /// The state as a Burn record: scale, clean steps in a row, last step decided.
    pub(crate) fn to_record(&self) -> (f64, u64, u64) {
        let state = self.state();
        (state.scale, state.clean_steps, state.last_step)
    }

    /// Restores a state from [`Self::to_record`]. The step count starts again: the strategy
    /// that loads it numbers its steps from 1, and a saved count would make every step up to
    /// it look decided already (the scale would freeze for as many steps as were saved).
    pub(crate) fn load_record(&self, (scale, clean_steps, _saved_step): (f64, u64, u64)) {
        *self.state() = State {
            scale,
            clean_steps,
            last_step: 0,
            scale_of_last_step: scale,
        };
    }
}
