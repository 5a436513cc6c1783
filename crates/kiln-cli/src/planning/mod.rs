//! The auto-planning service below the subcommands: a run's plan resolved from its
//! configuration ([`plan`]), with `auto` laid out by a planner measured on this machine
//! ([`planner`]) or agreed between the processes of a launched run (`launched_planner`,
//! [`plan_together`]), and the layout a resumed run or a precision fixes ([`auto_fixed`]).
//! `kiln train`, `kiln finetune`, `kiln ad train`, `kiln plan` and `kiln bench plan` use it.

mod fixed;
#[cfg(feature = "mpi")]
mod launched;
mod machine;

pub use fixed::auto_fixed;
#[cfg(feature = "mpi")]
pub use launched::plan_together;
pub use machine::planner;

use kiln_core::plan::{Plan, PlanRequest};
use kiln_core::strategy::StrategyKind;

use crate::backend::BackendKind;
use crate::launched::Launched;
use crate::run_config::{AutoPlan, ConfigError, TrainConfig};

/// `config`'s plan: the strategy, its ranks and mesh, resolved from this config, the
/// replicas `dp` named on the command line, and the machine's cores when the ranks share
/// the CPU, `auto` laid out as `auto` says; spread over the processes of `launched`,
/// which check at start-up that they run this same config; checked with the optimizer's
/// settings.
///
/// # Errors
/// What the plan refuses, or a precision the strategy cannot run.
pub fn plan(
    config: &TrainConfig,
    dp: Option<usize>,
    launched: &Launched,
    auto: AutoPlan<'_>,
) -> Result<Plan, ConfigError> {
    launched.check(config.strategy)?;
    let resume = match auto {
        AutoPlan::Measured { resume } => resume,
        AutoPlan::Replicas => None,
    };
    // A run resumes on the layout it saved; a precision may rule stages out.
    let fixed = fixed::auto_fixed(config.strategy, resume, config.optimizer.precision)?;
    let request = PlanRequest {
        strategy: config.strategy,
        world: launched.world(config.world, config.devices.as_ref().map(Vec::len)),
        dp,
        configs: config.parallel.clone(),
        global_batch: config.batch,
        cpu_cores: launched.cores(config.backend.cpu_cores()),
        planner: None,
        fixed,
    };
    // Checked first as it stands (the ranks, the batch), before `auto` spends a second
    // measuring the model.
    let mut plan = Plan::resolve(request.clone())?;
    // `auto` plans with the model measured here, when there is more than one rank to lay
    // out: the processes of a launched run with the first one's measurement.
    let measurable = (config.backend.is_cpu() || config.backend == BackendKind::Cuda)
        && (launched.processes() == 1 || cfg!(feature = "mpi"));
    if let AutoPlan::Measured { .. } = auto
        && config.strategy == StrategyKind::Auto
        && plan.world_size() > 1
        && measurable
    {
        let planner = match launched.processes() {
            1 => machine::planner(config),
            #[cfg(feature = "mpi")]
            _ => launched::launched_planner(config, launched),
            #[cfg(not(feature = "mpi"))]
            _ => unreachable!("a launched run is measured with MPI only"),
        }
        .map_err(|e| ConfigError::Measure(e.to_string()))?;
        plan = Plan::resolve(PlanRequest {
            planner: Some(planner),
            ..request
        })?;
    }
    plan.check_precision(config.optimizer.precision)?;
    // Every process's own devices may differ; the rest of the config may not.
    let shared = TrainConfig {
        devices: None,
        ..config.clone()
    };
    Ok(launched.plan(plan, &shared)?)
}
