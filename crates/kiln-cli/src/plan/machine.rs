//! This machine as the planner sees it: its CPU cores as devices, its memory shared among them,
//! a built-in model's step timed on one core (beside copies on the others, and alone), the
//! in-process collective's latency and bandwidth probed between two ranks, and the model's
//! step over two ranks for what several ranks cost beyond their parts. `auto` plans `kiln
//! train` with it, and `kiln plan --model` prints it.

use burn::tensor::backend::AutodiffBackend;
use kiln_core::data::DataSource;
use kiln_core::model::ParallelModel;
use kiln_core::plan::Planner;
use kiln_core::plan::cost::Workload;
use kiln_core::plan::measure::{self, MeasureError};
use kiln_nn::tensor_parallel::ShardedBackend;

use crate::backend::{BackendKind, Job, Placement, dispatch};
use crate::train::{ModelJob, TrainConfig, adamw, builtin_workload, with_builtin};

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
        Ok(measure::planner(
            self.workload,
            self.devices,
            &model,
            &adamw(),
            &data,
            self.batch,
            self.cores,
            self.seed,
        )?)
    }
}
