//! Reading a checkpoint step back, every file checked before anything is decoded.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::Backend;

use super::folder::{parse_step, steps_in};
use super::manifest::{FileDigest, Manifest, ModelInfo, RunInfo, display, sha256_hex};
use super::{CheckpointError, MANIFEST, MODEL};
use crate::optim::{OptimizerState, StateLayout};
use crate::plan::Plan;

/// A checkpoint step read from disk and verified: every file its manifest lists is present,
/// of the size written, and of the digest written.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    dir: PathBuf,
    manifest: Manifest,
    files: BTreeMap<String, Vec<u8>>,
}

/// A digest's first 12 hex digits, enough to tell two apart in a message.
fn short(sha256: &str) -> &str {
    &sha256[..sha256.len().min(12)]
}

impl Checkpoint {
    /// Opens `path`: a step folder (`DIR/step-<N>`, holding a `manifest.toml`), or a
    /// checkpoint folder, whose newest step is opened. Reads and verifies every file.
    ///
    /// # Errors
    /// [`CheckpointError::NotFound`] for a path without a checkpoint,
    /// [`CheckpointError::Manifest`], [`CheckpointError::Missing`],
    /// [`CheckpointError::Size`] or [`CheckpointError::Digest`] for a damaged one.
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        let dir = Self::step_dir(path)?;
        let manifest_path = dir.join(MANIFEST);
        let manifest = Self::read_manifest(&manifest_path)?;
        let mut files = BTreeMap::new();
        for (name, digest) in &manifest.files {
            let path = dir.join(name);
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(CheckpointError::Missing {
                        path: display(&path),
                    });
                }
                Err(e) => return Err(CheckpointError::io("read", &path, e)),
            };
            if bytes.len() as u64 != digest.bytes {
                return Err(CheckpointError::Size {
                    path: display(&path),
                    expected: digest.bytes,
                    found: bytes.len() as u64,
                });
            }
            let found = sha256_hex(&bytes);
            if found != digest.sha256 {
                return Err(CheckpointError::Digest {
                    path: display(&path),
                    expected: digest.sha256.clone(),
                    found,
                });
            }
            files.insert(name.clone(), bytes);
        }
        Ok(Self {
            dir,
            manifest,
            files,
        })
    }

    /// The run the checkpoint at `path` (as [`Checkpoint::open`] takes it) records, from its
    /// manifest alone: no file is read or verified. What a run plans its layout with before
    /// it opens the checkpoint.
    ///
    /// # Errors
    /// As [`Checkpoint::open`] for a missing or unreadable manifest.
    pub fn run_at(path: &Path) -> Result<RunInfo, CheckpointError> {
        Ok(Self::read_manifest(&Self::step_dir(path)?.join(MANIFEST))?.run)
    }

    /// How the checkpoint at `path` cuts its optimizer state, from its manifest alone: the
    /// layout a run that resumes from it must keep.
    ///
    /// # Errors
    /// As [`Checkpoint::run_at`], and [`CheckpointError::Manifest`] for a layout this Kiln
    /// does not know.
    pub fn layout_at(path: &Path) -> Result<StateLayout, CheckpointError> {
        let dir = Self::step_dir(path)?;
        let run = Self::read_manifest(&dir.join(MANIFEST))?.run;
        StateLayout::from_key(&run.layout).ok_or_else(|| CheckpointError::Manifest {
            path: display(&dir.join(MANIFEST)),
            reason: format!(
                "its optimizer state's layout {:?} is not one this Kiln knows",
                run.layout
            ),
        })
    }

    /// The step folder `path` names: itself when it holds a manifest, else its newest step.
    fn step_dir(path: &Path) -> Result<PathBuf, CheckpointError> {
        if path.join(MANIFEST).exists() {
            return Ok(path.to_path_buf());
        }
        match steps_in(path)?.pop() {
            Some((_, newest)) => Ok(newest),
            None if path.exists() => Err(CheckpointError::NotFound {
                path: display(path),
            }),
            None => Err(CheckpointError::io("read", path, "no such file or folder")),
        }
    }

    /// The manifest at `path` ([`Manifest::read`]), which must name the step its folder does.
    pub(crate) fn read_manifest(path: &Path) -> Result<Manifest, CheckpointError> {
        let manifest = Manifest::read(path)?;
        // The folder's name is the step a resume is chosen by; the manifest's is the one it
        // continues from. Both must say the same.
        let folder = path
            .parent()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str());
        if let Some(named) = folder.and_then(parse_step)
            && named != manifest.step
        {
            return Err(CheckpointError::Manifest {
                path: display(path),
                reason: format!(
                    "it says step {}, but its folder is step {named}",
                    manifest.step
                ),
            });
        }
        Ok(manifest)
    }

    /// Checks that the run's `current` inputs are the ones the checkpoint recorded, by name:
    /// a resume on changed data or another base model would silently train something else.
    /// Inputs the checkpoint did not record (an older Kiln's) are not checked.
    ///
    /// # Errors
    /// [`CheckpointError::InputChanged`] naming the first input that differs.
    pub fn check_inputs(
        &self,
        current: &BTreeMap<String, FileDigest>,
    ) -> Result<(), CheckpointError> {
        for (name, saved) in &self.manifest.inputs {
            let now = current.get(name);
            if now != Some(saved) {
                return Err(CheckpointError::InputChanged {
                    checkpoint: display(&self.dir),
                    input: name.clone(),
                    was: format!("{} bytes, sha256 {}", saved.bytes, short(&saved.sha256)),
                    now: now.map_or_else(
                        || "absent".to_string(),
                        |d| format!("{} bytes, sha256 {}", d.bytes, short(&d.sha256)),
                    ),
                });
            }
        }
        Ok(())
    }

    /// The step's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the step holds and what wrote it.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Optimizer steps trained when it was saved.
    pub fn step(&self) -> usize {
        self.manifest.step
    }

    /// The verified bytes of the job's file `name` (`config.toml`).
    ///
    /// # Errors
    /// [`CheckpointError::NoFile`] when the step has no such file.
    pub fn file(&self, name: &str) -> Result<&[u8], CheckpointError> {
        self.files
            .get(name)
            .map(Vec::as_slice)
            .ok_or_else(|| CheckpointError::NoFile {
                path: display(&self.dir),
                file: name.to_string(),
            })
    }

    /// Checks that the step holds a model like `model`, named `kind` by its job.
    ///
    /// # Errors
    /// [`CheckpointError::OtherModel`].
    pub fn check_model<B: Backend, M: Module<B>>(
        &self,
        kind: &str,
        model: &M,
    ) -> Result<(), CheckpointError> {
        let expected = ModelInfo::of(kind, model);
        let found = &self.manifest.model;
        if found.kind != expected.kind || found.signature != expected.signature {
            return Err(CheckpointError::OtherModel {
                path: display(&self.dir.join(MANIFEST)),
                expected: expected.to_string(),
                found: found.to_string(),
            });
        }
        Ok(())
    }

    /// `model` (named `kind` by its job) with the step's parameters, on `device`.
    ///
    /// # Errors
    /// [`CheckpointError::OtherModel`] for a checkpoint of another model,
    /// [`CheckpointError::Decode`] for parameters that do not decode.
    pub fn model<B: Backend, M: Module<B>>(
        &self,
        kind: &str,
        model: M,
        device: &B::Device,
    ) -> Result<M, CheckpointError> {
        self.check_model(kind, &model)?;
        let bytes = self.file(MODEL)?.to_vec();
        let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
        let record =
            Recorder::<B>::load(&recorder, bytes, device).map_err(|e| CheckpointError::Decode {
                path: display(&self.dir.join(MODEL)),
                reason: first_line(&e.to_string()),
            })?;
        Ok(model.load_record(record))
    }

    /// Checks that `plan` cuts its optimizer state as the run that saved the step did.
    ///
    /// # Errors
    /// [`CheckpointError::OtherStrategy`].
    pub fn check_plan(&self, plan: &Plan) -> Result<(), CheckpointError> {
        let run = &self.manifest.run;
        let expected = plan.state_layout();
        if run.layout != expected.key() {
            let found = StateLayout::from_key(&run.layout)
                .map_or_else(|| run.layout.clone(), |l| l.to_string());
            return Err(CheckpointError::OtherStrategy {
                path: display(&self.dir.join(MANIFEST)),
                found_strategy: format!("{} (mesh {})", run.strategy, run.mesh),
                found_layout: found,
                expected_strategy: format!("{} (mesh {})", plan.strategy(), plan.mesh()),
                expected_layout: expected.to_string(),
            });
        }
        Ok(())
    }

    /// The optimizer state saved, checked against `plan` first.
    ///
    /// # Errors
    /// [`CheckpointError::OtherStrategy`], or [`CheckpointError::NoFile`] for a state file
    /// the manifest does not list.
    pub fn optimizer(&self, plan: &Plan) -> Result<OptimizerState, CheckpointError> {
        self.check_plan(plan)?;
        OptimizerState::from_files(plan.state_layout(), |name| {
            self.file(name).map(<[u8]>::to_vec)
        })
    }
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or(text).trim().to_string()
}
