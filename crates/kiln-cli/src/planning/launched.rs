//! The planner of a run launched as several processes (`kiln launch`, mpirun, srun): one
//! measurement for all of them, so that every process plans the same layout.
//!
//! Every process takes part in probing the MPI link between the processes (what a step's
//! collectives cost across them); the first process then measures the model on its machine as
//! a one-process run would, and sends the planner (the measured step, the link, the machines)
//! to the others, which wait for it without keeping a core busy. Every process resolves the
//! same plan from the same planner. A first process that cannot measure sends its error, and
//! every process fails with it.

use std::time::Duration;

use kiln_core::collective::mpi::Processes;
use kiln_core::plan::Planner;

use super::machine::{MachineError, planner};
use crate::launched::Launched;
use crate::run_config::TrainConfig;

/// All-reduces timed at each size of the link probe.
const PROBE_CALLS: usize = 20;

/// `config`'s built-in model planned for the processes of `launched`: measured by the first
/// process, linked through MPI, on `launched`'s machines.
///
/// # Errors
/// [`MachineError`]: MPI could not start or a process did not take part in time, or the first
/// process could not measure the model.
pub fn launched_planner(
    config: &TrainConfig,
    launched: &Launched,
) -> Result<Planner, MachineError> {
    // The first process measures its own devices (on CUDA, the GPUs of its own ranks), not
    // the whole run's: the other processes' GPUs may be on other machines.
    let own = TrainConfig {
        world: launched.own_ranks(config.world, config.devices.as_ref().map(Vec::len)),
        ..config.clone()
    };
    plan_together(launched, config.parallel.ddp.collective_timeout_s, || {
        planner(&own).map_err(|e| e.to_string())
    })
}

/// The planner of the processes of `launched`: every process probes the MPI link, the first
/// runs `measure` (the others never do) and sends what it returns, and every process returns
/// it, on `launched`'s machines and linked through MPI. Every wait ends within
/// `timeout_s` (the run's `collective_timeout_s`), the first's measurement included.
///
/// # Errors
/// [`MachineError`]: MPI could not start or a process did not take part in time, or the first
/// process's `measure` failed.
pub fn plan_together(
    launched: &Launched,
    timeout_s: f64,
    measure: impl FnOnce() -> Result<Planner, String>,
) -> Result<Planner, MachineError> {
    let timeout = Duration::from_secs_f64(timeout_s);
    let process = launched.process();
    let mut processes = Processes::meet(process, timeout)?;
    let link = processes.probe(PROBE_CALLS)?;
    let mine = launched.is_main().then(|| {
        let measured = measure().map(|p| {
            Planner {
                nodes: process.nodes.max(1),
                ..p
            }
            .linked(link)
        });
        serde_json::to_vec(&measured).expect("a planner serialises")
    });
    let bytes = processes.from_first(mine, timeout)?;
    let measured: Result<Planner, String> = serde_json::from_slice(&bytes)
        .map_err(|e| MachineError::FirstProcess(format!("its planner does not read: {e}")))?;
    let planner = measured.map_err(MachineError::FirstProcess)?;
    tracing::info!(
        latency_us = planner.cluster.inter_latency * 1e6,
        gbps = planner.cluster.inter_bandwidth / 1e9,
        "auto: planned with the first process's measurement and its probe of the MPI link"
    );
    Ok(planner)
}
