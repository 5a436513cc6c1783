//! This machine as the planner sees it: its CPU cores as devices, its memory shared among them,
//! a built-in model's step timed on one core (beside copies on the others, and alone), the
//! in-process collective's latency and bandwidth probed between two ranks, and the model's
//! step over two ranks for what several ranks cost beyond their parts. `auto` plans `kiln
//! train` with it, and `kiln plan --model` prints it.

use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;
use kiln_core::data::DataSource;
use kiln_core::model::ParallelModel;
use kiln_core::plan::Planner;
use kiln_core::plan::cost::Workload;
use kiln_core::plan::measure::{
    Budget, MeasureError, WARMUP, calibrate, calibrate_ranks, cpu_planner, probe_links,
};
use kiln_nn::tensor_parallel::ShardedBackend;

use crate::backend::{BackendKind, Job, Placement, dispatch};
use crate::train::{ModelJob, TrainConfig, adamw, builtin_workload, with_builtin};

/// Steps timed at each calibration point, their median kept: at least 5 and a fifth of a
/// second, at most 1000.
const BUDGET: Budget = Budget {
    warmup: WARMUP,
    steps: 5,
    seconds: 0.2,
    most_steps: 1000,
};
/// All-reduces the link probe times at each size.
const CALLS: usize = 20;

/// Why this machine could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// A backend whose devices the planner cannot size yet.
    #[error(
        "the planner measures the CPU backends (flex, ndarray) only; on {0}, name the strategy, \
         or describe the devices to `kiln plan` (--device, --device-memory)"
    )]
    NotCpu(BackendKind),
    /// The step or the probe failed.
    #[error(transparent)]
    Measure(#[from] MeasureError),
    /// The job could not run on the backend.
    #[error("{0}")]
    Backend(String),
}

/// `config`'s built-in model and this machine's cores, measured: what `auto` plans with.
///
/// # Errors
/// [`MachineError`]: a backend other than the CPU's, or a failed measurement.
pub fn planner(config: &TrainConfig) -> Result<Planner, MachineError> {
    if !config.backend.is_cpu() {
        return Err(MachineError::NotCpu(config.backend));
    }
    let cores = config.backend.cpu_cores().unwrap_or(1);
    // Two ranks' devices: the rendezvous is timed over two.
    let placement = Placement::new(2, None).map_err(|e| MachineError::Backend(e.to_string()))?;
    let job = Measure {
        config,
        cores,
        workload: builtin_workload(config),
    };
    dispatch(config.backend, &placement, job).map_err(|e| MachineError::Backend(e.to_string()))?
}

/// The measurement, as a job on the config's backend.
struct Measure<'a> {
    config: &'a TrainConfig,
    /// The machine's cores: the timed rank's and its companions'.
    cores: usize,
    /// The model's step, as the cost model reads it.
    workload: Workload,
}

impl Job for Measure<'_> {
    type Output = Result<Planner, MachineError>;

    fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<Self::Output, Box<dyn std::error::Error>> {
        let calibrate = Calibrate {
            devices: &devices,
            batch: self.config.batch,
            cores: self.cores,
            workload: self.workload,
            seed: self.config.seed,
        };
        Ok(with_builtin::<B, _>(self.config, &devices[0], calibrate))
    }
}

/// Timing the model's step on one rank and on two, and the collective between two.
struct Calibrate<'a, B: AutodiffBackend> {
    devices: &'a [B::Device],
    batch: usize,
    /// The machine's cores: one runs the timed rank, the others copies beside it.
    cores: usize,
    workload: Workload,
    seed: u64,
}

impl<B> ModelJob<B> for Calibrate<'_, B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Output = Result<Planner, MachineError>;

    fn run<M, I>(self, model: M, data: DataSource<B, I, M::Input>) -> Self::Output
    where
        M: ParallelModel<B>,
        I: Send + Sync + Clone + 'static,
    {
        let (device, optim) = (&self.devices[0], adamw());
        let others = self.cores.saturating_sub(1);
        let measured = calibrate(
            device,
            &model,
            &optim,
            &data,
            (self.batch, others),
            BUDGET,
            self.seed,
        )?;
        let link = probe_links::<B>(device, CALLS, Duration::from_secs(60))?;
        let planner = cpu_planner(self.workload, measured, link, self.cores);
        Ok(calibrate_ranks(
            planner,
            self.devices,
            &model,
            &optim,
            &data,
            self.cores.saturating_sub(2),
            BUDGET,
            self.seed,
        )?)
    }
}
