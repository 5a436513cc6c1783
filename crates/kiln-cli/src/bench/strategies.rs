//! `kiln bench strategies`: the strategy × world size × model matrix of the kiln-bench crate,
//! on the backend chosen, written as JSON, Markdown and SVG.

use std::path::PathBuf;

use burn::tensor::backend::AutodiffBackend;
use kiln_bench::strategies::{self, BenchModel, Matrix, Report};
use kiln_core::strategy::StrategyKind;
use kiln_nn::tensor_parallel::ShardedBackend;

use crate::backend::{BackendKind, DeviceList, Job, Placement, dispatch, parse_devices};
use crate::names::{Named, strategy_parser};

/// Options of `kiln bench strategies`; the lists are comma-separated.
#[derive(clap::Args, Debug)]
pub struct StrategyArgs {
    /// A few steps of tiny models at worlds 1 and 2 (what the test suite runs) instead of the
    /// full matrix (worlds 1, 2, 4; three rounds).
    #[arg(long)]
    quick: bool,
    /// Backend of the ranks.
    #[arg(long, default_value = "flex")]
    backend: BackendKind,
    /// Device of each rank of the largest world, e.g. `0,0,0,0` for four ranks on GPU 0
    /// [default: CPU ranks share the CPU, CUDA ranks take GPUs 0..world].
    #[arg(long, value_parser = parse_devices)]
    devices: Option<DeviceList>,
    /// Models [default: all].
    #[arg(long, value_delimiter = ',', value_parser = model_parser())]
    models: Option<Vec<BenchModel>>,
    /// Strategies [default: single, data_parallel, ddp, pipeline, tensor].
    #[arg(long, value_delimiter = ',', value_parser = strategy_parser())]
    strategies: Option<Vec<StrategyKind>>,
    /// World sizes [default: 1,2,4; with --quick 1,2].
    #[arg(long, value_delimiter = ',')]
    worlds: Option<Vec<usize>>,
    /// Tensor-parallel shards of `tensor` [default: 2].
    #[arg(long)]
    tp: Option<usize>,
    /// Pipeline stages of each shard under `tensor`: 2 or more make the 3-D dp × pp × tp case
    /// (world 8 for tp 2, 2 stages and 2 replicas) [default: 1].
    #[arg(long)]
    tensor_stages: Option<usize>,
    /// Rounds, each over every scenario in rotated order [default: 3; with --quick 1].
    #[arg(long)]
    rounds: Option<usize>,
    /// Timed steps per round [default: 8; with --quick 2].
    #[arg(long)]
    steps: Option<usize>,
    /// Folder for strategies.json, strategies.md and strategies.svg.
    #[arg(long, visible_alias = "output", default_value = "runs/bench")]
    out: PathBuf,
    /// An earlier strategies.json: print each scenario's throughput against it.
    #[arg(long)]
    compare: Option<PathBuf>,
}

fn model_parser() -> Named<BenchModel> {
    const NAMES: [&str; 4] = [
        BenchModel::ALL[0].name(),
        BenchModel::ALL[1].name(),
        BenchModel::ALL[2].name(),
        BenchModel::ALL[3].name(),
    ];
    Named::new(&NAMES)
}

impl StrategyArgs {
    fn matrix(&self) -> Matrix {
        let mut matrix = if self.quick {
            Matrix::quick()
        } else {
            Matrix::full()
        };
        // Each named once, in the order given.
        fn unique<T: PartialEq + Copy>(list: &[T]) -> Vec<T> {
            let mut out = Vec::new();
            for &item in list {
                if !out.contains(&item) {
                    out.push(item);
                }
            }
            out
        }
        if let Some(models) = &self.models {
            matrix.models = unique(models);
        }
        if let Some(strategies) = &self.strategies {
            matrix.strategies = unique(strategies);
        }
        if let Some(worlds) = &self.worlds {
            matrix.worlds = unique(worlds);
        }
        matrix.tensor_shards = self.tp.unwrap_or(matrix.tensor_shards);
        matrix.tensor_stages = self.tensor_stages.unwrap_or(matrix.tensor_stages);
        matrix.rounds = self.rounds.unwrap_or(matrix.rounds);
        matrix.steps = self.steps.unwrap_or(matrix.steps);
        matrix
    }
}

/// Runs `kiln bench strategies`.
///
/// # Errors
/// An unreadable `--compare` file, an invalid matrix, a failing scenario, or an unwritable
/// output folder.
pub fn run(args: StrategyArgs) -> Result<(), Box<dyn std::error::Error>> {
    let _claim = crate::outputs::check_folder("--out", &args.out)?;
    // Read the earlier report first: a bad path should not cost a whole run.
    let old: Option<Report> = match &args.compare {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read --compare {}: {e}", path.display()))?;
            Some(serde_json::from_str(&text).map_err(|e| {
                format!(
                    "--compare {} is not a strategies.json report: {e}",
                    path.display()
                )
            })?)
        }
        None => None,
    };
    let matrix = args.matrix();
    // Everything is checked before the first scenario runs.
    matrix.validate()?;
    if let Some(old) = &old {
        strategies::comparable(old, &args.backend.to_string(), matrix.scale)
            .map_err(|reason| format!("--compare: {reason}"))?;
    }
    let ranks = matrix.worlds.iter().copied().max().unwrap_or(1);
    let devices = args.devices.as_ref().map(|DeviceList(d)| d.as_slice());
    let report = dispatch(
        args.backend,
        &Placement::new(ranks, devices)?,
        BenchJob {
            matrix: &matrix,
            backend: args.backend,
        },
    )?;

    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let table = strategies::markdown(&report);
    let write = |name: &str, text: &str| {
        let path = args.out.join(name);
        crate::outputs::write("--out", &path, text.as_bytes())
    };
    write("strategies.json", &serde_json::to_string_pretty(&report)?)?;
    write("strategies.md", &table)?;
    let svg = args.out.join("strategies.svg");
    strategies::write_svg(&report, &svg)
        .map_err(|e| format!("cannot write {}: {e}", svg.display()))?;
    print!("{table}");
    if let Some(old) = old {
        let (_, comparison) = strategies::compare(&report, &old);
        println!(
            "\nAgainst {}:\n\n{comparison}",
            args.compare.unwrap().display()
        );
    }
    eprintln!(
        "wrote strategies.json, strategies.md and strategies.svg to {}",
        args.out.display()
    );
    Ok(())
}

/// The matrix on whichever backend was chosen.
struct BenchJob<'a> {
    matrix: &'a Matrix,
    backend: BackendKind,
}

impl Job for BenchJob<'_> {
    type Output = Report;

    fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<Report, Box<dyn std::error::Error>> {
        let total = self.matrix.scenarios().len() * self.matrix.rounds;
        let mut done = 0;
        let report = strategies::run::<B>(
            &devices,
            self.matrix,
            &self.backend.to_string(),
            &mut |scenario, round| {
                done += 1;
                tracing::info!("[{done}/{total}] round {} {scenario}", round + 1);
            },
        )?;
        Ok(report)
    }
}
