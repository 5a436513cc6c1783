//! `kiln plan`: how a model should train on a cluster, and how fast, from its description and
//! the cluster's, without either being here, or for a built-in model measured on this
//! machine's cores (`--model`, as `auto` plans). Prints every layout `dp × pp × tp` the cost
//! model ([`kiln_core::plan::cost`]) estimates, best first, and why the first was chosen.

mod args;
mod describe;
mod table;

use kiln_core::plan::cost::{Cluster, Workload, search};

use crate::run_config::{ModelKind, TrainConfig};

pub use args::PlanArgs;

/// What `kiln plan --json` writes.
#[derive(Debug, serde::Serialize)]
struct PlanReport<'a> {
    /// What a step asks.
    workload: &'a kiln_core::plan::cost::Workload,
    /// The devices.
    cluster: &'a kiln_core::plan::cost::Cluster,
    /// Why the first candidate was chosen.
    reason: &'a str,
    /// Every candidate: the chosen, the others that fit (fastest first), then the rejected.
    candidates: &'a [kiln_core::plan::cost::Candidate],
}

/// Runs `kiln plan`.
///
/// # Errors
/// A model or cluster described wrongly, or nothing that fits (naming what would).
pub fn run(args: PlanArgs) -> Result<(), Box<dyn std::error::Error>> {
    // `-` is standard output; a file is claimed before the plan is searched.
    let json_file = args.json.as_deref().filter(|p| p.to_str() != Some("-"));
    let _claim = crate::outputs::check_files(&[("--json", json_file)])?;
    let (name, work, cluster) = match args.model {
        Some(model) => measured(&args, model)?,
        None => {
            let (name, work) = describe::workload(&args)?;
            (name, work, describe::cluster(&args)?)
        }
    };
    let planned = search(&work, &cluster)?;
    let report = PlanReport {
        workload: &work,
        cluster: &cluster,
        reason: &planned.reason,
        candidates: &planned.candidates,
    };
    let json = serde_json::to_string_pretty(&report)?;
    match json_file {
        None if args.json.is_some() => println!("{json}"),
        other => {
            if let Some(path) = other {
                crate::outputs::write("--json", path, (json + "\n").as_bytes())?;
            }
            print!(
                "{}",
                table::render(&name, &work, &cluster, &planned, args.top)
            );
        }
    }
    Ok(())
}

/// The built-in `model` and this machine, measured.
fn measured(
    args: &PlanArgs,
    model: ModelKind,
) -> Result<(String, Workload, Cluster), Box<dyn std::error::Error>> {
    let config = TrainConfig {
        model,
        // --layers describes a transformer's shape, or, with --model, the built-in's blocks.
        layers: args.layers,
        batch: args.global_batch,
        ..TrainConfig::default()
    };
    config.validate()?;
    let planner = crate::planning::planner(&config)?;
    let cores = planner.cluster.devices;
    let devices = args.devices.unwrap_or(cores);
    if devices == 0 {
        return Err("--devices must be at least 1".into());
    }
    let name = format!("the built-in {} (measured on this machine)", model.name());
    let mut cluster = planner.cluster(devices);
    // Checked with the rest of the cluster by the search.
    describe::limit(&mut cluster, args)?;
    Ok((name, planner.workload.clone(), cluster))
}
