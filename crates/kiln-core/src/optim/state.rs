//! The optimizer state of a strategy, out of its rank threads and back: what a checkpoint needs
//! so that training resumed after `k` steps continues exactly as if it had never stopped.

use std::path::Path;

use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;

/// How a strategy's optimizer state is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateLayout {
    /// One state for the whole model: every replica's optimizer holds the same (Single,
    /// DataParallel, Ddp). States of this layout move freely between those strategies.
    Replica,
    /// One state per pipeline stage, in stage order; it loads into a pipeline of as many
    /// stages only.
    Stages(usize),
    /// One state per tensor-parallel shard of each pipeline stage (`stages` = 1 without a
    /// pipeline), stage-major: it loads into the same `stages × shards` only.
    Sharded {
        /// Pipeline stages.
        stages: usize,
        /// Tensor-parallel shards.
        shards: usize,
    },
}

impl StateLayout {
    /// A short machine-readable name: `replica`, `stages:<n>`, `sharded:<stages>x<shards>`.
    pub fn key(&self) -> String {
        match self {
            StateLayout::Replica => "replica".to_string(),
            StateLayout::Stages(n) => format!("stages:{n}"),
            StateLayout::Sharded { stages, shards } => format!("sharded:{stages}x{shards}"),
        }
    }

    /// The layout [`Self::key`] names; `None` for any other text.
    pub fn from_key(key: &str) -> Option<Self> {
        Some(match key {
            "replica" => StateLayout::Replica,
            other => match other.strip_prefix("sharded:") {
                Some(grid) => {
                    let (stages, shards) = grid.split_once('x')?;
                    StateLayout::Sharded {
                        stages: stages.parse().ok()?,
                        shards: shards.parse().ok()?,
                    }
                }
                None => StateLayout::Stages(other.strip_prefix("stages:")?.parse().ok()?),
            },
        })
    }
}

impl std::fmt::Display for StateLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateLayout::Replica => f.write_str("one state for the whole model"),
            StateLayout::Stages(n) => write!(f, "one state per stage of a {n}-stage pipeline"),
            StateLayout::Sharded { stages, shards } => write!(
                f,
                "one state per tensor-parallel shard ({shards} shards of each of {stages} \
                 stage(s))"
            ),
        }
    }
}

/// A strategy's optimizer state (Adam's moments and step counts, for instance), each part in
/// Burn's named MessagePack format at full precision, so a round trip is bit-exact.
///
/// Two states of the same optimizer need not be equal byte for byte: Burn keeps the state in
/// a hash map, whose order its encoding follows.
#[derive(Clone)]
pub struct OptimizerState {
    layout: StateLayout,
    parts: Vec<Vec<u8>>,
}

impl std::fmt::Debug for OptimizerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes: Vec<usize> = self.parts.iter().map(Vec::len).collect();
        f.debug_struct("OptimizerState")
            .field("layout", &self.layout)
            .field("bytes", &bytes)
            .finish()
    }
}

/// An optimizer state that cannot be read, written or used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateError {
    /// A file could not be read or written.
    #[error("cannot {action} {path}: {reason}")]
    Io {
        /// `read`, `write` or `remove`.
        action: &'static str,
        /// The file.
        path: String,
        /// The system's message.
        reason: String,
    },
    /// No optimizer state in the folder.
    #[error(
        "no optimizer state in {0}: expected optimizer.mpk (single, data_parallel, ddp), \
         optimizer.stage-<s>-of-<n>.mpk files (pipeline) or \
         optimizer.stage-<s>-of-<n>.shard-<t>-of-<k>.mpk files (tensor), as written by \
         OptimizerState::save"
    )]
    Missing(String),
    /// A state cut for another strategy.
    #[error(
        "the optimizer state holds {found} but this strategy needs {expected}; resume with the \
         strategy (and numbers of stages and shards) that saved it"
    )]
    Layout {
        /// What the strategy needs.
        expected: StateLayout,
        /// What the state holds.
        found: StateLayout,
    },
    /// A state with a number of parts its layout does not have (a record edited by hand, or
    /// cut short).
    #[error(
        "the optimizer state is {layout} but holds {found} part(s) instead of {expected}; \
         save it again with OptimizerState::save"
    )]
    Incomplete {
        /// The state's layout.
        layout: StateLayout,
        /// Parts the layout has.
        expected: usize,
        /// Parts the state holds.
        found: usize,
    },
    /// A folder holding the states of several layouts: which one to resume is unknown.
    #[error(
        "{dir} holds optimizer states of several layouts ({layouts}); remove the files of the \
         one you do not resume from"
    )]
    Ambiguous {
        /// The folder.
        dir: String,
        /// The layouts found, described.
        layouts: String,
    },
    /// Bytes that are not the state of this optimizer.
    #[error("the optimizer state does not decode as this optimizer's state: {0}")]
    Decode(String),
}

/// The encoding of optimizer states, and of the modules ranks hand across processes.
pub(crate) fn recorder() -> NamedMpkBytesRecorder<FullPrecisionSettings> {
    NamedMpkBytesRecorder::new()
}

/// `optim`'s state, encoded: one part of an [`OptimizerState`].
pub(crate) fn encode<B, M, O>(optim: &O) -> Result<Vec<u8>, StateError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    Recorder::<B>::record(&recorder(), optim.to_record(), ())
        .map_err(|e| StateError::Decode(e.to_string()))
}

/// `optim` with the state `bytes` (from [`encode`]) decoded onto `device`.
pub(crate) fn decode<B, M, O>(optim: &O, bytes: &[u8], device: &B::Device) -> Result<O, StateError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let record = Recorder::<B>::load(&recorder(), bytes.to_vec(), device)
        .map_err(|e| StateError::Decode(e.to_string()))?;
    Ok(optim.clone().load_record(record))
}

impl OptimizerState {
    pub(crate) fn new(layout: StateLayout, parts: Vec<Vec<u8>>) -> Self {
        Self { layout, parts }
    }

    /// How the state is cut.
    pub fn layout(&self) -> StateLayout {
        self.layout
    }

    /// The encoded parts in [`Self::file_names`]' order: one for [`StateLayout::Replica`],
    /// one per stage, or one per shard of each stage.
    ///
    /// # Errors
    /// [`StateError::Layout`] for a state of another layout than `expected`,
    /// [`StateError::Incomplete`] for one with the wrong number of parts.
    pub(crate) fn parts(&self, expected: StateLayout) -> Result<&[Vec<u8>], StateError> {
        if self.layout != expected {
            return Err(StateError::Layout {
                expected,
                found: self.layout,
            });
        }
        let parts = self.file_names().len();
        if self.parts.len() != parts {
            return Err(StateError::Incomplete {
                layout: self.layout,
                expected: parts,
                found: self.parts.len(),
            });
        }
        Ok(&self.parts)
    }

    /// Writes the state into `dir` (created if missing): `optimizer.mpk`, one
    /// `optimizer.stage-<s>-of-<n>.mpk` per stage, or one
    /// `optimizer.stage-<s>-of-<n>.shard-<t>-of-<k>.mpk` per shard of each stage. Optimizer
    /// files of another layout left in `dir` by an earlier save are removed, so the folder
    /// always reads back as this state.
    ///
    /// # Errors
    /// [`StateError::Io`] when a file cannot be written or a stale one removed.
    pub fn save(&self, dir: &Path) -> Result<(), StateError> {
        std::fs::create_dir_all(dir).map_err(|e| io("write", dir, e))?;
        let names = self.file_names();
        for name in optimizer_files(dir)? {
            if !names.contains(&name) {
                let path = dir.join(&name);
                std::fs::remove_file(&path).map_err(|e| io("remove", &path, e))?;
            }
        }
        for (name, part) in names.into_iter().zip(&self.parts) {
            let path = dir.join(name);
            std::fs::write(&path, part).map_err(|e| io("write", &path, e))?;
        }
        Ok(())
    }

    /// Reads a state written by [`Self::save`].
    ///
    /// # Errors
    /// [`StateError::Missing`] when `dir` holds none, [`StateError::Ambiguous`] when it holds
    /// states of several layouts, [`StateError::Io`] when a file cannot be read.
    pub fn load(dir: &Path) -> Result<Self, StateError> {
        let mut layouts: Vec<StateLayout> = optimizer_files(dir)?
            .iter()
            .filter_map(|name| layout_of(name))
            .collect();
        layouts.sort_by_key(|l| l.to_string());
        layouts.dedup();
        let layout = match layouts.as_slice() {
            [] => return Err(StateError::Missing(dir.display().to_string())),
            [one] => *one,
            several => {
                return Err(StateError::Ambiguous {
                    dir: dir.display().to_string(),
                    layouts: several
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                });
            }
        };
        let state = Self::new(layout, Vec::new());
        let parts = state
            .file_names()
            .into_iter()
            .map(|name| {
                let path = dir.join(name);
                std::fs::read(&path).map_err(|e| io("read", &path, e))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { parts, ..state })
    }

    /// The state as a Burn record: the layout's [key](StateLayout::key) and the parts.
    pub(crate) fn into_record(self) -> (String, Vec<Vec<u8>>) {
        (self.layout.key(), self.parts)
    }

    /// A state from [`Self::into_record`]'s record; `None` for an empty record (an optimizer
    /// that had no state yet) or an unknown layout name.
    pub(crate) fn from_record((layout, parts): (String, Vec<Vec<u8>>)) -> Option<Self> {
        Some(Self::new(StateLayout::from_key(&layout)?, parts))
    }

    /// The state as files: each part under the name [`Self::save`] gives it.
    pub fn files(&self) -> Vec<(String, &[u8])> {
        self.file_names()
            .into_iter()
            .zip(self.parts.iter().map(Vec::as_slice))
            .collect()
    }

    /// A state of `layout` from its files, read by `read(name)` for every name
    /// [`Self::files`] gives that layout.
    ///
    /// # Errors
    /// What `read` returns.
    pub fn from_files<E>(
        layout: StateLayout,
        mut read: impl FnMut(&str) -> Result<Vec<u8>, E>,
    ) -> Result<Self, E> {
        let state = Self::new(layout, Vec::new());
        let parts = state
            .file_names()
            .iter()
            .map(|name| read(name))
            .collect::<Result<_, _>>()?;
        Ok(Self { parts, ..state })
    }

    fn file_names(&self) -> Vec<String> {
        match self.layout {
            StateLayout::Replica => vec!["optimizer.mpk".to_string()],
            StateLayout::Stages(n) => (0..n).map(|s| stage_file(s, n, None)).collect(),
            StateLayout::Sharded { stages, shards } => (0..stages)
                .flat_map(|s| (0..shards).map(move |t| stage_file(s, stages, Some((t, shards)))))
                .collect(),
        }
    }
}

/// The names of the optimizer files in `dir` (none when `dir` does not exist).
fn optimizer_files(dir: &Path) -> Result<Vec<String>, StateError> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    Ok(std::fs::read_dir(dir)
        .map_err(|e| io("read", dir, e))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("optimizer.") && name.ends_with(".mpk"))
        .collect())
}

/// The layout a state's first file names: `optimizer.mpk`, `optimizer.stage-0-of-<n>.mpk` or
/// `optimizer.stage-0-of-<n>.shard-0-of-<k>.mpk`; `None` for any other file. Zero stages or
/// shards name no layout.
fn layout_of(name: &str) -> Option<StateLayout> {
    if name == "optimizer.mpk" {
        return Some(StateLayout::Replica);
    }
    let rest = name
        .strip_prefix("optimizer.stage-0-of-")?
        .strip_suffix(".mpk")?;
    let count = |n: &str| n.parse::<usize>().ok().filter(|&n| n > 0);
    match rest.split_once(".shard-0-of-") {
        Some((stages, shards)) => Some(StateLayout::Sharded {
            stages: count(stages)?,
            shards: count(shards)?,
        }),
        None => Some(StateLayout::Stages(count(rest)?)),
    }
}

fn stage_file(stage: usize, stages: usize, shard: Option<(usize, usize)>) -> String {
    match shard {
        None => format!("optimizer.stage-{stage}-of-{stages}.mpk"),
        Some((t, k)) => format!("optimizer.stage-{stage}-of-{stages}.shard-{t}-of-{k}.mpk"),
    }
}

/// The bytes of tensor data in an encoded optimizer state ([`encode`]'s output): what the
/// state occupies on its device, exactly. The encoding is MessagePack, in which every tensor's
/// data is one binary string and nothing else is.
pub(crate) fn tensor_bytes(encoded: &[u8]) -> u64 {
    let mut rest = encoded;
    let mut total = 0;
    // One value at a time: containers push their element counts.
    let mut pending: u64 = 1;
    while pending > 0 && !rest.is_empty() {
        pending -= 1;
        let (marker, tail) = (rest[0], &rest[1..]);
        let be = |n: usize, at: &[u8]| {
            at.get(..n)
                .map_or(0, |b| b.iter().fold(0u64, |v, &x| (v << 8) | u64::from(x)))
        };
        // (bytes of header after the marker, payload bytes, elements inside, is binary)
        let (header, payload, inner, binary) = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0, 0, false),
            0x80..=0x8f => (0, 0, 2 * u64::from(marker & 0x0f), false),
            0x90..=0x9f => (0, 0, u64::from(marker & 0x0f), false),
            0xa0..=0xbf => (0, u64::from(marker & 0x1f), 0, false),
            0xc4 => (1, be(1, tail), 0, true),
            0xc5 => (2, be(2, tail), 0, true),
            0xc6 => (4, be(4, tail), 0, true),
            0xc7 => (2, be(1, tail), 0, false),
            0xc8 => (3, be(2, tail), 0, false),
            0xc9 => (5, be(4, tail), 0, false),
            0xca | 0xce | 0xd2 => (4, 0, 0, false),
            0xcb | 0xcf | 0xd3 => (8, 0, 0, false),
            0xcc | 0xd0 => (1, 0, 0, false),
            0xcd | 0xd1 => (2, 0, 0, false),
            0xd4..=0xd8 => (1 + (1 << (marker - 0xd4)), 0, 0, false),
            0xd9 => (1, be(1, tail), 0, false),
            0xda => (2, be(2, tail), 0, false),
            0xdb => (4, be(4, tail), 0, false),
            0xdc => (2, 0, be(2, tail), false),
            0xdd => (4, 0, be(4, tail), false),
            0xde => (2, 0, 2 * be(2, tail), false),
            0xdf => (4, 0, 2 * be(4, tail), false),
            0xc1 => (0, 0, 0, false),
        };
        if binary {
            total += payload;
        }
        pending += inner;
        let skip = (header + payload as usize).min(tail.len());
        rest = &tail[skip..];
    }
    total
}

fn io(action: &'static str, path: &Path, error: std::io::Error) -> StateError {
    StateError::Io {
        action,
        path: path.display().to_string(),
        reason: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(layout: StateLayout, parts: usize) -> OptimizerState {
        OptimizerState::new(layout, (0..parts).map(|i| vec![i as u8; 3]).collect())
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_sharded_state_round_trips_through_a_folder() {
        let dir = temp_dir("round-trip");
        let saved = state(
            StateLayout::Sharded {
                stages: 2,
                shards: 2,
            },
            4,
        );
        saved.save(&dir).unwrap();
        let loaded = OptimizerState::load(&dir).unwrap();
        assert_eq!(loaded.layout(), saved.layout());
        assert_eq!(loaded.parts, saved.parts);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn saving_another_layout_removes_the_stale_files() {
        let dir = temp_dir("stale");
        state(StateLayout::Stages(3), 3).save(&dir).unwrap();
        let saved = state(
            StateLayout::Sharded {
                stages: 1,
                shards: 2,
            },
            2,
        );
        saved.save(&dir).unwrap();
        let loaded = OptimizerState::load(&dir).unwrap();
        assert_eq!(loaded.layout(), saved.layout());
        assert_eq!(optimizer_files(&dir).unwrap().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_folder_with_two_layouts_is_refused() {
        let dir = temp_dir("ambiguous");
        state(StateLayout::Replica, 1).save(&dir).unwrap();
        std::fs::write(dir.join("optimizer.stage-0-of-2.mpk"), [0u8]).unwrap();
        std::fs::write(dir.join("optimizer.stage-1-of-2.mpk"), [0u8]).unwrap();
        let err = OptimizerState::load(&dir).unwrap_err();
        assert!(matches!(err, StateError::Ambiguous { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn zero_stages_or_shards_name_no_layout() {
        assert_eq!(layout_of("optimizer.stage-0-of-0.mpk"), None);
        assert_eq!(layout_of("optimizer.stage-0-of-1.shard-0-of-0.mpk"), None);
        assert_eq!(
            layout_of("optimizer.stage-0-of-1.shard-0-of-4.mpk"),
            Some(StateLayout::Sharded {
                stages: 1,
                shards: 4
            })
        );
    }

    #[test]
    fn a_state_missing_parts_is_an_error_not_a_panic() {
        let layout = StateLayout::Sharded {
            stages: 2,
            shards: 2,
        };
        let err = state(layout, 3).parts(layout).unwrap_err();
        assert_eq!(
            err,
            StateError::Incomplete {
                layout,
                expected: 4,
                found: 3
            }
        );
    }
}
