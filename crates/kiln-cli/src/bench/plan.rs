//! `kiln bench plan`: the planner against the clock. For each built-in model it measures this
//! machine as `auto` does, then trains every candidate layout the cost model estimates at each
//! world size and times it, in rounds whose order rotates, and writes predicted next to
//! measured (`plan.json`, `plan.md`). Run it with `KILN_COUNT_MEMORY=1` to set each rank's
//! peak memory beside the predicted. On the CPU backends the ranks are the cores; with
//! `--backend cuda`, the GPUs (one rank each: `--worlds` up to their number).

use std::path::PathBuf;

use burn::tensor::backend::AutodiffBackend;
use kiln_bench::plan::{Calibration, PlanReport, PlanRow, markdown};
use kiln_bench::stats::rotation;
use kiln_core::data::DataSource;
use kiln_core::model::ParallelModel;
use kiln_core::optim::PerformanceConfig;
use kiln_core::plan::cost::Candidate;
use kiln_core::plan::measure::{Budget, TimedSteps, median, spread, time_steps};
use kiln_core::plan::{Plan, PlanRequest, Planner};
use kiln_core::strategy::{PerformanceSpec, StrategyConfigs};
use kiln_nn::tensor_parallel::ShardedBackend;

use crate::backend::{BackendKind, Job, Placement, dispatch};
use crate::train::{ModelJob, ModelKind, TrainConfig, adamw, with_builtin};

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
    #[arg(long, default_value = "runs/bench")]
    out: PathBuf,
}

/// Runs `kiln bench plan`.
///
/// # Errors
/// Bad flags, a failed measurement or candidate, or an unwritable output folder.
pub fn run(args: PlanBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    crate::outputs::check_folder("--out", &args.out)?;
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
            backend: args.backend,
            world,
            batch: args.global_batch,
            ..TrainConfig::default()
        };
        config.validate()?;
        let planner = crate::plan::planner(&config)?;
        let measured = planner
            .cluster
            .measured
            .clone()
            .expect("a planner of this machine is measured");
        report.calibrations.push(Calibration {
            model: model.name().into(),
            measured,
            latency: planner.cluster.intra_latency,
            bandwidth: planner.cluster.intra_bandwidth,
        });
        let rows = dispatch(
            args.backend,
            &Placement::new(most, None)?,
            Candidates {
                config: &config,
                planner: &planner,
                worlds: &args.worlds,
                rounds: args.rounds,
                budget,
            },
        )??;
        report.rows.extend(rows);
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let table = markdown(&report);
    for (name, text) in [
        ("plan.json", serde_json::to_string_pretty(&report)?),
        ("plan.md", table.clone()),
    ] {
        let path = args.out.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    print!("{table}");
    eprintln!("wrote plan.json and plan.md to {}", args.out.display());
    Ok(())
}

/// Every candidate of every world, trained and timed, as a job on the chosen backend.
struct Candidates<'a> {
    config: &'a TrainConfig,
    planner: &'a Planner,
    worlds: &'a [usize],
    rounds: usize,
    budget: Budget,
}

impl Job for Candidates<'_> {
    type Output = Result<Vec<PlanRow>, String>;

    fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<Self::Output, Box<dyn std::error::Error>> {
        // Every candidate that fits, and whether `auto` chooses it at its world size.
        let mut all: Vec<(Candidate, bool)> = Vec::new();
        for &world in self.worlds {
            let planned = match self.planner.plan(world) {
                Ok(planned) => planned,
                Err(e) => return Ok(Err(format!("world {world}: {e}"))),
            };
            for (i, c) in planned.candidates.into_iter().enumerate() {
                if c.rejected.is_none() {
                    all.push((c, i == 0));
                }
            }
        }
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); all.len()];
        let mut peaks: Vec<Option<u64>> = vec![None; all.len()];
        for round in 0..self.rounds {
            for i in rotation(all.len(), round) {
                let (candidate, _) = &all[i];
                tracing::info!(
                    "round {} {} world {}: {} {:?}",
                    round + 1,
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
                let timed = match with_builtin::<B, _>(self.config, &devices[0], job) {
                    Ok(t) => t,
                    Err(e) => return Ok(Err(e)),
                };
                times[i].extend(&timed.steps);
                let peak = timed.ranks.iter().filter_map(|r| r.peak_bytes).max();
                peaks[i] = peaks[i].max(peak);
            }
        }
        Ok(Ok(all
            .into_iter()
            .zip(times.iter().zip(peaks))
            .map(|((c, chosen), (steps, peak))| PlanRow {
                model: self.config.model.name().into(),
                world: c.ranks(),
                strategy: c.strategy,
                layout: c.layout,
                predicted: c.time,
                measured: median(steps),
                spread: spread(steps),
                predicted_bytes: c.memory.total,
                measured_bytes: peak,
                chosen,
            })
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
        M: ParallelModel<B>,
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
