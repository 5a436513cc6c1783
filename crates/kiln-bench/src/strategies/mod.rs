//! The strategy benchmark: strategy × world size × model.
//!
//! Every scenario trains a fresh model through a strategy built by name, exactly as
//! `kiln train` builds it, with one intra-op thread per rank. Scenarios run in rounds whose
//! order rotates; in each, untimed warm-up steps come first (fresh threads start with cold
//! allocator arenas), then the timed steps. A scenario's figures are the median, minimum and
//! maximum over its rounds, and each rank's compute, communication and idle time per step
//! in its median round.

mod chart;
mod models;
mod report;

use std::fmt;
use std::str::FromStr;

use burn::tensor::backend::AutodiffBackend;
use kiln_core::plan::{Plan, PlanRequest};
use kiln_core::strategy::{ConfigError, StrategyConfigs, StrategyError, StrategyKind};
use kiln_nn::tensor_parallel::ShardedBackend;
use serde::{Deserialize, Serialize};

pub use chart::write_svg;
pub use report::{Comparison, RankTimes, Report, ScenarioResult, comparable, compare, markdown};

use crate::stats::rotation;

/// A model the benchmark trains, with its own synthetic data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchModel {
    /// The MLP on the teacher-network classification task.
    Mlp,
    /// The small decoder transformer on the Fibonacci sequence task.
    Transformer,
    /// The Algorithm Distillation transformer on windows of Q-learning histories.
    Ad,
    /// The transformer with NF4-quantised frozen blocks and rank-8 adapters.
    Qlora,
}

impl BenchModel {
    /// Every model.
    pub const ALL: [BenchModel; 4] = [Self::Mlp, Self::Transformer, Self::Ad, Self::Qlora];

    /// Samples per optimizer step at `scale`.
    pub const fn batch(self, scale: Scale) -> usize {
        let quick = matches!(scale, Scale::Quick);
        match self {
            Self::Mlp if quick => 16,
            Self::Mlp => 512,
            Self::Transformer | Self::Qlora if quick => 8,
            Self::Transformer | Self::Qlora => 128,
            Self::Ad if quick => 8,
            Self::Ad => 32,
        }
    }

    /// Whether the model runs under `strategy`. Under `tensor`, the MLP does not shard its
    /// layers, and the QLoRA model's 4-bit bases split only along whole blocks of 64 rows,
    /// which needs `d_model / tp ≥ 64`, wider than the benchmark's model.
    pub fn runs_under(self, strategy: StrategyKind) -> bool {
        strategy != StrategyKind::Tensor || matches!(self, Self::Transformer | Self::Ad)
    }

    /// The name reports and command lines use.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Mlp => "mlp",
            Self::Transformer => "transformer",
            Self::Ad => "ad",
            Self::Qlora => "qlora",
        }
    }
}

impl fmt::Display for BenchModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BenchModel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown model {s:?}; use mlp, transformer, ad or qlora"))
    }
}

/// Size of the models and their batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// Tiny models and batches, for the test suite: seconds in all.
    Quick,
    /// The models at the sizes of their examples, batches that keep every core busy.
    Full,
}

/// What to measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Matrix {
    /// The models.
    pub models: Vec<BenchModel>,
    /// The strategies; `single` runs at world 1 only, the others at every world size ≥ 2
    /// whose mesh they can form.
    pub strategies: Vec<StrategyKind>,
    /// World sizes (ranks).
    pub worlds: Vec<usize>,
    /// Pipeline stages; the pipeline runs `world / stages` data-parallel replicas.
    pub pipeline_stages: usize,
    /// Pipeline micro-batches per flush.
    pub micro_batches: usize,
    /// Tensor-parallel shards (`tp`) of `tensor`.
    #[serde(default = "two")]
    pub tensor_shards: usize,
    /// Pipeline stages of `tensor` (1: `dp × tp`; 2 or more: the 3-D `dp × pp × tp`).
    #[serde(default = "one")]
    pub tensor_stages: usize,
    /// Untimed steps at the start of every round.
    pub warmup: usize,
    /// Timed steps per round.
    pub steps: usize,
    /// Rounds, each over every scenario in rotated order.
    pub rounds: usize,
    /// Model and batch size.
    pub scale: Scale,
}

impl Matrix {
    /// The test suite's matrix: every model and strategy at worlds 1 and 2, one short round.
    pub fn quick() -> Self {
        Self {
            models: BenchModel::ALL.to_vec(),
            strategies: vec![
                StrategyKind::Single,
                StrategyKind::DataParallel,
                StrategyKind::Ddp,
                StrategyKind::Pipeline,
                StrategyKind::Tensor,
            ],
            worlds: vec![1, 2],
            pipeline_stages: 2,
            micro_batches: 2,
            tensor_shards: 2,
            tensor_stages: 1,
            warmup: 1,
            steps: 2,
            rounds: 1,
            scale: Scale::Quick,
        }
    }

    /// The full matrix: every model and strategy at worlds 1, 2 and 4, three rounds.
    pub fn full() -> Self {
        Self {
            worlds: vec![1, 2, 4],
            micro_batches: 4,
            warmup: 2,
            steps: 8,
            rounds: 3,
            scale: Scale::Full,
            ..Self::quick()
        }
    }

    /// The strategies' settings every scenario runs with: one intra-op thread per rank, and
    /// the matrix's pipeline and tensor shapes.
    pub fn configs(&self) -> StrategyConfigs {
        let mut configs = StrategyConfigs::default();
        configs.set_threads_per_rank(1);
        configs.pipeline.stages = self.pipeline_stages;
        configs.pipeline.micro_batches = self.micro_batches;
        configs.tensor.tp = self.tensor_shards;
        configs.tensor.stages = self.tensor_stages;
        configs
    }

    /// The plan of `scenario`, as `kiln train` resolves one.
    ///
    /// # Errors
    /// What [`Plan::resolve`] refuses.
    pub fn plan(&self, scenario: &Scenario) -> Result<Plan, ConfigError> {
        Plan::resolve(PlanRequest {
            world: Some(scenario.world),
            configs: self.configs(),
            ..PlanRequest::new(scenario.strategy, scenario.model.batch(self.scale))
        })
    }

    /// Every scenario the matrix holds, in a fixed order: model, then strategy, then world.
    /// A strategy runs at every world size whose mesh it can form (a plan that resolves, or
    /// fails only for the batch, which [`Self::validate`] reports), the parallel ones from
    /// world 2 (their world 1 is `single`'s scenario), on the models it can train.
    pub fn scenarios(&self) -> Vec<Scenario> {
        let mut scenarios = Vec::new();
        for &model in &self.models {
            for &strategy in &self.strategies {
                for &world in &self.worlds {
                    let scenario = Scenario {
                        model,
                        strategy,
                        world,
                    };
                    let forms = match self.plan(&scenario) {
                        Ok(_) => true,
                        Err(e) => is_batch(&e),
                    };
                    if forms
                        && model.runs_under(strategy)
                        && (strategy == StrategyKind::Single || world >= 2)
                    {
                        scenarios.push(scenario);
                    }
                }
            }
        }
        scenarios
    }

    /// Checks the whole matrix before anything runs, so a bad setting does not end a run
    /// halfway.
    ///
    /// # Errors
    /// A zero count, `auto`, an empty matrix, or a scenario whose batch cannot be split.
    pub fn validate(&self) -> Result<(), BenchError> {
        let positive = [
            ("steps", self.steps),
            ("rounds", self.rounds),
            ("pipeline_stages", self.pipeline_stages),
            ("micro_batches", self.micro_batches),
            ("tensor_shards", self.tensor_shards),
            ("tensor_stages", self.tensor_stages),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(BenchError::Zero(name));
        }
        if self.strategies.contains(&StrategyKind::Auto) {
            return Err(BenchError::Auto);
        }
        let scenarios = self.scenarios();
        if scenarios.is_empty() {
            return Err(BenchError::Empty);
        }
        for scenario in scenarios {
            // The plan checks that every replica gets a sample (and one per micro-batch).
            if let Err(source) = self.plan(&scenario) {
                return Err(BenchError::Plan { scenario, source });
            }
        }
        Ok(())
    }
}

/// Whether a plan failed only because of the batch (which the matrix must fix), not because
/// the strategy cannot form a mesh at that world size (a scenario the matrix skips).
fn is_batch(error: &ConfigError) -> bool {
    matches!(
        error,
        ConfigError::BatchSmallerThanReplicas { .. } | ConfigError::MicroBatchesExceedBatch { .. }
    )
}

fn one() -> usize {
    1
}

fn two() -> usize {
    2
}

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scenario {
    /// The model.
    pub model: BenchModel,
    /// The strategy.
    pub strategy: StrategyKind,
    /// Ranks.
    pub world: usize,
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} world {}", self.model, self.strategy, self.world)
    }
}

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A count that must be positive is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// `auto` is not a strategy of its own.
    #[error("`auto` only picks one of the other strategies; benchmark those by name")]
    Auto,
    /// Nothing to run.
    #[error(
        "the matrix has no scenario: it needs a model and a strategy, and world sizes they run \
         at (`single` at 1 only, the others at 2 or more, the pipeline at multiples of its stages)"
    )]
    Empty,
    /// A scenario whose plan cannot run (its batch too small for its replicas or
    /// micro-batches).
    #[error("{scenario}: {source}; use smaller world sizes or fewer micro-batches")]
    Plan {
        /// The scenario.
        scenario: Scenario,
        /// Why its plan cannot run.
        source: ConfigError,
    },
    /// Fewer devices than the largest world size.
    #[error("the largest world size is {needed} but {given} device(s) were given")]
    Devices {
        /// Devices the matrix needs.
        needed: usize,
        /// Devices given.
        given: usize,
    },
    /// A scenario's strategy failed.
    #[error("{scenario}: {source}")]
    Strategy {
        /// The scenario.
        scenario: Scenario,
        /// What failed.
        source: StrategyError,
    },
}

/// Runs `matrix` on `devices` (one per rank of the largest world; CPU ranks may share one
/// device), calling `progress` before each run of a scenario.
///
/// # Errors
/// An invalid matrix, too few devices, or a strategy failure (naming the scenario).
pub fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
    devices: &[B::Device],
    matrix: &Matrix,
    backend: &str,
    progress: &mut dyn FnMut(&Scenario, usize),
) -> Result<Report, BenchError> {
    matrix.validate()?;
    let needed = matrix.worlds.iter().copied().max().unwrap_or(1);
    if devices.len() < needed {
        return Err(BenchError::Devices {
            needed,
            given: devices.len(),
        });
    }
    let scenarios = matrix.scenarios();
    let mut rounds: Vec<Vec<models::Round>> = vec![Vec::new(); scenarios.len()];
    for round in 0..matrix.rounds {
        for i in rotation(scenarios.len(), round) {
            let scenario = scenarios[i];
            progress(&scenario, round);
            let plan = matrix
                .plan(&scenario)
                .map_err(|source| BenchError::Plan { scenario, source })?;
            let measured =
                models::run_round::<B>(&devices[..scenario.world], &scenario, &plan, matrix)
                    .map_err(|source| BenchError::Strategy { scenario, source })?;
            rounds[i].push(measured);
        }
    }
    let results = scenarios
        .into_iter()
        .zip(rounds)
        .map(|(scenario, rounds)| ScenarioResult::new(scenario, &rounds, matrix.steps))
        .collect();
    Ok(Report {
        backend: backend.to_string(),
        matrix: matrix.clone(),
        results,
    })
}
