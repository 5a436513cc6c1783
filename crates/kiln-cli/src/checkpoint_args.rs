//! The checkpoint flags of `kiln train` and `kiln ad train` (`--save-every`, `--keep`,
//! `--resume`, `--overwrite`), and the checks they get before the first step.

use std::path::{Path, PathBuf};

use kiln_core::checkpoint::{Checkpoint, CheckpointConfig, CheckpointError, CheckpointFolder};
use kiln_core::plan::Plan;

/// `--save-every`, `--keep`, `--resume`, `--overwrite`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct CheckpointArgs {
    /// Also save a checkpoint every N optimizer steps (a run always saves at its end, and on
    /// SIGINT / SIGTERM after the current step) [default: only then].
    #[arg(long, value_name = "N")]
    save_every: Option<usize>,
    /// Checkpoints kept in the folder, the newest; older ones are removed once a newer one is
    /// complete [default: 2].
    #[arg(long, value_name = "K")]
    keep: Option<usize>,
    /// Resume from a checkpoint: a folder a run saved into (its newest step) or one of its
    /// `step-<N>` folders. Training continues from its step up to --steps, bit for bit as if
    /// it had not stopped; the model, strategy and config must be those that saved it.
    #[arg(long, value_name = "PATH")]
    pub resume: Option<PathBuf>,
    /// Remove the checkpoints in the save folder that this run does not continue (a folder
    /// holding them is refused otherwise).
    #[arg(long)]
    pub overwrite: bool,
}

impl CheckpointArgs {
    /// Writes `--save-every` and `--keep` into `config`.
    pub fn apply(&self, config: &mut CheckpointConfig) {
        if let Some(every) = self.save_every {
            config.every = Some(every);
        }
        if let Some(keep) = self.keep {
            config.keep = keep;
        }
    }
}

/// A run's checkpoints, checked and ready before its first step.
#[derive(Debug, Default)]
pub struct RunCheckpoints {
    /// The verified checkpoint the run resumes from.
    pub resume: Option<Checkpoint>,
    /// The folder the run saves into, prepared.
    pub save: Option<CheckpointFolder>,
    /// Save every this many steps.
    pub every: Option<usize>,
}

impl RunCheckpoints {
    /// Checks `resume` (`args`' `--resume`, opened and verified by the job before anything
    /// slow: [`Checkpoint::open`]) to be a checkpoint of `plan`'s strategy with steps left
    /// before `steps` (without a `plan`, one whose layout the run checks once it has planned),
    /// and readies the folder `save` (named
    /// by its flag) for the steps after it when this process `writes` the run (the first of a
    /// run's processes; the others keep the same save schedule and write nothing).
    ///
    /// # Errors
    /// A damaged, foreign or finished checkpoint, periodic saves without a folder, or a save
    /// folder that cannot be written or holds another run's later steps.
    pub fn prepare(
        args: &CheckpointArgs,
        resume: Option<Checkpoint>,
        save: Option<(&'static str, &Path)>,
        config: &CheckpointConfig,
        plan: Option<&Plan>,
        steps: usize,
        writes: bool,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let overwrite = args.overwrite;
        config.validate()?;
        let from = match &resume {
            Some(checkpoint) => {
                if let Some(plan) = plan {
                    checkpoint.check_plan(plan)?;
                }
                if steps <= checkpoint.step() {
                    return Err(CheckpointError::NothingToTrain {
                        path: checkpoint.dir().display().to_string(),
                        step: checkpoint.step(),
                        steps,
                    }
                    .into());
                }
                checkpoint.step()
            }
            None => 0,
        };
        let save = match save {
            // Another process of the run writes it.
            Some(_) if !writes => None,
            Some((flag, dir)) => {
                // The checkpoint folder's own lock claims it (below); this checks it only.
                drop(crate::outputs::check_folder(flag, dir)?);
                let mut folder = CheckpointFolder::new(dir, config.keep);
                folder.prepare(from, overwrite)?;
                Some(folder)
            }
            None if config.every.is_some() => {
                return Err(CheckpointError::NoFolder("--save-every", "--save DIR").into());
            }
            None if overwrite => {
                return Err(CheckpointError::NoFolder("--overwrite", "--save DIR").into());
            }
            None if args.keep.is_some() => {
                return Err(CheckpointError::NoFolder("--keep", "--save DIR").into());
            }
            None => None,
        };
        Ok(Self {
            resume,
            save,
            every: config.every,
        })
    }
}
