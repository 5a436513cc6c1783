//! Writing what a run produces (adapters, merged models, reports, plots) the way checkpoints
//! are written: into a temporary sibling, synced, renamed into place, under a lock per output.
//!
//! A crash, a full disk or a second run then never leaves a half-written or mixed result, and
//! never destroys the previous one:
//! - [`OutputLock`] claims an output for one run, from its first checks to its last write; a
//!   second run given the same output is refused at once, before it trains.
//! - [`Staging`] builds a whole folder beside the target and swaps it in with one rename, so a
//!   reader sees the old folder or the new one, never a config of one run beside weights of
//!   another. What the old folder held besides Kiln's files is carried over.
//! - [`write_file`] replaces one file the same way.
//!
//! Nothing is written through a link: files are created new in a fresh folder and renamed,
//! so a link inside an output folder is replaced, never followed out of it.

mod durable;
mod error;
mod lock;
mod staging;

pub use durable::{folder_of, sync_folder, write_file, write_synced};
pub use error::OutputError;
pub use lock::OutputLock;
pub use staging::Staging;
