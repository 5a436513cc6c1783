//! `kiln bench plan`: the planner against the clock. For each built-in model, in rounds, it
//! measures this machine as `auto` does, then trains every candidate layout the cost model
//! estimates at each world size (those that fit at the first round) and times it, in an order
//! that rotates, and writes each round's predictions next to its timings (`plan.json`,
//! `plan.md`). Run it with `KILN_COUNT_MEMORY=1` to set each rank's
//! peak memory beside the predicted. On the CPU backends the ranks are the cores; with
//! `--backend cuda`, the GPUs (one rank each: `--worlds` up to their number).

use std::path::PathBuf;

use burn::tensor::backend::AutodiffBackend;
use kiln_bench::plan::{
    Calibration, PlanReport, PlanRow, RoundTiming, mark_chosen, markdown, median_round,
};
use kiln_bench::stats::rotation;
use kiln_core::data::DataSource;
use kiln_core::fit::FitModel;
use kiln_core::optim::PerformanceConfig;
use kiln_core::plan::cost::{Candidate, Layout, StepTime, memory_with, step_time_with};
use kiln_core::plan::{Plan, PlanRequest, Planner};
use kiln_core::stats::{median, spread};
use kiln_core::strategy::{PerformanceSpec, StrategyConfigs};
use kiln_nn::tensor_parallel::ShardedBackend;
use kiln_planner::measure::{Budget, TimedSteps, time_steps};

use crate::backend::{BackendKind, Job, Placement, dispatch};
use crate::run_config::{ModelJob, ModelKind, TrainConfig, adamw, with_builtin};

/// Options of `kiln bench plan`; the lists are comma-separated.
#[derive(clap::Args, Debug)]
pub struct PlanBenchArgs {
    /// Built-in models.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "mlp,transformer"
    )]
    models: Vec<ModelKind>,
    /// Blocks of the built-in models (more than their own 2 let stages be cut unevenly)
    /// [default: each model's own].
    #[arg(long)]
    layers: Option<usize>,
    /// The backend: the CPU's (its cores are the ranks) or CUDA (its GPUs are).
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    backend: BackendKind,
    /// World sizes (ranks on this machine's CPU cores, or its GPUs).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    worlds: Vec<usize>,
    /// Samples per step (96 divides among 1 to 4 replicas).
    #[arg(long, default_value_t = 96)]
    global_batch: usize,
    /// Rounds, each over every candidate in rotated order.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds of timed steps per candidate and round (at least 10 steps, at most 500).
    #[arg(long, default_value_t = 0.3)]
    seconds: f64,
    /// Folder for plan.json and plan.md.
    #[arg(long, visible_alias = "output", default_value = "runs/bench")]
    out: PathBuf,
}

/// Runs `kiln bench plan`.
///
/// # Errors
/// Bad flags, a failed measurement or candidate, or an unwritable output folder.
pub fn run(args: PlanBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    let _claim = crate::outputs::check_folder("--out", &args.out)?;
    let seconds_ok = args.seconds.is_finite() && args.seconds >= 0.0;
    if args.worlds.contains(&0) || args.rounds == 0 || !seconds_ok {
        return Err("--worlds, --rounds must be at least 1 and --seconds at least 0".into());
    }
    let budget = Budget {
        warmup: 3,
        steps: 10,
        seconds: args.seconds,
        most_steps: 500,
    };
    let cores = BackendKind::Flex.cpu_cores().unwrap_or(1);
    let most = args.worlds.iter().copied().max().unwrap_or(1);
    let mut report = PlanReport {
        backend: args.backend.to_string(),
        global_batch: args.global_batch,
        cores,
        calibrations: Vec::new(),
        rows: Vec::new(),
    };
    for &model in &args.models {
        // On CUDA the planner measures the GPUs the largest world uses.
        let world = (!args.backend.is_cpu()).then_some(most);
        let config = TrainConfig {
            model,
            layers: args.layers,
            backend: args.backend,
            world,
            batch: args.global_batch,
            ..TrainConfig::default()
        };
        config.validate()?;
        let mut rows: Vec<Measuring> = Vec::new();
        for round in 0..args.rounds {
            let planner = crate::planning::planner(&config)?;
            report.calibrations.push(Calibration {
                model: model.name().into(),
                round: round + 1,
                measured: planner
                    .cluster
                    .measured
                    .clone()
                    .expect("a planner of this machine is measured"),
                latency: planner.cluster.intra_latency,
                bandwidth: planner.cluster.intra_bandwidth,
            });
            if round == 0 {
                rows = fitting(&planner, &args.worlds)?;
            }
            let predicted = predict(&planner, &rows)?;
            let timed = dispatch(
                args.backend,
                &Placement::new(most, None)?,
                Round {
                    config: &config,
                    candidates: &rows,
                    round,
                    budget,
                },
            )??;
            for ((row, prediction), timed) in rows.iter_mut().zip(predicted).zip(timed) {
                row.add(prediction, timed);
            }
        }
        let mut done: Vec<PlanRow> = rows.into_iter().map(|r| r.row(model.name())).collect();
        mark_chosen(&mut done);
        report.rows.extend(done);
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let table = markdown(&report);
    for (name, text) in [
        ("plan.json", serde_json::to_string_pretty(&report)?),
        ("plan.md", table.clone()),
    ] {
        let path = args.out.join(name);
        crate::outputs::write("--out", &path, text.as_bytes())?;
    }
    print!("{table}");
    eprintln!("wrote plan.json and plan.md to {}", args.out.display());
    Ok(())
}

/// A candidate being measured: as the first round listed it, and each round's prediction
/// and timing so far.
struct Measuring {
    candidate: Candidate,
    /// Each round's prediction: its step, its most loaded rank's bytes, and whether `auto`
    /// chose it.
    predicted: Vec<(StepTime, f64, bool)>,
    /// Each round's timed steps.
    steps: Vec<Vec<f64>>,
    /// The most loaded rank's peak bytes over the rounds, if counted.
    peak: Option<u64>,
}

impl Measuring {
    fn add(&mut self, predicted: (StepTime, f64, bool), timed: TimedSteps) {
        let peak = timed.ranks.iter().filter_map(|r| r.peak_bytes).max();
        self.peak = self.peak.max(peak);
        self.predicted.push(predicted);
        self.steps.push(timed.steps);
    }

    /// The candidate's row: its median round, with every round beside it.
    fn row(self, model: &str) -> PlanRow {
        let rounds: Vec<RoundTiming> = self
            .predicted
            .iter()
            .zip(&self.steps)
            .map(|(&(time, _, chosen), steps)| RoundTiming {
                predicted: time.total,
                measured: median(steps),
                chosen,
            })
            .collect();
        let m = median_round(&rounds).expect("a benchmark has a round");
        let all: Vec<f64> = self.steps.concat();
        PlanRow {
            model: model.into(),
            world: self.candidate.ranks(),
            strategy: self.candidate.strategy,
            layout: self.candidate.layout,
            blocks: self.candidate.blocks.clone(),
            predicted: self.predicted[m].0,
            measured: rounds[m].measured,
            spread: spread(&all),
            predicted_bytes: self.predicted[m].1,
            measured_bytes: self.peak,
            chosen: false,
            rounds,
        }
    }
}

/// Every candidate that fits at each of `worlds`, as the first round's calibration lists them.
fn fitting(planner: &Planner, worlds: &[usize]) -> Result<Vec<Measuring>, String> {
    let mut all = Vec::new();
    for &world in worlds {
        let planned = planner
            .plan(world)
            .map_err(|e| format!("world {world}: {e}"))?;
        all.extend(
            planned
                .candidates
                .into_iter()
                .filter(|c| c.rejected.is_none())
                .map(|candidate| Measuring {
                    candidate,
                    predicted: Vec::new(),
                    steps: Vec::new(),
                    peak: None,
                }),
        );
    }
    Ok(all)
}

/// Each row's step, memory and whether `auto` chooses it, by this round's calibration.
fn predict(planner: &Planner, rows: &[Measuring]) -> Result<Vec<(StepTime, f64, bool)>, String> {
    let mut chosen: Vec<(usize, Layout)> = Vec::new();
    rows.iter()
        .map(|row| {
            let (world, layout) = (row.candidate.ranks(), &row.candidate.layout);
            let choice = match chosen.iter().find(|(w, _)| *w == world) {
                Some((_, layout)) => *layout,
                None => {
                    let planned = planner
                        .plan(world)
                        .map_err(|e| format!("world {world}: {e}"))?;
                    let layout = planned.chosen().layout;
                    chosen.push((world, layout));
                    layout
                }
            };
            // Predicted for the stage cut that ran (the first round's), which a later
            // round's calibration could cut otherwise.
            let (cluster, blocks) = (planner.cluster(world), &row.candidate.blocks);
            let work = &planner.workload;
            Ok((
                step_time_with(work, &cluster, layout, blocks),
                memory_with(work, &cluster, layout, blocks).total,
                choice == *layout,
            ))
        })
        .collect()
}

/// One round: every candidate trained and timed once, in the round's rotated order, as a job
/// on the chosen backend; the timings in the candidates' order.
struct Round<'a> {
    config: &'a TrainConfig,
    candidates: &'a [Measuring],
    round: usize,
    budget: Budget,
}

impl Job for Round<'_> {
    type Output = Result<Vec<TimedSteps>, String>;

    fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<Self::Output, Box<dyn std::error::Error>> {
        let mut timed: Vec<Option<TimedSteps>> = vec![None; self.candidates.len()];
        for i in rotation(self.candidates.len(), self.round) {
            let candidate = &self.candidates[i].candidate;
            tracing::info!(
                "round {} {} world {}: {} {:?}",
                self.round + 1,
                self.config.model.name(),
                candidate.ranks(),
                candidate.strategy.name(),
                candidate.layout
            );
            let job = Timed {
                candidate,
                performance: &self.config.optimizer,
                batch: self.config.batch,
                seed: self.config.seed,
                budget: self.budget,
                devices: &devices[..candidate.ranks()],
            };
            match with_builtin::<B, _>(self.config, &devices[0], job) {
                Ok(t) => timed[i] = Some(t),
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(Ok(timed
            .into_iter()
            .map(|t| t.expect("the rotation visits every candidate"))
            .collect()))
    }
}

/// One round of one candidate, on the built-in model.
struct Timed<'a, B: AutodiffBackend> {
    candidate: &'a Candidate,
    /// The run's precision and guards, as the planner timed its step with them: the same
    /// step is timed on both sides (a guard's check of the gradients is several launches and
    /// a read on a GPU).
    performance: &'a PerformanceConfig,
    batch: usize,
    seed: u64,
    budget: Budget,
    devices: &'a [B::Device],
}

impl<B> ModelJob<B> for Timed<'_, B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Output = Result<TimedSteps, String>;

    fn run<M, I>(self, model: M, data: DataSource<B, I, M::Input>) -> Self::Output
    where
        M: FitModel<B>,
        I: Send + Sync + Clone + 'static,
    {
        let mut base = StrategyConfigs::default();
        base.set_threads_per_rank(1);
        let plan = Plan::resolve(PlanRequest {
            world: Some(self.candidate.ranks()),
            configs: self.candidate.configs(&base),
            ..PlanRequest::new(self.candidate.strategy, self.batch)
        })
        .map_err(|e| e.to_string())?;
        let optim =
            PerformanceSpec::new(adamw(), self.performance.clone()).map_err(|e| e.to_string())?;
        time_steps(
            &plan,
            self.devices,
            model,
            &optim,
            data,
            self.budget,
            self.seed,
        )
        .map_err(|e| e.to_string())
    }
}
