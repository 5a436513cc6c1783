//! Learning-rate schedules: a linear warm-up, then constant, linear or cosine decay to zero, by
//! transformers' formulas (`get_scheduler`'s `constant_with_warmup`, `linear`, `cosine`), so
//! that a recipe ported from TRL or Axolotl trains with the same rate at every step.
//!
//! The rate is a pure function of the step, not a scheduler stepped along the run (Burn's
//! `LrScheduler`s are such, with a record to checkpoint): a resumed run computes the same
//! rate for each step it trains, whatever step it resumed at, with nothing to save.

use serde::{Deserialize, Serialize};

/// What the rate does after the warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LrDecay {
    /// Stays at the peak.
    #[default]
    Constant,
    /// Falls linearly to zero at the last step.
    Linear,
    /// Follows half a cosine to zero at the last step.
    Cosine,
}

impl std::fmt::Display for LrDecay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Constant => "constant",
            Self::Linear => "linear",
            Self::Cosine => "cosine",
        })
    }
}

/// A schedule that cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    /// A warm-up ratio outside `[0, 1]`.
    #[error("--warmup-ratio must be between 0 and 1 (a fraction of the steps), got {0}")]
    WarmupRatio(f64),
    /// Both a warm-up length and a ratio.
    #[error("give --warmup-steps or --warmup-ratio, not both")]
    BothWarmups,
}

/// The peak rate's multiplier at each step.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LrSchedule {
    /// After the warm-up.
    pub decay: LrDecay,
    /// Steps of linear warm-up from 0.
    pub warmup_steps: usize,
    /// Or the warm-up as a fraction of the run's steps (rounded up), when `warmup_steps` is 0.
    pub warmup_ratio: f64,
}

impl LrSchedule {
    /// Checks the settings.
    ///
    /// # Errors
    /// A ratio outside `[0, 1]`, or both a length and a ratio.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        if !(0.0..=1.0).contains(&self.warmup_ratio) {
            return Err(ScheduleError::WarmupRatio(self.warmup_ratio));
        }
        if self.warmup_steps > 0 && self.warmup_ratio > 0.0 {
            return Err(ScheduleError::BothWarmups);
        }
        Ok(())
    }

    /// Whether the rates depend on the run's length: a decay, or a warm-up by ratio.
    pub fn depends_on_steps(&self) -> bool {
        self.decay != LrDecay::Constant || self.warmup_ratio > 0.0
    }

    /// The warm-up's steps in a run of `total` steps.
    pub fn warmup(&self, total: usize) -> usize {
        match self.warmup_steps {
            0 => (self.warmup_ratio * total as f64).ceil() as usize,
            steps => steps,
        }
    }

    /// The multiplier of step `step` (0-based) of a run of `total` steps: `step / warmup`
    /// during the warm-up (the first step trains at 0, as in transformers), then 1, the
    /// linear `(total − step) / (total − warmup)` or the cosine `½(1 + cos(π · progress))`.
    pub fn factor(&self, step: usize, total: usize) -> f64 {
        let warmup = self.warmup(total);
        if step < warmup {
            return step as f64 / warmup.max(1) as f64;
        }
        let span = total.saturating_sub(warmup).max(1) as f64;
        let progress = (step - warmup) as f64 / span;
        match self.decay {
            LrDecay::Constant => 1.0,
            LrDecay::Linear => (1.0 - progress).max(0.0),
            LrDecay::Cosine => (0.5 * (1.0 + (std::f64::consts::PI * progress).cos())).max(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(decay: LrDecay, warmup_steps: usize, warmup_ratio: f64) -> LrSchedule {
        LrSchedule {
            decay,
            warmup_steps,
            warmup_ratio,
        }
    }

    /// transformers 5.24's `get_scheduler(name, optimizer, num_warmup_steps=2,
    /// num_training_steps=10)`: the rate of each of the ten steps over the peak.
    #[test]
    fn the_factors_are_transformers_own() {
        let linear = [0.0, 0.5, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125];
        let cosine = [
            0.0,
            0.5,
            1.0,
            0.961_939_766_255_643_4,
            0.853_553_390_593_273_8,
            0.691_341_716_182_544_9,
            0.5,
            0.308_658_283_817_455_1,
            0.146_446_609_406_726_24,
            0.038_060_233_744_356_6,
        ];
        let constant = [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        for (decay, expected) in [
            (LrDecay::Linear, linear),
            (LrDecay::Cosine, cosine),
            (LrDecay::Constant, constant),
        ] {
            for (step, want) in expected.iter().enumerate() {
                let got = schedule(decay, 2, 0.0).factor(step, 10);
                assert!((got - want).abs() < 1e-12, "{decay} step {step}: {got}");
            }
        }
        // A ratio rounds up, as transformers' `get_warmup_steps` does.
        assert_eq!(schedule(LrDecay::Linear, 0, 0.15).warmup(10), 2);
        assert_eq!(schedule(LrDecay::Constant, 0, 0.0).factor(0, 10), 1.0);
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(schedule(LrDecay::Linear, 0, 1.5).validate().is_err());
        assert!(schedule(LrDecay::Linear, 0, f64::NAN).validate().is_err());
        assert!(schedule(LrDecay::Linear, 3, 0.1).validate().is_err());
        assert!(schedule(LrDecay::Cosine, 3, 0.0).validate().is_ok());
    }
}
