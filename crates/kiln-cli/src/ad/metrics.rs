//! What `kiln ad` writes: `metrics.json` (the config, the data, training and evaluation
//! summaries, and seconds per stage) and the `returns.svg` plot.

use std::path::Path;

use kiln_ad::config::AdConfig;
use kiln_ad::report::EvalReport;
use kiln_ad::run::Seconds;
use kiln_ad::train::{Data, TrainSummary};
use serde::Serialize;

/// What `metrics.json` holds.
#[derive(Serialize)]
pub struct Metrics<'a> {
    /// The config that ran.
    pub config: &'a AdConfig,
    /// The backend it ran on.
    pub backend: String,
    /// The data, when this command generated it.
    pub data: Option<DataSummary>,
    /// Training, when this command trained.
    pub train: Option<TrainSummary>,
    /// The evaluation, unless skipped.
    pub eval: Option<EvalReport>,
    /// Wall-clock seconds per stage.
    pub seconds: Seconds,
}

/// The size of the generated data.
#[derive(Serialize)]
pub struct DataSummary {
    /// Goals with learning histories.
    train_goals: usize,
    /// Goals kept for evaluation.
    held_out_goals: usize,
    /// Learning histories.
    histories: usize,
    /// Steps in each.
    steps_per_history: usize,
    /// The source's mean return per episode over the training histories.
    source_training_curve: Vec<f64>,
}

impl DataSummary {
    /// Summarises `data`.
    pub fn new(data: &Data) -> Self {
        Self {
            train_goals: data.goals.train.len(),
            held_out_goals: data.goals.held_out.len(),
            histories: data.histories.count(),
            steps_per_history: data.histories.len(),
            source_training_curve: data.histories.mean_episode_returns(),
        }
    }
}

/// Writes `metrics.json` into `dir` (and to `json` when given) and, when there is an
/// evaluation, the plot to `svg` or `<dir>/returns.svg`.
///
/// # Errors
/// A file that cannot be written.
pub fn write_outputs(
    metrics: &Metrics<'_>,
    dir: &Path,
    json: Option<&Path>,
    svg: Option<&Path>,
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let text = serde_json::to_string_pretty(metrics)?;
    for path in std::iter::once(dir.join("metrics.json")).chain(json.map(Path::to_path_buf)) {
        crate::outputs::write("--json", &path, text.as_bytes())?;
    }
    if let Some(report) = &metrics.eval {
        let path = svg.map_or_else(|| dir.join("returns.svg"), Path::to_path_buf);
        kiln_ad::plot::write_svg(report, &path)?;
        println!(
            "wrote {} and {}",
            dir.join("metrics.json").display(),
            path.display()
        );
    }
    Ok(())
}
