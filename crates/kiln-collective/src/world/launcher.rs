//! Reading a process's place in the run from the launcher that started it.
//!
//! Supported launchers, tried in this order because a more specific launcher may run inside a
//! more general one (`mpirun` inside a SLURM allocation sets both):
//! torchrun-style variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//! `GROUP_RANK`), Open MPI (`OMPI_COMM_WORLD_*`), SLURM (`SLURM_PROCID`, `SLURM_NTASKS`,
//! `SLURM_LOCALID`, `SLURM_NODEID`, `SLURM_NNODES`, `SLURM_NTASKS_PER_NODE`).

use super::WorldError;
use super::process::{Launcher, ProcessInfo};

/// Reads one environment variable; a function so tests can supply their own environment.
pub type EnvLookup<'a> = dyn Fn(&str) -> Option<String> + 'a;

pub(super) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl ProcessInfo {
    /// Checks that every rank is below its count and every count is at least 1.
    ///
    /// # Errors
    /// [`WorldError::Inconsistent`], carrying every factor.
    pub fn validate(&self) -> Result<(), WorldError> {
        let ok = self.processes >= 1
            && self.rank < self.processes
            && self.local_processes >= 1
            && self.local_rank < self.local_processes
            && self.local_processes <= self.processes
            && self.nodes >= 1
            && self.node_rank < self.nodes;
        if ok {
            Ok(())
        } else {
            Err(WorldError::Inconsistent {
                rank: self.rank,
                processes: self.processes,
                local_rank: self.local_rank,
                local_processes: self.local_processes,
                node_rank: self.node_rank,
                nodes: self.nodes,
                launcher: self.launcher,
            })
        }
    }

    /// This process's place as the launcher that started it says (its environment).
    ///
    /// # Errors
    /// As [`Self::from_env`].
    pub fn from_launcher() -> Result<Self, WorldError> {
        Self::from_env(&process_env)
    }

    /// Reads the launcher's variables through `env`; a single process when none are set.
    ///
    /// # Errors
    /// [`WorldError`] when a variable is not a number, a rank variable lacks its count, or the
    /// numbers are inconsistent.
    pub fn from_env(env: &EnvLookup<'_>) -> Result<Self, WorldError> {
        let info = if let Some(info) = ranked(env, &TORCHRUN)? {
            info
        } else if let Some(info) = ranked(env, &OPEN_MPI)? {
            info
        } else if let Some(info) = slurm(env)? {
            info
        } else {
            Self::single()
        };
        info.validate()?;
        Ok(info)
    }
}

fn number(env: &EnvLookup<'_>, name: &'static str) -> Result<Option<usize>, WorldError> {
    match env(name) {
        None => Ok(None),
        Some(value) => value
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| WorldError::NotANumber { name, value }),
    }
}

/// A rank variable and its count, both or neither.
fn pair(
    env: &EnvLookup<'_>,
    rank: &'static str,
    count: &'static str,
) -> Result<Option<(usize, usize)>, WorldError> {
    match (number(env, rank)?, number(env, count)?) {
        (Some(r), Some(c)) => Ok(Some((r, c))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(WorldError::Incomplete {
            present: rank,
            missing: count,
        }),
        (None, Some(_)) => Err(WorldError::Incomplete {
            present: count,
            missing: rank,
        }),
    }
}

/// Node index and count from the process counts, when the launcher does not say: nodes are
/// assumed to hold equally many processes, as torchrun and `mpirun --map-by node` do.
fn derived_nodes(rank: usize, processes: usize, local_processes: usize) -> (usize, usize) {
    let per_node = local_processes.max(1);
    (rank / per_node, processes.div_ceil(per_node))
}

/// The variable names of a launcher that states rank, size, local rank and size, and node.
struct RankVars {
    launcher: Launcher,
    rank: (&'static str, &'static str),
    local: (&'static str, &'static str),
    /// The node's index, when the launcher states it.
    node: Option<&'static str>,
}

const TORCHRUN: RankVars = RankVars {
    launcher: Launcher::Torchrun,
    rank: ("RANK", "WORLD_SIZE"),
    local: ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    node: Some("GROUP_RANK"),
};

const OPEN_MPI: RankVars = RankVars {
    launcher: Launcher::OpenMpi,
    rank: ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    local: ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    // Not `OMPI_COMM_WORLD_NODE_RANK`: despite its name it is the process's rank on its node
    // (1 for the second process of one machine), not the node's index.
    node: None,
};

fn ranked(env: &EnvLookup<'_>, vars: &RankVars) -> Result<Option<ProcessInfo>, WorldError> {
    let Some((rank, processes)) = pair(env, vars.rank.0, vars.rank.1)? else {
        return Ok(None);
    };
    let (local_rank, local_processes) =
        pair(env, vars.local.0, vars.local.1)?.unwrap_or((rank, processes));
    let (derived_node, nodes) = derived_nodes(rank, processes, local_processes);
    let node_rank = match vars.node {
        Some(name) => number(env, name)?.unwrap_or(derived_node),
        None => derived_node,
    };
    Ok(Some(ProcessInfo {
        rank,
        processes,
        local_rank,
        local_processes,
        node_rank,
        nodes,
        launcher: vars.launcher,
    }))
}

fn slurm(env: &EnvLookup<'_>) -> Result<Option<ProcessInfo>, WorldError> {
    let Some((rank, processes)) = pair(env, "SLURM_PROCID", "SLURM_NTASKS")? else {
        return Ok(None);
    };
    let local_rank = number(env, "SLURM_LOCALID")?.unwrap_or(0);
    let nodes = number(env, "SLURM_NNODES")?.unwrap_or(1);
    let node_rank = number(env, "SLURM_NODEID")?.unwrap_or(0);
    // SLURM_NTASKS_PER_NODE may read "4" or "4(x2)"; only its leading count matters here.
    let local_processes = match env("SLURM_NTASKS_PER_NODE") {
        Some(value) => {
            let head: String = value.chars().take_while(char::is_ascii_digit).collect();
            head.parse().map_err(|_| WorldError::NotANumber {
                name: "SLURM_NTASKS_PER_NODE",
                value,
            })?
        }
        None => processes.div_ceil(nodes.max(1)),
    };
    Ok(Some(ProcessInfo {
        rank,
        processes,
        local_rank,
        local_processes,
        node_rank,
        nodes,
        launcher: Launcher::Slurm,
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<ProcessInfo, WorldError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ProcessInfo::from_env(&move |name: &str| map.get(name).cloned())
    }

    #[test]
    fn no_launcher_is_one_process() {
        assert_eq!(read(&[]).unwrap(), ProcessInfo::single());
    }

    #[test]
    fn torchrun_two_nodes() {
        let info = read(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
        ])
        .unwrap();
        assert_eq!((info.rank, info.processes), (5, 8));
        assert_eq!((info.local_rank, info.local_processes), (1, 4));
        assert_eq!((info.node_rank, info.nodes), (1, 2));
        assert_eq!(info.launcher, Launcher::Torchrun);
    }

    #[test]
    fn open_mpi_wins_over_slurm() {
        let info = read(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ])
        .unwrap();
        assert_eq!(info.launcher, Launcher::OpenMpi);
        assert_eq!((info.rank, info.processes), (1, 2));
    }

    #[test]
    fn open_mpi_node_rank_is_not_the_node() {
        // What `mpirun -n 4` on two machines of two slots sets for the fourth process: its
        // NODE_RANK is its rank on the machine.
        let info = read(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_COMM_WORLD_NODE_RANK", "1"),
        ])
        .unwrap();
        assert_eq!((info.node_rank, info.nodes), (1, 2));
        assert_eq!((info.local_rank, info.local_processes), (1, 2));
        let first = read(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_COMM_WORLD_NODE_RANK", "1"),
        ])
        .unwrap();
        assert_eq!((first.node_rank, first.nodes), (0, 1));
    }

    #[test]
    fn slurm_tasks_per_node_with_repeat_suffix() {
        let info = read(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "1"),
            ("SLURM_NNODES", "2"),
            ("SLURM_NTASKS_PER_NODE", "2(x2)"),
        ])
        .unwrap();
        assert_eq!((info.local_rank, info.local_processes), (1, 2));
        assert_eq!((info.node_rank, info.nodes), (1, 2));
    }

    #[test]
    fn rank_not_below_size_is_rejected() {
        let err = read(&[("RANK", "4"), ("WORLD_SIZE", "4")]).unwrap_err();
        assert!(matches!(
            err,
            WorldError::Inconsistent {
                rank: 4,
                processes: 4,
                ..
            }
        ));
        assert!(err.to_string().contains("process rank 4 of 4"));
    }

    #[test]
    fn rank_without_size_is_rejected() {
        let err = read(&[("RANK", "0")]).unwrap_err();
        assert_eq!(
            err,
            WorldError::Incomplete {
                present: "RANK",
                missing: "WORLD_SIZE"
            }
        );
    }

    #[test]
    fn garbage_is_named() {
        let err = read(&[("RANK", "zero"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(err.to_string().contains("RANK=\"zero\""), "{err}");
    }
}
