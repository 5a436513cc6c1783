//! A run on disk. `kiln ad train --out DIR` saves into `DIR/checkpoints/step-<N>/` (Kiln's
//! verified checkpoints: the parameters, the optimizer state, and this job's `config.toml`,
//! so a step can be evaluated or resumed on its own), and writes `DIR/config.toml` to read
//! and to pass back with `--config`.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use kiln_core::checkpoint::{Checkpoint, CheckpointFolder, RunInfo, Saver, config_differences};
use kiln_core::fit::Resume;
use kiln_core::plan::Plan;

use crate::config::AdConfig;
use crate::error::AdError;
use crate::eval::EvalConfig;
use crate::model::AdTransformer;

/// The config's file, in the run folder and in every checkpoint step.
pub const CONFIG: &str = "config.toml";
/// The checkpoint folder inside a run folder.
pub const CHECKPOINTS: &str = "checkpoints";
/// The model's name in checkpoint manifests.
pub const KIND: &str = "ad";

/// The checkpoint folder of the run folder `dir`.
pub fn checkpoints(dir: &Path) -> PathBuf {
    dir.join(CHECKPOINTS)
}

/// The config as its TOML file holds it.
///
/// # Errors
/// When it cannot be serialised.
pub fn config_text(config: &AdConfig) -> Result<String, AdError> {
    toml::to_string_pretty(config).map_err(|e| AdError::BadConfig {
        path: CONFIG.to_string(),
        reason: e.to_string(),
    })
}

/// A saver of `config`'s run by `plan` into the checkpoint folder `folder`.
///
/// # Errors
/// When the config cannot be serialised.
pub fn saver(folder: CheckpointFolder, config: &AdConfig, plan: &Plan) -> Result<Saver, AdError> {
    let run = RunInfo::of(plan, "adamw", config.optimizer.precision);
    Ok(Saver::new(folder, KIND, run).with_file(CONFIG, config_text(config)?.into_bytes()))
}

/// Opens and verifies a checkpoint: `path` is a run folder (its newest step), a checkpoint
/// folder, or one `step-<N>` folder.
///
/// # Errors
/// A path without a checkpoint, or a damaged one.
pub fn open(path: &Path) -> Result<Checkpoint, AdError> {
    let inner = checkpoints(path);
    let path = if inner.is_dir() { &inner } else { path };
    Ok(Checkpoint::open(path)?)
}

/// The config a checkpoint was trained with.
///
/// # Errors
/// A checkpoint without one, or one that does not parse or validate.
pub fn config_of(checkpoint: &Checkpoint) -> Result<AdConfig, AdError> {
    let path = checkpoint.dir().join(CONFIG).display().to_string();
    let text = std::str::from_utf8(checkpoint.file(CONFIG)?).map_err(|e| AdError::BadConfig {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let config: AdConfig = toml::from_str(text).map_err(|e| AdError::BadConfig {
        path,
        reason: e.message().trim().to_string(),
    })?;
    config.validate()?;
    Ok(config)
}

/// Reads a run for evaluation: the newest step of the run folder `path` (or the step or
/// checkpoint folder `path`), its config and its model on `device`.
///
/// # Errors
/// A path without a checkpoint, a damaged one, or one of another model.
pub fn load<B: Backend>(
    path: &Path,
    device: &B::Device,
) -> Result<(AdConfig, AdTransformer<B>), AdError> {
    load_with::<B>(path, device, |_| {})
}

/// [`load`], with the evaluation's settings changed by `adjust` (a user's `--episodes`, say)
/// and checked before the model is built.
///
/// # Errors
/// As [`load`], and a changed config that does not validate.
pub fn load_with<B: Backend>(
    path: &Path,
    device: &B::Device,
    adjust: impl FnOnce(&mut EvalConfig),
) -> Result<(AdConfig, AdTransformer<B>), AdError> {
    let checkpoint = open(path)?;
    let mut config = config_of(&checkpoint)?;
    adjust(&mut config.eval);
    config.validate()?;
    let model = config.model.init::<B>(&config.env, device);
    let model = checkpoint.model(KIND, model, device)?;
    Ok((config, model))
}

/// Checks that `config` trains what `checkpoint` was trained with: every setting but the
/// ones a resumed run may change (`train.steps`, where it trains: `train.world`,
/// `train.strategy` and `parallel`, which the plan's check covers, and `checkpoint`, `eval`).
///
/// Returns the saved run's `train.steps`.
///
/// # Errors
/// [`AdError::OtherConfig`] naming the settings that differ.
pub fn check_config(checkpoint: &Checkpoint, config: &AdConfig) -> Result<usize, AdError> {
    let saved = config_of(checkpoint)?;
    let comparable = |c: &AdConfig| -> Result<toml::Value, AdError> {
        let mut c = c.clone();
        c.train.steps = 0;
        // Where the run trains may change; the plan's own check covers the optimizer state.
        c.train.world = None;
        c.train.strategy = Default::default();
        c.parallel = Default::default();
        c.checkpoint = Default::default();
        c.eval = Default::default();
        toml::Value::try_from(&c).map_err(|e| AdError::BadConfig {
            path: CONFIG.to_string(),
            reason: e.to_string(),
        })
    };
    let fields = config_differences(&comparable(&saved)?, &comparable(config)?);
    if fields.is_empty() {
        return Ok(saved.train.steps);
    }
    Err(AdError::OtherConfig {
        path: checkpoint.dir().join(CONFIG).display().to_string(),
        fields: fields.join(", "),
    })
}

/// The model and where to resume, from `checkpoint` of a run of `config` by `plan`.
///
/// # Errors
/// Another config, model or strategy than the checkpoint's.
pub fn resume<B: Backend>(
    checkpoint: &Checkpoint,
    config: &AdConfig,
    plan: &Plan,
    model: AdTransformer<B>,
    device: &B::Device,
) -> Result<(AdTransformer<B>, Resume), AdError> {
    let saved_steps = check_config(checkpoint, config)?;
    if saved_steps != config.train.steps {
        tracing::warn!(
            "the saved run was to train {saved_steps} steps and this one trains {}: the \
             learning-rate schedule spans train.steps, so the steps left train at other rates \
             than the saved run's would have",
            config.train.steps
        );
    }
    let model = checkpoint.model(KIND, model, device)?;
    let resume = Resume {
        step: checkpoint.step(),
        optimizer: checkpoint.optimizer(plan)?,
    };
    Ok((model, resume))
}
