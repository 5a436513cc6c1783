//! Checkpoints that lose nothing: atomic, verified, periodic.
//!
//! A run saves into a **checkpoint folder** (`--save DIR`), which holds one complete
//! checkpoint per saved step, `step-<N>/`, and nothing else the run reads:
//!
//! ```text
//! DIR/step-00000100/manifest.toml    what wrote it, and every file's size and SHA-256
//! DIR/step-00000100/model.mpk        the parameters (Burn's named MessagePack, full precision)
//! DIR/step-00000100/optimizer*.mpk   the strategy's optimizer state
//! DIR/step-00000100/...              files of the job (the AD job's config.toml)
//! ```
//!
//! - **Atomic.** [`CheckpointFolder::save`] writes a step into a hidden staging folder beside
//!   the others, syncs every file and the folder, and only then renames it to `step-<N>`. A
//!   crash at any moment leaves every earlier step whole; a half-written one is never named
//!   `step-<N>` and is swept away by the next run.
//! - **Verified.** [`Checkpoint::open`] reads a step (or the newest step of a folder), checks
//!   every file the manifest lists against its size and digest, and refuses a corrupted,
//!   truncated, missing or foreign checkpoint in one line that names the file.
//! - **Bounded.** A folder keeps the newest [`CheckpointConfig::keep`] steps; older ones are
//!   removed after a newer one is in place.
//!
//! Nothing here knows a strategy: [`crate::fit`] calls back every
//! [`CheckpointConfig::every`] steps, and the program saves what it wants with
//! [`CheckpointFolder::save`].

mod compare;
mod config;
mod error;
mod folder;
mod manifest;
mod open;
mod saver;

pub use compare::config_differences;
pub use config::CheckpointConfig;
pub use error::CheckpointError;
pub use folder::CheckpointFolder;
pub use manifest::{FileDigest, Manifest, ModelInfo, RunInfo};
pub use open::Checkpoint;
pub use saver::Saver;

/// The file every checkpoint step holds, written last.
pub const MANIFEST: &str = "manifest.toml";
/// The manifest's own SHA-256, as `sha256sum` writes it: the manifest names the step and
/// digests every other file, so a hand-edited or damaged manifest must not be trusted.
pub const MANIFEST_DIGEST: &str = "manifest.toml.sha256";
/// The parameters' file of every checkpoint step.
pub const MODEL: &str = "model.mpk";
