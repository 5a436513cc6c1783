//! Who this process is among the run's: its ranks and counts, and which launcher said so
//! (read from the launcher's variables in [`launcher`](super::launcher)).

use std::fmt;

/// Which launcher described this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// No launcher: one process.
    None,
    /// Built by hand.
    Explicit,
    /// torchrun-style variables (`RANK`, `WORLD_SIZE`, …), as torchrun and similar launchers set them.
    Torchrun,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// SLURM's `srun` (`SLURM_*`).
    Slurm,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::None => "no launcher",
            Launcher::Explicit => "explicit settings",
            Launcher::Torchrun => "torchrun variables",
            Launcher::OpenMpi => "Open MPI variables",
            Launcher::Slurm => "SLURM variables",
        })
    }
}

/// This process's place among the processes of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Rank of this process among all processes.
    pub rank: usize,
    /// Number of processes.
    pub processes: usize,
    /// Rank of this process among the processes of its node.
    pub local_rank: usize,
    /// Number of processes on this node.
    pub local_processes: usize,
    /// Index of this node.
    pub node_rank: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// Where the numbers came from.
    pub launcher: Launcher,
}

impl ProcessInfo {
    /// The only process of a run.
    pub fn single() -> Self {
        Self {
            rank: 0,
            processes: 1,
            local_rank: 0,
            local_processes: 1,
            node_rank: 0,
            nodes: 1,
            launcher: Launcher::None,
        }
    }
}
