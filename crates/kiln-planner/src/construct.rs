//! The planners `auto` plans with, built from what was measured here: the step calibrated on
//! the CPU's cores or on a device, the link probed, the ranks' costs and the memory fitted.

use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;

use super::measure::{Budget, MeasureError, calibrate, calibrate_ranks, time_steps, timing_plan};
use super::probe::probe_links;
use kiln_core::collective::Link;
use kiln_core::data::DataSource;
use kiln_core::plan::cost::{Cluster, Measured, Workload};
use kiln_core::plan::{Planner, StrategyKind};
use kiln_core::stats::WARMUP;
use kiln_core::strategy::OptimizerSpec;
use kiln_core::strategy::StrategyModel;
use kiln_core::tensor_parallel::TpBackend;

/// Steps [`planner`] times at each calibration point: at least 5 and a fifth of a second, at
/// most 1000.
const PLANNER_BUDGET: Budget = Budget {
    warmup: WARMUP,
    steps: 5,
    seconds: 0.2,
    most_steps: 1000,
};

/// The untimed steps [`device_planner`] runs before it calibrates: half a second of them.
const DEVICE_WARMUP: Budget = Budget {
    warmup: WARMUP,
    steps: 10,
    seconds: 0.5,
    most_steps: 10_000,
};

/// All-reduces [`planner`]'s link probe times at each size.
const PROBE_CALLS: usize = 20;

/// This machine's `cores` as the planner's devices for `model`'s step (`workload` to the cost
/// model) on batches of `batch` from `data`, trained with `optim`: the step timed on one core
/// of `devices` ([`calibrate`], beside copies on the others, and alone), the in-process
/// collective probed ([`probe_links`]), and the step over two to four ranks of `devices`
/// ([`calibrate_ranks`]).
/// About a second. Where the process counts its memory, the memory model is then fitted to
/// the model cut over shards and stages ([`fit_memory`](super::memory_fit::fit_memory)). What
/// `auto` plans with on the CPU, whatever the model.
///
/// # Errors
/// A step or the probe that fails, or timings that cannot be fitted.
#[allow(clippy::too_many_arguments)]
pub fn planner<B, M, S, I>(
    workload: Workload,
    devices: &[B::Device],
    model: &M,
    optim: &S,
    data: &DataSource<B, I, M::Input>,
    batch: usize,
    cores: usize,
    seed: u64,
) -> Result<Planner, MeasureError>
where
    B: AutodiffBackend + TpBackend,
    M: StrategyModel<B>,
    S: OptimizerSpec<B> + Sync,
    I: Send + 'static,
{
    let device = &devices[0];
    let others = cores.saturating_sub(1);
    let measured = calibrate(
        device,
        model,
        optim,
        data,
        (batch, others),
        PLANNER_BUDGET,
        seed,
    )?;
    let link = probe_links::<B>(device, PROBE_CALLS, Duration::from_secs(60))?;
    let planner = cpu_planner(workload, measured, link, cores);
    let others = cores.saturating_sub(2);
    let planner = calibrate_ranks(
        planner,
        devices,
        model,
        optim,
        data,
        (batch, others),
        PLANNER_BUDGET,
        seed,
    )?;
    super::memory_fit::fit_memory(planner, device, model, optim, data, seed)
}

/// `devices` that have memory of their own (GPUs: one rank each, `memory` bytes each) as the
/// planner's devices for `model`'s step (`workload` to the cost model) on batches of `batch`
/// from `data`, trained with `optim`: the step timed on the first ([`calibrate`], alone), and
/// where there are two distinct devices, the collective probed ([`probe_links`], on the first
/// device) and the step timed over the first two ([`calibrate_ranks`]). What `auto` plans a
/// CUDA run with.
///
/// # Errors
/// A step or the probe that fails, or timings that cannot be fitted.
#[allow(clippy::too_many_arguments)]
pub fn device_planner<B, M, S, I>(
    workload: Workload,
    devices: &[B::Device],
    memory: u64,
    model: &M,
    optim: &S,
    data: &DataSource<B, I, M::Input>,
    batch: usize,
    seed: u64,
) -> Result<Planner, MeasureError>
where
    B: AutodiffBackend + TpBackend,
    M: StrategyModel<B>,
    S: OptimizerSpec<B> + Sync,
    I: Send + 'static,
{
    let mut distinct: Vec<B::Device> = Vec::with_capacity(devices.len());
    for device in devices {
        if !distinct.contains(device) {
            distinct.push(device.clone());
        }
    }
    // A GPU idle before the run runs at lower clocks for its first fraction of a second of
    // work: steps before the timed ones, so that the calibration's first points are not
    // timed slower than its last.
    let plan = timing_plan(StrategyKind::Single, 1, batch.min(data.len()).max(1), 1)?;
    let one = std::slice::from_ref(&distinct[0]);
    time_steps(
        &plan,
        one,
        model.clone(),
        optim,
        data.clone(),
        DEVICE_WARMUP,
        seed,
    )?;
    let measured = calibrate(
        &distinct[0],
        model,
        optim,
        data,
        (batch, 0),
        PLANNER_BUDGET,
        seed,
    )?;
    let link = match distinct.len() {
        // One device: no collective to price (a plan of one rank has none). The largest
        // finite bandwidth, not an infinite one, so that the cluster still writes as JSON.
        1 => Link {
            latency: 0.0,
            bandwidth: f64::MAX,
        },
        _ => probe_links::<B>(&distinct[0], PROBE_CALLS, Duration::from_secs(60))?,
    };
    let shape = Shape {
        devices: distinct.len(),
        memory,
        cores: None,
    };
    let planner = measured_planner(workload, measured, link, shape);
    // With one device it has no pair to time, and returns the planner as it is.
    calibrate_ranks(
        planner,
        &distinct,
        model,
        optim,
        data,
        (batch, 0),
        PLANNER_BUDGET,
        seed,
    )
}

/// This machine's `cores` as the planner's devices, running `workload` as `measured` on one
/// core, linked as `link` says: what `auto` plans a CPU run with. Their memory is the
/// machine's (Linux's `MemTotal`, or 8 GiB where `/proc` does not say), shared among the
/// ranks.
pub fn cpu_planner(workload: Workload, measured: Measured, link: Link, cores: usize) -> Planner {
    let shape = Shape {
        devices: cores,
        memory: machine_memory(),
        cores: Some(cores),
    };
    measured_planner(workload, measured, link, shape)
}

/// The devices of a measured machine.
struct Shape {
    /// How many.
    devices: usize,
    /// Bytes of memory each.
    memory: u64,
    /// The cores they share, when they are a CPU's ([`Cluster::cores`]).
    cores: Option<usize>,
}

/// The planner of `shape`'s devices, running `workload` as `measured` on one, linked as `link`
/// says.
///
/// Where the calibration counted the rank's memory, the workload's activations are scaled to
/// the measured bytes per sample, and what the rank held beyond its parameters, gradients,
/// moments and activations becomes the workload's `fixed_bytes`.
fn measured_planner(
    mut workload: Workload,
    measured: Measured,
    link: Link,
    shape: Shape,
) -> Planner {
    if let Some((base, per_sample)) = measured.memory_line() {
        let predicted = workload.block_activation_bytes[0] * workload.layers as f64;
        if predicted > 0.0 {
            let scale = per_sample / predicted;
            for bytes in &mut workload.block_activation_bytes {
                *bytes *= scale;
            }
            workload.boundary_bytes *= scale.max(1.0);
        }
        let state = workload.params as f64 * workload.weight_bytes
            + workload.trainable as f64 * workload.trainable_extra_bytes;
        workload.fixed_bytes = (base - state).max(0.0);
    }
    // The model's own FLOPs over its measured time a sample: the "peak" its utilisation is
    // read against is one device's speed on this model (finite, as a plan's JSON holds it,
    // where the fit leaves no time a sample).
    let per_sample = measured.per_sample.max(f64::MIN_POSITIVE);
    let flops =
        ((1.0 + workload.backward_passes) * workload.forward_flops / per_sample).min(f64::MAX);
    let cluster = Cluster {
        devices: shape.devices,
        per_node: shape.devices,
        memory: shape.memory,
        peak_flops: flops,
        efficiency: 1.0,
        intra_bandwidth: link.bandwidth,
        inter_bandwidth: link.bandwidth,
        intra_latency: link.latency,
        inter_latency: link.latency,
        cores: shape.cores,
        measured: Some(measured),
        device_memory: Vec::new(),
        max_memory: Default::default(),
        margin: None,
    };
    Planner {
        workload,
        cluster,
        nodes: 1,
    }
}

/// The machine's memory (Linux's `MemTotal`), or 8 GiB where `/proc` does not say.
fn machine_memory() -> u64 {
    let read = || -> Option<u64> {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    read().unwrap_or(8 << 30)
}
