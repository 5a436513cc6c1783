//! A trained run on disk: its config (TOML, so the model can be rebuilt and the run repeated)
//! and its parameters (Burn's named MessagePack recorder, full precision).

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::Backend;

use crate::config::AdConfig;
use crate::error::AdError;
use crate::model::AdTransformer;

const CONFIG: &str = "config.toml";
const MODEL: &str = "model";

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::new()
}

fn failed(path: &Path, reason: impl ToString) -> AdError {
    AdError::Checkpoint {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Writes `config` and `model` into `dir` (created if missing).
///
/// # Errors
/// When the folder or a file cannot be written.
pub fn save<B: Backend>(
    dir: &Path,
    config: &AdConfig,
    model: AdTransformer<B>,
) -> Result<(), AdError> {
    std::fs::create_dir_all(dir).map_err(|e| failed(dir, e))?;
    let text = toml::to_string_pretty(config).map_err(|e| failed(dir, e))?;
    let path = dir.join(CONFIG);
    std::fs::write(&path, text).map_err(|e| failed(&path, e))?;
    let path = dir.join(MODEL);
    model
        .save_file(path.clone(), &recorder())
        .map_err(|e| failed(&path, e))
}

/// Reads a run written by [`save`].
///
/// # Errors
/// When a file is missing or does not match the config's model.
pub fn load<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(AdConfig, AdTransformer<B>), AdError> {
    let path = dir.join(CONFIG);
    let text = std::fs::read_to_string(&path).map_err(|e| failed(&path, e))?;
    let config: AdConfig = toml::from_str(&text).map_err(|e| failed(&path, e))?;
    config.validate()?;
    let path: PathBuf = dir.join(MODEL);
    let model = config
        .model
        .init::<B>(&config.env, device)
        .load_file(path.clone(), &recorder(), device)
        .map_err(|e| failed(&path, e))?;
    Ok((config, model))
}
