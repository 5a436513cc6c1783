//! A process that a launcher started (`kiln launch`, `mpirun`, `srun`): its place among the
//! run's processes, the world they make together, and which of them writes. Without a
//! launcher it is the run's only process, and everything here is the identity.

use kiln_core::plan::Plan;
use kiln_core::strategy::{ConfigError, StrategyKind};
use kiln_core::world::{ProcessInfo, WorldError};

/// This process's place in the run.
#[derive(Debug, Clone)]
pub struct Launched {
    process: ProcessInfo,
}

impl Launched {
    /// What the launcher's environment says.
    ///
    /// # Errors
    /// Malformed or inconsistent launcher variables.
    pub fn from_env() -> Result<Self, WorldError> {
        Ok(Self {
            process: ProcessInfo::from_launcher()?,
        })
    }

    /// This process's place among the run's processes.
    #[cfg(feature = "mpi")]
    pub fn process(&self) -> &ProcessInfo {
        &self.process
    }

    /// Processes in the run.
    pub fn processes(&self) -> usize {
        self.process.processes
    }

    /// Whether this process writes what the run writes once (reports, progress, files):
    /// the first process, which holds rank 0.
    pub fn is_main(&self) -> bool {
        self.process.rank == 0
    }

    /// Refuses `strategy` when it cannot span the run's processes: before its plan is
    /// resolved, whose own errors would speak of ranks rather than processes.
    ///
    /// # Errors
    /// [`ConfigError::MultiProcess`], saying what to use instead.
    pub fn check(&self, strategy: StrategyKind) -> Result<(), ConfigError> {
        strategy.check_processes(self.processes())
    }

    /// The ranks of the whole run: `world` when named, else every process holds the ranks of
    /// its `devices` (one without).
    pub fn world(&self, world: Option<usize>, devices: Option<usize>) -> Option<usize> {
        world.or_else(|| {
            let local = devices.or((self.processes() > 1).then_some(1))?;
            Some(local * self.processes())
        })
    }

    /// The ranks of this process: its share of [`Self::world`] (at least one), what it
    /// measures its own devices over (planning across processes needs MPI).
    #[cfg(any(feature = "mpi", test))]
    pub fn own_ranks(&self, world: Option<usize>, devices: Option<usize>) -> Option<usize> {
        self.world(world, devices)
            .map(|world| (world / self.processes()).max(1))
    }

    /// The cores one process may use: the machine's, shared with the run's other processes
    /// on it.
    pub fn cores(&self, cores: Option<usize>) -> Option<usize> {
        cores.map(|c| (c / self.process.local_processes.max(1)).max(1))
    }

    /// `plan` spread over the run's processes, which check at start-up that they run the same
    /// `config`, field by field (so that a difference is named by its field), and the same
    /// plan.
    ///
    /// # Errors
    /// A plan the processes cannot share.
    pub fn plan<C: serde::Serialize>(&self, plan: Plan, config: &C) -> Result<Plan, ConfigError> {
        let fields = serde_json::to_value(config).expect("a config serialises");
        let plan = plan.across(self.process.clone())?;
        // The plan itself too: processes that resolved it apart (`auto` measuring each on its
        // own) would otherwise run different settings on one mesh.
        let settings = serde_json::to_string(plan.configs()).expect("settings serialise");
        let plan = {
            let whole = format!("{plan}; {settings}");
            plan.agreeing_on("plan", whole)
        };
        Ok(match fields {
            serde_json::Value::Object(fields) => fields.into_iter().fold(plan, |plan, (k, v)| {
                plan.agreeing_on(format!("config's {k}"), format!("{k} = {v}"))
            }),
            other => plan.agreeing_on("config", other.to_string()),
        })
    }
}

/// Ends the process's part in a run that succeeded: with MPI, finalises it (a process that
/// fails exits without, and the launcher then ends the others).
pub fn finish() {
    #[cfg(feature = "mpi")]
    kiln_core::collective::mpi::finalize();
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_core::world::Launcher;

    fn launched(processes: usize) -> Launched {
        Launched {
            process: ProcessInfo {
                rank: processes - 1,
                processes,
                local_rank: processes - 1,
                local_processes: processes,
                node_rank: 0,
                nodes: 1,
                launcher: Launcher::OpenMpi,
            },
        }
    }

    #[test]
    fn the_world_is_every_processs_ranks() {
        let one = Launched {
            process: ProcessInfo::single(),
        };
        assert_eq!(one.world(None, None), None, "the plan chooses");
        assert_eq!(one.world(None, Some(2)), Some(2));
        let two = launched(2);
        assert_eq!(two.world(None, None), Some(2), "one rank per process");
        assert_eq!(
            two.world(None, Some(2)),
            Some(4),
            "this process's devices, everywhere"
        );
        assert_eq!(
            two.world(Some(6), Some(2)),
            Some(6),
            "named: checked by Placement"
        );
        assert_eq!(two.own_ranks(None, Some(2)), Some(2), "its devices");
        assert_eq!(
            two.own_ranks(Some(6), None),
            Some(3),
            "its share of the world"
        );
        assert_eq!(two.own_ranks(None, None), Some(1));
        assert_eq!(one.own_ranks(None, None), None, "the plan chooses");
        assert_eq!(two.cores(Some(4)), Some(2));
        assert_eq!(two.cores(Some(1)), Some(1));
        assert!(!two.is_main());
    }

    #[test]
    fn strategies_of_one_process_are_refused_across_processes() {
        assert!(launched(1).check(StrategyKind::Single).is_ok());
        assert!(launched(2).check(StrategyKind::Ddp).is_ok());
        let refused = launched(2).check(StrategyKind::DataParallel).unwrap_err();
        assert!(refused.to_string().contains("use ddp"), "{refused}");
    }
}
