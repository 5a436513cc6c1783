//! This machine as the planner sees it, for a built-in model: what `auto` plans `kiln train`
//! with, and `kiln plan --model` prints.
//!
//! - On the CPU: its cores as devices, its memory shared among them, the model's step timed on
//!   one core (beside copies on the others, and alone), the in-process collective's latency
//!   and bandwidth probed between two ranks, and the step over two ranks for what several ranks
//!   cost beyond their parts.
//! - On CUDA: the run's GPUs as devices, each with the memory its driver reports free at start
//!   (its total where it cannot say), the step timed alone on the first, and over two ranks
//!   where there are two GPUs.

use burn::tensor::backend::AutodiffBackend;
use kiln_core::data::DataSource;
use kiln_core::fit::FitModel;
use kiln_core::optim::{GuardConfigError, PerformanceConfig};
use kiln_core::plan::Planner;
use kiln_core::plan::cost::Workload;
use kiln_core::strategy::PerformanceSpec;
use kiln_nn::tensor_parallel::ShardedBackend;
use kiln_planner::{self as planner, MeasureError};

use crate::backend::{BackendKind, Job, Placement, dispatch};
use crate::run_config::{ModelJob, TrainConfig, adamw, builtin_workload, with_builtin};

/// Why this machine could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// A backend whose devices the planner cannot size yet.
    #[error(
        "the planner measures the CPU backends (flex, ndarray) and CUDA; on {0}, whose devices \
         do not report their memory, name the strategy, or describe the devices to `kiln plan` \
         (--device, --device-memory)"
    )]
    NotMeasurable(BackendKind),
    /// A device that did not report its memory.
    #[error("the {0} device did not report its memory; name the strategy instead of auto")]
    NoMemory(BackendKind),
    /// The step or the probe failed.
    #[error(transparent)]
    Measure(#[from] MeasureError),
    /// The run's precision and guards cannot make an optimizer.
    #[error(transparent)]
    Optimizer(#[from] GuardConfigError),
    /// The job could not run on the backend.
    #[error("{0}")]
    Backend(String),
    /// The processes of a launched run could not meet to plan.
    #[cfg(feature = "mpi")]
    #[error(transparent)]
    Processes(#[from] kiln_core::collective::mpi::MpiError),
    /// The first process of a launched run could not measure the model (its error).
    #[cfg(feature = "mpi")]
    #[error("the first process could not measure the model: {0}")]
    FirstProcess(String),
}

/// The devices a measurement sees.
#[derive(Debug, Clone, Copy)]
enum Machine {
    /// The CPU's cores, that ranks share.
    Cores(usize),
    /// Devices with memory of their own, one rank each.
    Devices,
}

/// `config`'s built-in model and this machine's devices, measured: what `auto` plans with.
///
/// # Errors
/// [`MachineError`]: a backend whose devices cannot be sized, or a failed measurement.
pub fn planner(config: &TrainConfig) -> Result<Planner, MachineError> {
    let (machine, placement) = match config.backend {
        backend if backend.is_cpu() => {
            let cores = backend.cpu_cores().unwrap_or(1);
            // The ranks' devices the calibration times over (the rendezvous over two,
            // the crowding over three, the shards over four).
            (
                Machine::Cores(cores),
                Placement::new(planner::TIMED_RANKS, None),
            )
        }
        // The run's GPUs: one rank each (those listed, or as many as the world).
        BackendKind::Cuda => (
            Machine::Devices,
            Placement::new(
                config
                    .world
                    .or(config.devices.as_ref().map(Vec::len))
                    .unwrap_or(1),
                config.devices.as_deref(),
            ),
        ),
        backend => return Err(MachineError::NotMeasurable(backend)),
    };
    let placement = placement.map_err(|e| MachineError::Backend(e.to_string()))?;
    let job = Measure {
        config,
        machine,
        workload: builtin_workload(config),
    };
    dispatch(config.backend, &placement, job).map_err(|e| MachineError::Backend(e.to_string()))?
}

/// The measurement, as a job on the config's backend.
struct Measure<'a> {
    config: &'a TrainConfig,
    /// The devices measured.
    machine: Machine,
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
            backend: self.config.backend,
            batch: self.config.batch,
            machine: self.machine,
            workload: self.workload,
            performance: self.config.optimizer.clone(),
            seed: self.config.seed,
        };
        Ok(with_builtin::<B, _>(self.config, &devices[0], calibrate))
    }
}

/// Timing the model's step on one rank and on two, and the collective between two.
struct Calibrate<'a, B: AutodiffBackend> {
    devices: &'a [B::Device],
    backend: BackendKind,
    batch: usize,
    machine: Machine,
    workload: Workload,
    /// The run's precision and guards: the step is timed as the run will take it.
    performance: PerformanceConfig,
    seed: u64,
}

impl<B> ModelJob<B> for Calibrate<'_, B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    type Output = Result<Planner, MachineError>;

    fn run<M, I>(self, model: M, data: DataSource<B, I, M::Input>) -> Self::Output
    where
        M: FitModel<B>,
        I: Send + Sync + Clone + 'static,
    {
        let optim = &PerformanceSpec::new(adamw(), self.performance)?;
        let (workload, devices, batch, seed) = (self.workload, self.devices, self.batch, self.seed);
        Ok(match self.machine {
            // On the CPU, one core runs the timed rank and the others copies beside it.
            Machine::Cores(cores) => {
                planner::planner(workload, devices, &model, optim, &data, batch, cores, seed)?
            }
            Machine::Devices => {
                // Each device's memory free at start (another job's, or the display's, is
                // not Kiln's to fill), else its total; the smallest bounds the measurement.
                let each = devices
                    .iter()
                    .map(|d| {
                        kiln_core::memory::device::free_bytes(d)
                            .or_else(|| kiln_core::memory::device::total_bytes(d))
                    })
                    .collect::<Option<Vec<u64>>>()
                    .ok_or(MachineError::NoMemory(self.backend))?;
                let memory = each
                    .iter()
                    .copied()
                    .min()
                    .ok_or(MachineError::NoMemory(self.backend))?;
                let mut planner = planner::device_planner(
                    workload, devices, memory, &model, optim, &data, batch, seed,
                )?;
                if each.iter().any(|&m| m != memory) {
                    planner.cluster.device_memory = each;
                }
                planner
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use kiln_core::strategy::StrategyKind;

    use super::*;
    use crate::run_config::ModelKind;

    type B = Autodiff<Flex>;

    /// The planner of one device with memory of its own, `memory` bytes, measured as on CUDA
    /// (the CPU's one device standing in for a GPU).
    struct OneDevice {
        memory: u64,
        workload: Workload,
        device: burn::backend::flex::FlexDevice,
    }

    impl ModelJob<B> for OneDevice {
        type Output = Result<Planner, MeasureError>;

        fn run<M, I>(self, model: M, data: DataSource<B, I, M::Input>) -> Self::Output
        where
            M: FitModel<B>,
            I: Send + Sync + Clone + 'static,
        {
            // Two ranks on the one device: still one device to plan for.
            let devices = [self.device, self.device];
            planner::device_planner(
                self.workload,
                &devices,
                self.memory,
                &model,
                &adamw(),
                &data,
                32,
                7,
            )
        }
    }

    fn one_device(memory: u64) -> Planner {
        let config = TrainConfig {
            model: ModelKind::Mlp,
            batch: 32,
            ..TrainConfig::default()
        };
        let job = OneDevice {
            memory,
            workload: builtin_workload(&config),
            device: Default::default(),
        };
        with_builtin::<B, _>(&config, &Default::default(), job).unwrap()
    }

    #[test]
    fn a_device_of_its_own_is_planned_alone_with_its_own_memory() {
        let planner = one_device(1 << 30);
        let cluster = &planner.cluster;
        assert_eq!(cluster.devices, 1, "one distinct device");
        assert_eq!(cluster.memory, 1 << 30);
        assert_eq!(cluster.cores, None, "a GPU shares no cores");
        let measured = cluster.measured.as_ref().expect("the step was timed");
        // Timed at several sizes and fitted to a step that takes time. Not its samples' cost
        // alone: on a busy machine (the other tests run beside this one) a small MLP's samples
        // can cost less than the timings' noise, and the fit then rightly says 0.
        assert!(measured.timings.len() >= 3, "{measured:?}");
        assert!(measured.seconds(32, 1) > 0.0, "{measured:?}");
        let planned = planner.plan(1).unwrap();
        assert_eq!(planned.chosen().strategy, StrategyKind::Single);
        // The same model on a device too small for it: nothing fits, and the error says so.
        let error = one_device(1 << 10).plan(1).unwrap_err().to_string();
        assert!(error.contains("fit"), "{error}");
    }

    #[test]
    fn devices_that_do_not_report_their_memory_are_not_measured() {
        let config = TrainConfig {
            backend: BackendKind::Wgpu,
            ..TrainConfig::default()
        };
        let error = planner(&config).unwrap_err();
        assert!(matches!(
            error,
            MachineError::NotMeasurable(BackendKind::Wgpu)
        ));
        assert!(error.to_string().contains("--device-memory"), "{error}");
    }
}
