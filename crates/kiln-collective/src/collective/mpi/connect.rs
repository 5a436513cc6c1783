//! Connecting this process's ranks to the world's other processes: the start-up check that
//! every process sees the same world, then one hierarchical group per group of the mesh.

use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use burn::tensor::backend::Backend;

use super::group::ProcessGroup;
use super::runtime::{self, Failure, Runtime, State, runtime};
use super::{LEADER_GRACE, Mpi, MpiError};
use crate::collective::{Collective, CollectiveCounters, InProcess, MeshCollectives};
use crate::world::{ProcessInfo, World};

/// This process's ranks' groups on `world`'s mesh, connected through MPI to the other
/// processes; calls time out after `timeout`. Every process of the world must call this at the
/// same point. Element `i` belongs to local rank `i`.
///
/// # Errors
/// [`MpiError`] when MPI cannot start or its world is not the launcher's.
pub fn mesh_collectives<B: Backend, D: Clone>(
    world: &World<D>,
    timeout: Duration,
) -> Result<Vec<MeshCollectives<B>>, MpiError> {
    let mut groups = Groups::connect(world, timeout)?;
    let mesh = world.mesh();
    let mut ranks: Vec<MeshCollectives<B>> = groups
        .local(vec![(0..mesh.size()).collect()])
        .into_iter()
        .enumerate()
        .map(|(i, handle)| MeshCollectives::from_groups(groups.first + i, handle))
        .collect();
    for axis in mesh.axes() {
        let members = mesh.groups(&axis.name).expect("the mesh's own axis");
        for (rank, handle) in ranks.iter_mut().zip(groups.local(members)) {
            rank.push_axis(&axis.name, handle);
        }
    }
    Ok(ranks)
}

/// This process's ranks' groups along `axis` of `world`'s mesh alone (no world group, no
/// other axis), as [`mesh_collectives`] connects them: for a group of another backend than the
/// strategy's, such as the tensor-parallel layers' wire.
///
/// # Errors
/// [`MpiError`] when MPI cannot start or its world is not the launcher's.
///
/// # Panics
/// When the world's mesh has no `axis`: the caller built that mesh.
pub fn axis_collectives<B: Backend, D: Clone>(
    world: &World<D>,
    axis: &str,
    timeout: Duration,
) -> Result<Vec<Box<dyn Collective<B>>>, MpiError> {
    let members = world
        .mesh()
        .groups(axis)
        .expect("the caller's mesh has the axis");
    Ok(Groups::connect(world, timeout)?.local(members))
}

/// Checks that every process sees the world alike (ranks, ranks per process, mesh) before the
/// groups are cut from it: processes that disagree would otherwise cut different groups and
/// wait for each other forever.
fn check_layout<D: Clone>(
    runtime: &'static Runtime,
    world: &World<D>,
    timeout: Duration,
) -> Result<(), MpiError> {
    use sha2::{Digest, Sha256};
    let layout = format!(
        "{} ranks, {} per process, mesh {}",
        world.world_size(),
        world.local_ranks(),
        world.mesh()
    );
    let digest = Sha256::digest(layout.as_bytes())[..8].to_vec();
    let other =
        first_other(runtime, world.process().processes, &digest, timeout).map_err(|failure| {
            match failure {
                Failure::Aborted { rank, reason } => {
                    MpiError::Layout(format!("rank {rank} failed before the start: {reason}"))
                }
                Failure::Timeout { missing } => MpiError::Layout(format!(
                    "process(es) {missing:?} did not start within {timeout:?}"
                )),
            }
        })?;
    match other {
        Some(other) => Err(MpiError::Layout(format!(
            "process {other} sees another world than this one ({layout}); start every process \
             with the same --world, --devices and strategy flags"
        ))),
        None => Ok(()),
    }
}

/// MPI, started once per process, checked to be the world the launcher told `process` of.
///
/// # Errors
/// [`MpiError::Init`] when MPI cannot start, [`MpiError::NotTheLaunchersWorld`] when its
/// world is another.
pub(super) fn launched_runtime(process: &ProcessInfo) -> Result<&'static Runtime, MpiError> {
    let runtime = runtime().map_err(MpiError::Init)?;
    let state = runtime.lock();
    if (state.process, state.processes) != (process.rank, process.processes) {
        return Err(MpiError::NotTheLaunchersWorld {
            rank: process.rank,
            processes: process.processes,
            mpi_rank: state.process,
            mpi_processes: state.processes,
        });
    }
    Ok(runtime)
}

/// Every one of the world's `processes` says `bytes` (as many everywhere) in one timed call on
/// the world's communicator: the first process that said something else, if any. What each
/// process calls first, so that processes at different start-up steps (one checking its world,
/// another meeting to plan) meet in the same call and tell each other apart by its bytes.
pub(super) fn first_other(
    runtime: &'static Runtime,
    processes: usize,
    bytes: &[u8],
    timeout: Duration,
) -> Result<Option<usize>, Failure> {
    let id = runtime.lock().reserve_id();
    let comm = runtime::Comm(mpi::topology::SimpleCommunicator::world());
    let everyone = ProcessGroup::new(runtime, comm, id, (0..processes).collect(), timeout);
    let all = everyone.all_gather(bytes.to_vec(), 0)?;
    Ok(all.chunks(bytes.len()).position(|theirs| theirs != bytes))
}

/// Cuts groups of a checked world, every process in the same order.
struct Groups {
    runtime: &'static Runtime,
    /// Held while groups are cut: each cut is a collective call on the world's communicator.
    state: MutexGuard<'static, State>,
    timeout: Duration,
    /// This process, its ranks per process, and the world's rank of its first.
    process: usize,
    per_process: usize,
    first: usize,
}

impl Groups {
    /// Starts MPI (once per process) and checks the world every process sees.
    fn connect<D: Clone>(world: &World<D>, timeout: Duration) -> Result<Self, MpiError> {
        let process = world.process();
        let runtime = launched_runtime(process)?;
        check_layout(runtime, world, timeout)?;
        Ok(Self {
            runtime,
            state: runtime.lock(),
            timeout,
            process: process.rank,
            per_process: world.local_ranks(),
            first: world.rank_of(0),
        })
    }

    /// Every group of `groups` (the world's ranks of each), cut in order; this process's ranks'
    /// handles, by local rank. Each local rank is in exactly one of the groups.
    fn local<B: Backend>(&mut self, groups: Vec<Vec<usize>>) -> Vec<Box<dyn Collective<B>>> {
        let mut handles: Vec<Option<Box<dyn Collective<B>>>> =
            (0..self.per_process).map(|_| None).collect();
        for members in groups {
            for (rank, handle) in self.group(members) {
                handles[rank - self.first] = Some(Box::new(handle));
            }
        }
        handles
            .into_iter()
            .map(|h| h.expect("every local rank is in one group"))
            .collect()
    }

    /// Creates one group (every process, in the same order) and hands this process's members
    /// their handles, by world rank.
    fn group<B: Backend>(&mut self, members: Vec<usize>) -> Vec<(usize, Mpi<B>)> {
        let per_process = self.per_process;
        let process_of_rank = |r: usize| r / per_process;
        let mut processes: Vec<usize> = members.iter().map(|&r| process_of_rank(r)).collect();
        processes.dedup();
        let member = processes.contains(&self.process);
        let procs = if processes.len() > 1 {
            let (comm, id) = self.state.split(member);
            comm.map(|comm| {
                Arc::new(ProcessGroup::new(
                    self.runtime,
                    comm,
                    id,
                    processes.clone(),
                    self.timeout,
                ))
            })
        } else {
            None
        };
        if !member {
            return Vec::new();
        }
        let mine = self.first..self.first + per_process;
        let local: Vec<usize> = members
            .iter()
            .copied()
            .filter(|r| mine.contains(r))
            .collect();
        let first_local = members
            .iter()
            .position(|r| mine.contains(r))
            .expect("a member");
        let wait = if procs.is_some() {
            self.timeout + LEADER_GRACE
        } else {
            self.timeout
        };
        let process_of = members
            .iter()
            .map(|&r| {
                processes
                    .iter()
                    .position(|&p| p == process_of_rank(r))
                    .expect("listed")
            })
            .collect::<Vec<_>>();
        InProcess::subgroup(local.clone(), wait)
            .into_iter()
            .zip(local)
            .map(|(handle, global)| {
                let rank = members.iter().position(|&r| r == global).expect("a member");
                let mpi = Mpi {
                    rank,
                    size: members.len(),
                    members: members.clone(),
                    process_of: process_of.clone(),
                    first_local,
                    local: handle,
                    procs: procs.clone(),
                    seq: 0,
                    counters: CollectiveCounters::default(),
                };
                (global, mpi)
            })
            .collect()
    }
}
