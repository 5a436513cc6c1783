//! [`WorldError`]: a world that cannot be built, from its devices, its launcher's variables or
//! its mesh.

use super::mesh::MeshError;
use super::process::Launcher;

/// Error building a [`World`](super::World).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorldError {
    /// No local device was given.
    #[error("a world needs at least one local device; pass one device per rank of this process")]
    NoDevices,
    /// A launcher variable could not be parsed as a number.
    #[error("launcher variable {name}={value:?} is not a non-negative integer")]
    NotANumber {
        /// The environment variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// The launcher set a rank variable but not its companion.
    #[error("launcher variable {present} is set but {missing} is not; set both or neither")]
    Incomplete {
        /// The variable that was set.
        present: &'static str,
        /// The variable that was missing.
        missing: &'static str,
    },
    /// A rank or count that does not fit with the others.
    #[error(
        "inconsistent world: process rank {rank} of {processes} processes, local rank \
         {local_rank} of {local_processes} on node {node_rank} of {nodes} (from {launcher}); \
         every rank must be below its count and every count at least 1"
    )]
    Inconsistent {
        /// Process rank.
        rank: usize,
        /// Number of processes.
        processes: usize,
        /// Process rank on this node.
        local_rank: usize,
        /// Processes on this node.
        local_processes: usize,
        /// This node's index.
        node_rank: usize,
        /// Number of nodes.
        nodes: usize,
        /// Where the numbers came from.
        launcher: Launcher,
    },
    /// A mesh that does not fit the world.
    #[error(transparent)]
    Mesh(#[from] MeshError),
}
