//! `kiln train --save DIR` and `--resume DIR`: the model, the strategy's optimizer state and the
//! steps trained, so a resumed run continues bit for bit.

use std::path::Path;

use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::Backend;
use kiln_core::fit::Resume;
use kiln_core::optim::OptimizerState;

const MODEL: &str = "model";
const PROGRESS: &str = "progress.toml";

/// What `progress.toml` holds.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Progress {
    /// Optimizer steps trained.
    steps: usize,
}

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::new()
}

fn failed(path: &Path, reason: impl std::fmt::Display) -> String {
    format!("checkpoint {}: {reason}", path.display())
}

/// Writes `model`, `optimizer` and the step count into `dir` (created if missing).
///
/// # Errors
/// When a file cannot be written.
pub fn save<B: Backend, M: Module<B>>(
    dir: &Path,
    model: M,
    optimizer: &OptimizerState,
    steps: usize,
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| failed(dir, e))?;
    model
        .save_file(dir.join(MODEL), &recorder())
        .map_err(|e| failed(dir, e))?;
    optimizer.save(dir).map_err(|e| failed(dir, e))?;
    let text = toml::to_string(&Progress { steps }).map_err(|e| failed(dir, e))?;
    std::fs::write(dir.join(PROGRESS), text).map_err(|e| failed(dir, e))
}

/// Reads a checkpoint written by [`save`]: `model` with the saved parameters, and where to
/// resume.
///
/// # Errors
/// When a file is missing, unreadable, or does not fit `model`.
pub fn load<B: Backend, M: Module<B>>(
    dir: &Path,
    model: M,
    device: &B::Device,
) -> Result<(M, Resume), String> {
    let path = dir.join(PROGRESS);
    let text = std::fs::read_to_string(&path).map_err(|e| failed(&path, e))?;
    let progress: Progress = toml::from_str(&text).map_err(|e| failed(&path, e))?;
    let model = model
        .load_file(dir.join(MODEL), &recorder(), device)
        .map_err(|e| failed(dir, e))?;
    let optimizer = OptimizerState::load(dir).map_err(|e| failed(dir, e))?;
    Ok((
        model,
        Resume {
            step: progress.steps,
            optimizer,
        },
    ))
}
