//! `manifest.toml`: what wrote a checkpoint, and the size and digest of every file in it.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::Path;

use burn::module::Module;
use burn::tensor::backend::Backend;
use sha2::{Digest, Sha256};

use super::{CheckpointError, MANIFEST_DIGEST};
use crate::params::{ModelSignature, signature};
use crate::plan::Plan;

/// The manifest's format. 2 added the run's `inputs` and the manifest's own digest
/// ([`MANIFEST_DIGEST`](super::MANIFEST_DIGEST)), 3 the step's `eval_loss`; a reader takes 1
/// to 3 and refuses others.
pub(crate) const FORMAT: u32 = 3;

/// The oldest format this Kiln reads.
pub(crate) const OLDEST_FORMAT: u32 = 1;

/// What a checkpoint step holds and what wrote it. Written last into the step's folder, so a
/// folder with a manifest is complete.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The manifest format (this version's when written).
    pub format: u32,
    /// The Kiln version that wrote it.
    pub kiln_version: String,
    /// Optimizer steps trained when it was saved.
    pub step: usize,
    /// The model saved.
    pub model: ModelInfo,
    /// The run that saved it.
    pub run: RunInfo,
    /// Every file of the step but the manifest, by name.
    pub files: BTreeMap<String, FileDigest>,
    /// What the run read and a resume must read again unchanged (`data`, the base model's
    /// files), by the job's name for each.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, FileDigest>,
    /// The held-out loss of the model saved (format 3), when the run evaluated it at this
    /// step: the folder keeps the step of the lowest whatever its `keep`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
}

/// A model, as a checkpoint identifies it: the job's name for it and its parameters' layout.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    /// The job's name for the model (`mlp`, `transformer`, `ad`).
    pub kind: String,
    /// Parameter tensors.
    pub tensors: usize,
    /// Parameter values.
    pub parameters: u64,
    /// A digest of every parameter's path, shape and dtype ([`signature`]).
    pub signature: String,
}

impl ModelInfo {
    /// `model` under the job's name `kind`.
    pub fn of<B: Backend, M: Module<B>>(kind: &str, model: &M) -> Self {
        let ModelSignature {
            tensors,
            parameters,
            digest,
        } = signature(model);
        Self {
            kind: kind.to_string(),
            tensors,
            parameters,
            signature: digest,
        }
    }
}

impl fmt::Display for ModelInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a model '{}' of {} parameters in {} tensors (layout {})",
            self.kind, self.parameters, self.tensors, self.signature
        )
    }
}

/// The run that saved a checkpoint: what decides whether its optimizer state loads.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunInfo {
    /// The strategy (`ddp`).
    pub strategy: String,
    /// Its mesh (`dp=2 × pp=2`).
    pub mesh: String,
    /// How its optimizer state is cut ([`StateLayout::key`](crate::optim::StateLayout::key)).
    pub layout: String,
    /// The optimizer (`adamw`).
    pub optimizer: String,
    /// The training precision (`f32`, `bf16`, `f16`).
    pub precision: String,
}

impl RunInfo {
    /// The run of `plan` with `optimizer` in `precision`.
    pub fn of(plan: &Plan, optimizer: &str, precision: impl fmt::Display) -> Self {
        Self {
            strategy: plan.strategy().to_string(),
            mesh: plan.mesh().to_string(),
            layout: plan.state_layout().key(),
            optimizer: optimizer.to_string(),
            precision: precision.to_string(),
        }
    }
}

/// A file's size and SHA-256, as written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDigest {
    /// Bytes.
    pub bytes: u64,
    /// SHA-256, lowercase hex.
    pub sha256: String,
}

impl FileDigest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self {
            bytes: bytes.len() as u64,
            sha256: sha256_hex(bytes),
        }
    }
}

impl FileDigest {
    /// The digest of the file at `path`, read in pieces (a model's weights need not fit in
    /// memory twice).
    ///
    /// # Errors
    /// When the file cannot be read.
    pub fn of_file(path: &std::path::Path) -> std::io::Result<Self> {
        let mut file = std::fs::File::open(path)?;
        let mut hasher = Sha256::new();
        let bytes = std::io::copy(&mut file, &mut hasher)?;
        Ok(Self {
            bytes,
            sha256: hex(&hasher.finalize()),
        })
    }
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `bytes`, lowercase hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

impl Manifest {
    /// The manifest at `path`, read and checked: a format this Kiln reads, its text against
    /// its own digest ([`MANIFEST_DIGEST`]) from format 2, every field known.
    ///
    /// # Errors
    /// [`CheckpointError::Manifest`] naming what is wrong; a missing or different digest.
    pub(crate) fn read(path: &Path) -> Result<Self, CheckpointError> {
        let unreadable = |reason: String| CheckpointError::Manifest {
            path: display(path),
            reason,
        };
        let text = fs::read_to_string(path).map_err(|e| unreadable(e.to_string()))?;
        let value: toml::Value =
            toml::from_str(&text).map_err(|e| unreadable(e.message().trim().to_string()))?;
        // The format first: a later format's new fields must not read as "unknown field".
        let format = value.get("format").and_then(toml::Value::as_integer);
        if !format.is_some_and(|f| (i64::from(OLDEST_FORMAT)..=i64::from(FORMAT)).contains(&f)) {
            let writer = value
                .get("kiln_version")
                .and_then(toml::Value::as_str)
                .unwrap_or("unknown");
            return Err(unreadable(match format {
                Some(f) => format!(
                    "format {f} (written by kiln {writer}), but this kiln reads formats \
                     {OLDEST_FORMAT} to {FORMAT}"
                ),
                None => "no format field".to_string(),
            }));
        }
        if format.is_some_and(|f| f >= 2) {
            check_digest(path, &text)?;
        }
        value
            .try_into()
            .map_err(|e: toml::de::Error| unreadable(e.message().trim().to_string()))
    }
}

/// Checks the manifest's text against its own digest ([`MANIFEST_DIGEST`]).
fn check_digest(path: &Path, text: &str) -> Result<(), CheckpointError> {
    let sidecar = path.with_file_name(MANIFEST_DIGEST);
    let recorded = match fs::read_to_string(&sidecar) {
        Ok(line) => line.split_whitespace().next().unwrap_or("").to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CheckpointError::Missing {
                path: display(&sidecar),
            });
        }
        Err(e) => return Err(CheckpointError::io("read", &sidecar, e)),
    };
    let found = sha256_hex(text.as_bytes());
    if found != recorded {
        return Err(CheckpointError::Digest {
            path: display(path),
            expected: recorded,
            found,
        });
    }
    Ok(())
}

/// A path as the errors print it.
pub(super) fn display(path: &Path) -> String {
    path.display().to_string()
}
