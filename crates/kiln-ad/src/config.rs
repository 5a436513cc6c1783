//! The whole AD job as one config: TOML-loadable, every field defaulted.
//!
//! The defaults are the run `kiln ad train` makes with no flags, and the one the acceptance test
//! (`crates/kiln-ad/tests/run.rs`) checks.

use kiln_core::checkpoint::CheckpointConfig;
use kiln_core::optim::PerformanceConfig;
use kiln_core::plan::{Plan, PlanRequest};
use kiln_core::strategy::{StrategyConfigs, StrategyKind};
use serde::{Deserialize, Serialize};

use crate::env::DarkRoomConfig;
use crate::error::AdError;
use crate::eval::EvalConfig;
use crate::goals::GoalSplitConfig;
use crate::model::AdModelConfig;
use crate::source::QLearningConfig;

/// How the transformer is trained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdTrainConfig {
    /// Optimizer steps.
    pub steps: usize,
    /// Windows per optimizer step, over all ranks.
    pub batch: usize,
    /// Peak AdamW learning rate.
    pub lr: f64,
    /// Steps of linear warm-up to `lr`.
    pub warmup_steps: usize,
    /// The cosine decay ends at `lr × final_lr_fraction`.
    pub final_lr_fraction: f64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Strategy (`auto` chooses: see [`kiln_core::plan::Plan::resolve`]).
    pub strategy: StrategyKind,
    /// Ranks (devices; on the CPU, threads sharing the cores); unset lets the plan choose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub world: Option<usize>,
}

impl Default for AdTrainConfig {
    fn default() -> Self {
        // As many steps as keep `kiln ad train` within 3 minutes on 2 cores. At 4000 steps a
        // peak of 3e-3 reached a held-out last-10 mean of 9.7 against 8.8 for 1e-3 (three
        // seeds), and 5e-3 was no better on the seed tried (the book's AD page has the
        // ablations).
        Self {
            steps: 5000,
            batch: 32,
            lr: 3e-3,
            warmup_steps: 100,
            final_lr_fraction: 0.1,
            weight_decay: 1e-4,
            strategy: StrategyKind::Auto,
            world: None,
        }
    }
}

impl AdTrainConfig {
    /// Learning rate of step `step` (0-based): linear warm-up, then cosine decay.
    pub fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let decay = self.steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = ((step - self.warmup_steps) as f64 / decay).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.lr * (self.final_lr_fraction + (1.0 - self.final_lr_fraction) * cosine)
    }
}

/// Everything an AD run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdConfig {
    /// Seed of the histories, the model, the sample order and the evaluation.
    pub seed: u64,
    /// The room.
    pub env: DarkRoomConfig,
    /// Which goals are held out.
    pub goals: GoalSplitConfig,
    /// The source algorithm and its histories.
    pub source: QLearningConfig,
    /// The transformer.
    pub model: AdModelConfig,
    /// Training.
    pub train: AdTrainConfig,
    /// Settings of each strategy (`[parallel.ddp]`, …).
    pub parallel: StrategyConfigs,
    /// What runs between the gradient synchronisation and AdamW (`[optimizer]`: `clip_norm`,
    /// `nan_policy`).
    pub optimizer: PerformanceConfig,
    /// Evaluation.
    pub eval: EvalConfig,
    /// How often a run saves into `<out>/checkpoints`, and how many saves it keeps.
    pub checkpoint: CheckpointConfig,
}

impl Default for AdConfig {
    fn default() -> Self {
        Self {
            seed: 42,
            env: DarkRoomConfig::default(),
            goals: GoalSplitConfig::default(),
            source: QLearningConfig::default(),
            model: AdModelConfig::default(),
            train: AdTrainConfig::default(),
            checkpoint: CheckpointConfig::default(),
            parallel: StrategyConfigs::default(),
            optimizer: PerformanceConfig::default(),
            eval: EvalConfig::default(),
        }
    }
}

impl AdConfig {
    /// What the run asks of the plan: its strategy, named ranks, settings and batch. The
    /// caller adds what it knows of the machine (`cpu_cores`) and of its flags (`dp`).
    pub fn plan_request(&self) -> PlanRequest {
        PlanRequest {
            world: self.train.world,
            configs: self.parallel.clone(),
            ..PlanRequest::new(self.train.strategy, self.train.batch)
        }
    }

    /// The plan of this config on `ranks` ranks (as many as its devices), checked with the
    /// optimizer's settings: how a program that already holds its devices plans.
    ///
    /// # Errors
    /// What [`Plan::resolve`] refuses, or a precision the strategy cannot run.
    pub fn plan(&self, ranks: usize) -> Result<Plan, AdError> {
        let plan = Plan::resolve(PlanRequest {
            world: Some(ranks),
            ..self.plan_request()
        })
        .map_err(kiln_core::StrategyError::from)?;
        plan.check_precision(self.optimizer.precision)
            .map_err(kiln_core::StrategyError::from)?;
        Ok(plan)
    }

    /// The largest value of each size a user types: far beyond the paper's runs (a width of
    /// 128, 4 layers, 2,000 source episodes of 20 steps, 10 evaluation seeds), and small
    /// enough that every product of them (`episodes · horizon · runs · width`) stays exact.
    const LIMITS: [(&'static str, usize); 10] = [
        ("env.horizon", 1 << 12),
        ("source.episodes", 1 << 16),
        ("source.histories_per_goal", 1 << 10),
        ("model.d_model", 1 << 14),
        ("model.layers", 1 << 10),
        ("model.heads", 1 << 10),
        ("model.d_ff", 1 << 16),
        ("train.batch", 1 << 20),
        ("eval.episodes", 1 << 16),
        ("eval.seeds", 1 << 10),
    ];

    /// Checks every size against [`Self::LIMITS`].
    fn check_sizes(&self) -> Result<(), AdError> {
        let values = [
            self.env.horizon,
            self.source.episodes,
            self.source.histories_per_goal,
            self.model.d_model,
            self.model.layers,
            self.model.heads,
            self.model.d_ff,
            self.train.batch,
            self.eval.episodes,
            self.eval.seeds,
        ];
        for ((field, max), value) in Self::LIMITS.into_iter().zip(values) {
            if value > max {
                return Err(AdError::TooLarge { field, value, max });
            }
        }
        Ok(())
    }

    /// Checks what would otherwise fail deep inside a run.
    ///
    /// # Errors
    /// The first problem found.
    pub fn validate(&self) -> Result<(), AdError> {
        let room = self.env;
        if room.size.is_multiple_of(2) || !(3..=63).contains(&room.size) || room.horizon == 0 {
            return Err(AdError::Room {
                size: room.size,
                horizon: room.horizon,
            });
        }
        self.source.validate()?;
        self.check_sizes()?;
        let steps = self.source.episodes * room.horizon;
        if self.model.context == 0 || self.model.context > steps {
            return Err(AdError::ContextTooLong {
                context: self.model.context,
                steps,
            });
        }
        for (name, value) in [
            ("model.d_model", self.model.d_model),
            ("model.layers", self.model.layers),
            ("model.heads", self.model.heads),
            ("model.d_ff", self.model.d_ff),
            ("train.steps", self.train.steps),
            ("train.batch", self.train.batch),
            ("eval.episodes", self.eval.episodes),
            ("eval.seeds", self.eval.seeds),
        ] {
            if value == 0 {
                return Err(AdError::Zero(name));
            }
        }
        if !self.model.d_model.is_multiple_of(self.model.heads) {
            return Err(AdError::Heads {
                d_model: self.model.d_model,
                heads: self.model.heads,
            });
        }
        self.optimizer.validate()?;
        self.checkpoint.validate()?;
        let positive = |field, value: f64| {
            if value > 0.0 && value.is_finite() {
                Ok(())
            } else {
                Err(AdError::OutOfRange {
                    field,
                    value,
                    range: "positive finite numbers",
                })
            }
        };
        positive("train.lr", self.train.lr)?;
        positive("eval.temperature", self.eval.temperature)?;
        if !(0.0..=1.0).contains(&self.train.final_lr_fraction) {
            return Err(AdError::OutOfRange {
                field: "train.final_lr_fraction",
                value: self.train.final_lr_fraction,
                range: "[0, 1]",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_schedule_warms_up_then_decays() {
        let config = AdConfig::default();
        config.validate().unwrap();
        let t = &config.train;
        assert!(t.lr_at(0) < t.lr_at(t.warmup_steps - 1));
        assert!((t.lr_at(t.warmup_steps) - t.lr).abs() < 1e-12);
        assert!((t.lr_at(t.steps - 1) - t.lr * t.final_lr_fraction).abs() < 1e-6);
        // A warm-up longer than the run only warms up.
        let short = AdTrainConfig {
            steps: 5,
            warmup_steps: 10,
            ..AdTrainConfig::default()
        };
        assert!((0..5).all(|s| short.lr_at(s) < short.lr));
    }

    #[test]
    fn bad_settings_are_named() {
        let mut c = AdConfig::default();
        c.model.context = 10_000;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("model.context")
        );
        let mut c = AdConfig::default();
        c.model.heads = 5;
        assert!(c.validate().unwrap_err().to_string().contains("heads"));
        let mut c = AdConfig::default();
        c.env.size = 8;
        assert!(c.validate().unwrap_err().to_string().contains("env.size"));
        let mut c = AdConfig::default();
        c.train.strategy = StrategyKind::Single;
        assert!(c.plan(2).unwrap_err().to_string().contains("single"));
        let mut c = AdConfig::default();
        c.eval.seeds = 0;
        assert!(c.validate().unwrap_err().to_string().contains("eval.seeds"));
    }

    #[test]
    fn toml_overrides_only_what_it_names() {
        let c: AdConfig =
            toml::from_str("[train]\nsteps = 7\n[parallel.ddp]\nbucket_cap_mb = 1.0\n").unwrap();
        assert_eq!(c.train.steps, 7);
        assert_eq!(c.parallel.ddp.bucket_cap_mb, 1.0);
        assert_eq!(c.model, AdModelConfig::default());
        assert!(toml::from_str::<AdConfig>("[train]\nstep = 7\n").is_err());
        let gelu: AdConfig = toml::from_str("[model]\nactivation = \"gelu\"\n").unwrap();
        assert_eq!(
            gelu.model.activation,
            crate::model::FeedForwardActivation::Gelu
        );
        assert!(toml::from_str::<AdConfig>("[model]\nactivation = \"swish\"\n").is_err());
    }
}
