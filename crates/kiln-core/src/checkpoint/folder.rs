//! Writing checkpoint steps into a folder: staged, synced, renamed into place, pruned.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::Backend;

use super::manifest::{FORMAT, FileDigest, Manifest, ModelInfo, RunInfo, sha256_hex};
use super::{CheckpointError, MANIFEST, MANIFEST_DIGEST, MODEL};
use crate::optim::OptimizerState;

/// A folder of checkpoint steps (`step-<N>/`), the newest `keep` of them kept. See the
/// [module docs](super).
#[derive(Debug, Clone)]
pub struct CheckpointFolder {
    root: PathBuf,
    keep: usize,
    /// Steps after this one are another run's, to remove once this run's first save is in
    /// place (`--overwrite`): until then they stay, in case the run fails to start.
    discard_after: Option<usize>,
    /// `.lock`, held from [`Self::prepare`] on: one run saves into a folder at a time (the
    /// system releases it when the process ends, however it ends).
    lock: Option<Arc<File>>,
    /// The run's inputs, recorded in every step's manifest.
    inputs: BTreeMap<String, FileDigest>,
    /// The held-out loss of the model at a step, recorded in that step's manifest if it is
    /// saved ([`Self::record_eval`]).
    eval: Option<(usize, f64)>,
}

/// The lock file of a checkpoint folder.
const LOCK: &str = ".lock";

/// The folder name of step `step`: zero-padded so that names sort as steps do.
pub(crate) fn step_name(step: usize) -> String {
    format!("step-{step:08}")
}

/// The step a folder name names; `None` for any other name.
pub(crate) fn parse_step(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("step-")?;
    digits
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| digits.parse().ok())
        .flatten()
}

/// The `step-<N>` folders of `root`, oldest first (none when `root` does not exist).
pub(crate) fn steps_in(root: &Path) -> Result<Vec<(usize, PathBuf)>, CheckpointError> {
    if !root.exists() {
        return Ok(Vec::new());
    }
    let entries = fs::read_dir(root).map_err(|e| CheckpointError::io("read", root, e))?;
    let mut steps: Vec<(usize, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|entry| {
            let step = parse_step(entry.file_name().to_str()?)?;
            Some((step, entry.path()))
        })
        .collect();
    steps.sort();
    Ok(steps)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    crate::output::write_synced(path, bytes).map_err(CheckpointError::from)
}

fn sync_folder(path: &Path) -> Result<(), CheckpointError> {
    crate::output::sync_folder(path).map_err(CheckpointError::from)
}

/// Removes a folder by renaming it aside first (and making the rename durable), so that no
/// `step-<N>` is ever half removed.
fn remove_step(root: &Path, dir: &Path) -> Result<(), CheckpointError> {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("step");
    let aside = root.join(format!(".{name}.removing-{}", std::process::id()));
    fs::rename(dir, &aside).map_err(|e| CheckpointError::io("rename", dir, e))?;
    sync_folder(root)?;
    fs::remove_dir_all(&aside).map_err(|e| CheckpointError::io("remove", &aside, e))
}

impl CheckpointFolder {
    /// The folder `root`, keeping the newest `keep` steps.
    pub fn new(root: impl Into<PathBuf>, keep: usize) -> Self {
        Self {
            root: root.into(),
            keep: keep.max(1),
            discard_after: None,
            lock: None,
            inputs: BTreeMap::new(),
            eval: None,
        }
    }

    /// Records the held-out loss `loss` of the model after `step` steps: a save of that step
    /// writes it into its manifest, and the step of the lowest loss saved is kept whatever
    /// `keep` says (as transformers keeps its best checkpoint under `save_total_limit`).
    pub fn record_eval(&mut self, step: usize, loss: f64) {
        self.eval = Some((step, loss));
    }

    /// Records the run's `inputs` (the data file, the base model's files) in every step saved
    /// from now on, for a resume to check ([`Checkpoint::check_inputs`](super::Checkpoint::check_inputs)).
    pub fn with_inputs(mut self, inputs: BTreeMap<String, FileDigest>) -> Self {
        self.inputs = inputs;
        self
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder step `step` is saved in.
    pub fn step_dir(&self, step: usize) -> PathBuf {
        self.root.join(step_name(step))
    }

    /// The steps saved, oldest first.
    ///
    /// # Errors
    /// When the folder cannot be read.
    pub fn steps(&self) -> Result<Vec<(usize, PathBuf)>, CheckpointError> {
        steps_in(&self.root)
    }

    /// Readies the folder for a run that continues from step `from` (0 for a fresh run),
    /// before that run trains a step: creates it, checks that it is a writable folder, sweeps
    /// away what crashed saves left, prunes it to `keep`, and refuses steps beyond `from`
    /// (they belong to another run, or to a later point of this one) unless `overwrite`: then
    /// they are removed once this run's first save is in place.
    ///
    /// # Errors
    /// [`CheckpointError::NotAFolder`], [`CheckpointError::Io`] for a folder that cannot be
    /// created or written, [`CheckpointError::InUse`].
    pub fn prepare(&mut self, from: usize, overwrite: bool) -> Result<(), CheckpointError> {
        let root = &self.root;
        if root.exists() && !root.is_dir() {
            return Err(CheckpointError::NotAFolder {
                path: root.display().to_string(),
            });
        }
        fs::create_dir_all(root).map_err(|e| CheckpointError::io("create", root, e))?;
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            // The folder's own entry, should it be new.
            sync_folder(parent)?;
        }
        if self.lock.is_none() {
            let path = root.join(LOCK);
            let file = File::create(&path).map_err(|e| CheckpointError::io("create", &path, e))?;
            match file.try_lock() {
                Ok(()) => self.lock = Some(Arc::new(file)),
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(CheckpointError::Locked {
                        path: root.display().to_string(),
                    });
                }
                Err(fs::TryLockError::Error(e)) => {
                    return Err(CheckpointError::io("lock", &path, e));
                }
            }
        }
        let root = &self.root;
        let probe = root.join(format!(".probe-{}", std::process::id()));
        write_synced(&probe, b"")?;
        fs::remove_file(&probe).map_err(|e| CheckpointError::io("remove", &probe, e))?;
        self.sweep()?;
        let later: Vec<_> = self
            .steps()?
            .into_iter()
            .filter(|(step, _)| *step > from)
            .collect();
        match later.last() {
            Some((newest, _)) if !overwrite => {
                return Err(CheckpointError::InUse {
                    path: self.root.display().to_string(),
                    newest: *newest,
                    why: if from == 0 {
                        "and this run starts from step 0".to_string()
                    } else {
                        format!("beyond step {from} that this run continues from")
                    },
                });
            }
            Some(_) => {
                self.discard_after = Some(from);
            }
            None => self.prune()?,
        }
        Ok(())
    }

    /// Removes the staging and removal folders that an interrupted save left behind, and
    /// puts back a step that was set aside to be replaced when its replacement never landed.
    fn sweep(&self) -> Result<(), CheckpointError> {
        let root = &self.root;
        let entries = fs::read_dir(root).map_err(|e| CheckpointError::io("read", root, e))?;
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !(name.starts_with(".step-") && entry.file_type().is_ok_and(|t| t.is_dir())) {
                continue;
            }
            let path = entry.path();
            if let Some((step, _)) = name[1..].split_once(".replaced-") {
                let target = root.join(step);
                if !target.exists() {
                    fs::rename(&path, &target)
                        .map_err(|e| CheckpointError::io("rename", &path, e))?;
                    continue;
                }
            }
            fs::remove_dir_all(&path).map_err(|e| CheckpointError::io("remove", &path, e))?;
        }
        sync_folder(root)
    }

    /// Saves `model` and `optimizer` as step `step`, with the job's own `files` beside them
    /// (`("config.toml", bytes)`), and prunes the folder to its newest steps. Returns the
    /// step's folder.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when a file cannot be written; the earlier steps are then
    /// untouched.
    pub fn save<B: Backend, M: Module<B>>(
        &mut self,
        step: usize,
        kind: &str,
        model: M,
        optimizer: &OptimizerState,
        run: RunInfo,
        files: &[(&str, &[u8])],
    ) -> Result<PathBuf, CheckpointError> {
        let info = ModelInfo::of(kind, &model);
        let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
        let bytes = Recorder::<B>::record(&recorder, model.into_record(), ())
            .map_err(|e| CheckpointError::io("encode", &self.root.join(MODEL), e))?;
        let mut all: Vec<(&str, &[u8])> = vec![(MODEL, &bytes)];
        let state = optimizer.files();
        all.extend(state.iter().map(|(name, part)| (name.as_str(), *part)));
        all.extend_from_slice(files);
        self.save_files(step, info, run, &all)
    }

    /// Saves `files` as step `step` of a run of `model` by `run`: each is written and synced
    /// in a staging folder, then the manifest, then the folder is renamed to `step-<N>`.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when a file cannot be written.
    pub fn save_files(
        &mut self,
        step: usize,
        model: ModelInfo,
        run: RunInfo,
        files: &[(&str, &[u8])],
    ) -> Result<PathBuf, CheckpointError> {
        let root = &self.root;
        fs::create_dir_all(root).map_err(|e| CheckpointError::io("create", root, e))?;
        let name = step_name(step);
        let staging = root.join(format!(".{name}.partial-{}", std::process::id()));
        if staging.exists() {
            fs::remove_dir_all(&staging).map_err(|e| CheckpointError::io("remove", &staging, e))?;
        }
        fs::create_dir(&staging).map_err(|e| CheckpointError::io("create", &staging, e))?;
        let mut digests = BTreeMap::new();
        for (file, bytes) in files {
            write_synced(&staging.join(file), bytes)?;
            digests.insert((*file).to_string(), FileDigest::of(bytes));
        }
        let manifest = Manifest {
            format: FORMAT,
            kiln_version: env!("CARGO_PKG_VERSION").to_string(),
            step,
            model,
            run,
            files: digests,
            inputs: self.inputs.clone(),
            eval_loss: self
                .eval
                .filter(|&(at, _)| at == step)
                .map(|(_, loss)| loss),
        };
        let text = toml::to_string_pretty(&manifest)
            .map_err(|e| CheckpointError::io("encode", &staging.join(MANIFEST), e))?;
        write_synced(&staging.join(MANIFEST), text.as_bytes())?;
        let digest = format!("{}  {MANIFEST}\n", sha256_hex(text.as_bytes()));
        write_synced(&staging.join(MANIFEST_DIGEST), digest.as_bytes())?;
        sync_folder(&staging)?;
        let target = root.join(&name);
        // The same step saved again: the old copy goes aside (and comes back, should the
        // rename below never happen) and is removed only once the new one is in place.
        let aside = root.join(format!(".{name}.replaced-{}", std::process::id()));
        let replaced = target.exists();
        if replaced {
            fs::rename(&target, &aside).map_err(|e| CheckpointError::io("rename", &target, e))?;
        }
        fs::rename(&staging, &target).map_err(|e| CheckpointError::io("rename", &staging, e))?;
        sync_folder(root)?;
        if replaced {
            fs::remove_dir_all(&aside).map_err(|e| CheckpointError::io("remove", &aside, e))?;
        }
        if let Some(from) = self.discard_after.take() {
            let mut removed = 0;
            for (old, dir) in self.steps()? {
                if old > from && old != step {
                    remove_step(root, &dir)?;
                    removed += 1;
                }
            }
            tracing::warn!(
                "--overwrite: removed the {removed} checkpoint(s) after step {from} that {} held",
                root.display()
            );
        }
        self.prune()?;
        Ok(target)
    }

    /// Removes all but the newest `keep` steps and the step of the lowest eval loss.
    fn prune(&self) -> Result<(), CheckpointError> {
        let steps = self.steps()?;
        let old = steps.len().saturating_sub(self.keep);
        let best = self.best()?.map(|(step, _)| step);
        for (step, dir) in &steps[..old] {
            if Some(*step) != best {
                remove_step(&self.root, dir)?;
            }
        }
        Ok(())
    }

    /// The saved step of the lowest eval loss, and the loss (the earliest of equal ones);
    /// `None` when no step recorded one. A step whose manifest is damaged counts as one
    /// without: a resume from it is refused on its own.
    ///
    /// # Errors
    /// When the folder cannot be read.
    pub fn best(&self) -> Result<Option<(usize, f64)>, CheckpointError> {
        let mut best: Option<(usize, f64)> = None;
        for (step, dir) in self.steps()? {
            let Ok(manifest) = Manifest::read(&dir.join(super::MANIFEST)) else {
                continue;
            };
            if let Some(loss) = manifest.eval_loss
                && best.is_none_or(|(_, lowest)| loss < lowest)
            {
                best = Some((step, loss));
            }
        }
        Ok(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_run_at_a_time_saves_into_a_folder() {
        let dir = std::env::temp_dir().join(format!("kiln-lock-{}", std::process::id()));
        let mut first = CheckpointFolder::new(&dir, 2);
        first.prepare(0, false).unwrap();
        let mut second = CheckpointFolder::new(&dir, 2);
        let err = second.prepare(0, false).unwrap_err();
        assert!(matches!(err, CheckpointError::Locked { .. }), "{err}");
        drop(first);
        second.prepare(0, false).unwrap();
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A folder with step 3 saved, recording `inputs`.
    fn saved(name: &str, inputs: &[(&str, &[u8])]) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("kiln-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let inputs = inputs
            .iter()
            .map(|(n, b)| (n.to_string(), FileDigest::of(b)))
            .collect();
        let mut folder = CheckpointFolder::new(&dir, 2).with_inputs(inputs);
        folder.prepare(0, false).unwrap();
        let model = ModelInfo {
            kind: "test".into(),
            tensors: 1,
            parameters: 1,
            signature: "x".into(),
        };
        let run = RunInfo {
            strategy: "single".into(),
            mesh: "1".into(),
            layout: "replica".into(),
            optimizer: "adamw".into(),
            precision: "f32".into(),
        };
        let step = folder
            .save_files(3, model, run, &[("model.mpk", b"weights")])
            .unwrap();
        (dir, step)
    }

    #[test]
    fn an_edited_manifest_is_refused() {
        let (dir, step) = saved("edited-manifest", &[]);
        super::super::Checkpoint::open(&step).unwrap();
        let manifest = step.join(MANIFEST);
        let text = fs::read_to_string(&manifest).unwrap();
        fs::write(&manifest, text.replace("step = 3", "step = 300")).unwrap();
        let err = super::super::Checkpoint::open(&step).unwrap_err();
        assert!(matches!(err, CheckpointError::Digest { .. }), "{err}");
        // Edited with its digest recomputed, the step still disagrees with the folder's.
        let edited = fs::read_to_string(&manifest).unwrap();
        let digest = format!("{}  {MANIFEST}\n", sha256_hex(edited.as_bytes()));
        fs::write(step.join(MANIFEST_DIGEST), digest).unwrap();
        let err = super::super::Checkpoint::open(&step)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("says step 300, but its folder is step 3"),
            "{err}"
        );
        fs::remove_file(step.join(MANIFEST_DIGEST)).unwrap();
        let err = super::super::Checkpoint::open(&step).unwrap_err();
        assert!(matches!(err, CheckpointError::Missing { .. }), "{err}");
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_resume_on_changed_inputs_is_refused_naming_the_input() {
        let (dir, step) = saved(
            "inputs",
            &[("data", b"lines"), ("model/config.json", b"{}")],
        );
        let checkpoint = super::super::Checkpoint::open(&step).unwrap();
        let same: BTreeMap<String, FileDigest> =
            [("data", b"lines" as &[u8]), ("model/config.json", b"{}")]
                .into_iter()
                .map(|(n, b)| (n.to_string(), FileDigest::of(b)))
                .collect();
        checkpoint.check_inputs(&same).unwrap();
        let mut changed = same.clone();
        changed.insert("data".into(), FileDigest::of(b"other lines"));
        let err = checkpoint.check_inputs(&changed).unwrap_err().to_string();
        assert!(err.contains("trained on another data (5 bytes"), "{err}");
        let mut missing = same;
        missing.remove("model/config.json");
        let err = checkpoint.check_inputs(&missing).unwrap_err().to_string();
        assert!(
            err.contains("model/config.json") && err.contains("now absent"),
            "{err}"
        );
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_step_of_the_lowest_eval_loss_outlives_keep() {
        let dir = std::env::temp_dir().join(format!("kiln-best-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut folder = CheckpointFolder::new(&dir, 1);
        folder.prepare(0, false).unwrap();
        let info = || ModelInfo {
            kind: "test".into(),
            tensors: 1,
            parameters: 1,
            signature: "x".into(),
        };
        let run = || RunInfo {
            strategy: "single".into(),
            mesh: "1".into(),
            layout: "replica".into(),
            optimizer: "adamw".into(),
            precision: "f32".into(),
        };
        // Eval losses 3.0, 1.0 (the best), 2.0, then a step saved without an eval.
        for (step, loss) in [
            (10, Some(3.0)),
            (20, Some(1.0)),
            (30, Some(2.0)),
            (40, None),
        ] {
            if let Some(loss) = loss {
                folder.record_eval(step, loss);
            }
            folder
                .save_files(step, info(), run(), &[("model.mpk", b"weights")])
                .unwrap();
        }
        let steps: Vec<usize> = folder.steps().unwrap().iter().map(|s| s.0).collect();
        assert_eq!(steps, [20, 40], "keep 1 keeps the newest and the best");
        assert_eq!(folder.best().unwrap(), Some((20, 1.0)));
        let best = super::super::Checkpoint::open(&dir.join(step_name(20))).unwrap();
        assert_eq!(best.manifest().eval_loss, Some(1.0));
        // A better loss later takes the best's place, and the old best goes.
        folder.record_eval(50, 0.5);
        folder
            .save_files(50, info(), run(), &[("model.mpk", b"weights")])
            .unwrap();
        let steps: Vec<usize> = folder.steps().unwrap().iter().map(|s| s.0).collect();
        assert_eq!(steps, [50]);
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn step_names_sort_as_steps_and_parse_back() {
        assert_eq!(step_name(42), "step-00000042");
        assert_eq!(parse_step(&step_name(123_456_789)), Some(123_456_789));
        assert_eq!(parse_step("step-"), None);
        assert_eq!(parse_step("step-1a"), None);
        assert_eq!(parse_step(".step-00000001.partial-3"), None);
    }
}
