//! Connecting a world's ranks: in-process groups when the world is one process, MPI groups
//! across processes (the `mpi` feature), as [`MeshCollectives::for_world`] chooses.

use std::time::Duration;

use burn::tensor::backend::Backend;

use super::Collective;
use super::mesh::{MeshCollectives, in_process_axis};
use crate::world::World;

/// Why the ranks of a world could not be connected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// A world of several processes in a build without MPI.
    #[error(
        "the world spans {processes} processes, but this build of Kiln has no MPI; build it \
         with the `mpi` feature (cargo build --features mpi) to train across processes"
    )]
    NoMpi {
        /// Processes in the world.
        processes: usize,
    },
    /// MPI could not connect the processes.
    #[cfg(feature = "mpi")]
    #[error(transparent)]
    Mpi(#[from] super::mpi::MpiError),
}

impl<B: Backend> MeshCollectives<B> {
    /// The groups of this process's ranks of `world` (arranged as its mesh), element `i` for
    /// local rank `i`: in-process groups when the world is this process, MPI groups across
    /// processes otherwise (every process must then call this at the same point). Calls time
    /// out after `timeout`.
    ///
    /// # Errors
    /// [`ConnectError`] when the world spans processes and they cannot be connected.
    pub fn for_world<D: Clone>(
        world: &World<D>,
        timeout: Duration,
    ) -> Result<Vec<Self>, ConnectError> {
        if !world.multi_process_enabled() {
            return Ok(Self::in_process(world.mesh(), timeout));
        }
        #[cfg(feature = "mpi")]
        {
            Ok(super::mpi::mesh_collectives(world, timeout)?)
        }
        #[cfg(not(feature = "mpi"))]
        {
            Err(ConnectError::NoMpi {
                processes: world.process().processes,
            })
        }
    }

    /// The groups along `axis` alone of this process's ranks of `world`, element `i` for local
    /// rank `i`, connected as [`Self::for_world`] connects them: for a group on another
    /// backend than the rest of the mesh's (the tensor-parallel layers' wire).
    ///
    /// # Errors
    /// [`ConnectError`] when the world spans processes and they cannot be connected.
    ///
    /// # Panics
    /// When the world's mesh has no `axis`: the caller built that mesh.
    pub fn axis_for_world<D: Clone>(
        world: &World<D>,
        axis: &str,
        timeout: Duration,
    ) -> Result<Vec<Box<dyn Collective<B>>>, ConnectError> {
        if !world.multi_process_enabled() {
            return Ok(in_process_axis(world.mesh(), axis, timeout));
        }
        #[cfg(feature = "mpi")]
        {
            Ok(super::mpi::axis_collectives(world, axis, timeout)?)
        }
        #[cfg(not(feature = "mpi"))]
        {
            Err(ConnectError::NoMpi {
                processes: world.process().processes,
            })
        }
    }
}
