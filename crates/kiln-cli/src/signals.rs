//! SIGINT and SIGTERM: the first asks the run to stop after its current step (and save, when
//! it saves); a second exits at once, as a user pressing Ctrl-C twice expects. SIGUSR1 is the
//! same request from a launcher: `kiln launch` passes a user's first Ctrl-C on to the
//! processes as SIGUSR1, which `mpirun` forwards without ending the job (it ends the job on
//! SIGINT and SIGTERM, before the first process could save). SIGUSR1 never exits at once: the
//! launcher's request may arrive twice (under load a process of a `kiln launch` job got it
//! twice and died with 138 before its step ended), and the launcher passes a user's second
//! Ctrl-C on as SIGINT or SIGTERM itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};

/// The stop request of a run, set by SIGINT or SIGTERM.
#[derive(Debug, Clone)]
pub struct Signals {
    stopping: Arc<AtomicBool>,
    signal: Arc<AtomicUsize>,
}

/// A run stopped by a signal, after its step `step` (and what it saved, when it saves).
#[derive(Debug, thiserror::Error)]
#[error(
    "stopped by {} after step {step} of {steps}: {}",
    signal_name(*signal),
    saved.as_ref().map_or_else(
        || "nothing saved (no checkpoint folder was given)".to_string(),
        Saved::to_string,
    )
)]
pub struct Interrupted {
    /// The signal's number.
    pub signal: i32,
    /// The last step trained.
    pub step: usize,
    /// The run's last step.
    pub steps: usize,
    /// What the run saved before it stopped.
    pub saved: Option<Saved>,
}

/// What a stopped run saved.
#[derive(Debug)]
pub enum Saved {
    /// A checkpoint step folder, and the folder to resume from.
    Checkpoint(std::path::PathBuf, std::path::PathBuf),
    /// Fine-tuned adapters of the last step.
    Adapters(std::path::PathBuf),
    /// The fully fine-tuned model of the last step.
    Model(std::path::PathBuf),
    /// Another process of the run: the first one saves what the run saves.
    ByFirstProcess,
}

impl std::fmt::Display for Saved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Saved::Checkpoint(dir, root) => write!(
                f,
                "saved {}; resume with --resume {}",
                dir.display(),
                root.display()
            ),
            Saved::Adapters(dir) => {
                write!(f, "that step's adapters are saved in {}", dir.display())
            }
            Saved::Model(dir) => write!(f, "that step's model is saved in {}", dir.display()),
            Saved::ByFirstProcess => f.write_str("what the run saves, its first process saves"),
        }
    }
}

impl Interrupted {
    /// The exit status of a process ended by the signal: 128 + its number (130, 143).
    pub fn exit_code(&self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(1)
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        SIGUSR1 => "the launcher (SIGUSR1)",
        _ => "a signal",
    }
}

impl Signals {
    /// Installs the handlers.
    ///
    /// # Errors
    /// When the system refuses a handler.
    pub fn install() -> std::io::Result<Self> {
        let stopping = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicUsize::new(0));
        for sig in [SIGINT, SIGTERM, SIGUSR1] {
            // Registered first, so it sees the flag as the previous signal left it: set means
            // this is the second signal.
            if sig != SIGUSR1 {
                let code = 128 + sig;
                signal_hook::flag::register_conditional_shutdown(sig, code, stopping.clone())?;
            }
            signal_hook::flag::register(sig, stopping.clone())?;
            signal_hook::flag::register_usize(sig, signal.clone(), sig as usize)?;
        }
        Ok(Self { stopping, signal })
    }

    /// Whether a signal asked the run to stop.
    pub fn stop_requested(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// The signal that asked, if one did.
    pub fn signal(&self) -> Option<i32> {
        match self.signal.load(Ordering::Relaxed) {
            0 => None,
            sig => i32::try_from(sig).ok(),
        }
    }
}
