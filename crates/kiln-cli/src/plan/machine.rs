//! This machine as the planner sees it: its CPU cores as devices, its memory shared among them,
//! a built-in model's step timed on one core, and the in-process collective's latency and
//! bandwidth probed between two ranks. `auto` plans `kiln train` with it, and `kiln plan
//! --model` prints it.

use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;
use kiln_core::data::DataSource;
use kiln_core::model::ParallelModel;
use kiln_core::plan::Planner;
use kiln_core::plan::cost::Measured;
use kiln_core::plan::measure::{
    Budget, Link, MeasureError, WARMUP, calibrate, cpu_planner, probe_links,
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
    let placement = Placement::new(1, None).map_err(|e| MachineError::Backend(e.to_string()))?;
    let (measured, link) = dispatch(config.backend, &placement, Measure { config, cores })
        .map_err(|e| MachineError::Backend(e.to_string()))??;
    Ok(cpu_planner(builtin_workload(config), measured, link, cores))
}

/// The measurement, as a job on the config's backend.
struct Measure<'a> {
    config: &'a TrainConfig,
    /// The machine's cores: the timed rank's and its companions'.
    cores: usize,
}

impl Job for Measure<'_> {
    type Output = Result<(Measured, Link), MachineError>;

    fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<Self::Output, Box<dyn std::error::Error>> {
        let device = &devices[0];
        let timed = with_builtin::<B, _>(
            self.config,
            device,
            Calibrate {
                device,
                batch: self.config.batch,
                beside: self.cores - 1,
                seed: self.config.seed,
            },
        );
        let measured = match timed {
            Ok(m) => m,
            Err(e) => return Ok(Err(e.into())),
        };
        let link = match probe_links::<B>(device, CALLS, Duration::from_secs(60)) {
            Ok(link) => link,
            Err(e) => return Ok(Err(e.into())),
        };
        Ok(Ok((measured, link)))
    }
}

/// Timing the model's step on one rank.
struct Calibrate<'a, B: AutodiffBackend> {
    device: &'a B::Device,
    batch: usize,
    /// Copies of the step run beside the timed one: the machine's other cores.
    beside: usize,
    seed: u64,
}

impl<B> ModelJob<B> for Calibrate<'_, B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Output = Result<Measured, MeasureError>;

    fn run<M, I>(self, model: M, data: DataSource<B, I, M::Input>) -> Self::Output
    where
        M: ParallelModel<B>,
        I: Send + Sync + Clone + 'static,
    {
        calibrate(
            self.device,
            &model,
            &adamw(),
            &data,
            (self.batch, self.beside),
            BUDGET,
            self.seed,
        )
    }
}
