//! The backends `kiln` can train on, the devices of each, and running a job on the chosen one.

use std::fmt;

use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use kiln_core::optim::Precision;
use kiln_nn::tensor_parallel::ShardedBackend;

/// A Burn backend selectable on the command line.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// Burn's Flex CPU backend (the fastest CPU backend; ranks share the one CPU device).
    #[default]
    Flex,
    /// Burn's NdArray CPU backend.
    Ndarray,
    /// wgpu (Vulkan / Metal / DX12); needs the `wgpu` feature.
    Wgpu,
    /// CUDA, one rank per GPU; needs the `cuda` feature.
    Cuda,
}

impl BackendKind {
    /// Whether ranks on this backend share the CPU.
    pub fn is_cpu(self) -> bool {
        matches!(self, BackendKind::Flex | BackendKind::Ndarray)
    }

    /// The machine's cores, when ranks on this backend share the CPU: what `auto` may make
    /// ranks of.
    pub fn cpu_cores(self) -> Option<usize> {
        self.is_cpu()
            .then(|| std::thread::available_parallelism().map_or(1, usize::from))
    }
}

/// A training precision the backend has no tensors for.
#[derive(Debug, thiserror::Error)]
#[error(
    "precision {precision} does not run on the {backend} backend, which has no {precision} \
     tensors; use --precision f32, or a backend that has them ({supported})"
)]
pub struct PrecisionUnsupported {
    backend: BackendKind,
    precision: Precision,
    supported: &'static str,
}

impl BackendKind {
    /// Checks that the backend computes in `precision`, before any rank starts.
    ///
    /// # Errors
    /// [`PrecisionUnsupported`]: NdArray has f32 tensors only, and wgpu's shaders have no
    /// bf16.
    pub fn check_precision(self, precision: Precision) -> Result<(), PrecisionUnsupported> {
        let supported = match precision {
            Precision::F32 => return Ok(()),
            Precision::Bf16 => "flex, cuda",
            Precision::F16 => "flex, wgpu, cuda",
        };
        let runs = match self {
            BackendKind::Flex | BackendKind::Cuda => true,
            BackendKind::Ndarray => false,
            BackendKind::Wgpu => precision == Precision::F16,
        };
        if runs {
            Ok(())
        } else {
            Err(PrecisionUnsupported {
                backend: self,
                precision,
                supported,
            })
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Flex => "flex",
            BackendKind::Ndarray => "ndarray",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
        })
    }
}

/// `--backend cuda` on a machine without the CUDA driver.
#[cfg(feature = "cuda")]
#[derive(Debug, thiserror::Error)]
#[error(
    "--backend cuda found no CUDA driver (libcuda.so): it needs an NVIDIA GPU and its driver; \
     if the driver is installed, add its folder to LD_LIBRARY_PATH"
)]
pub struct NoCudaDriver;

/// A backend compiled out of this binary.
#[derive(Debug, thiserror::Error)]
#[error("backend {0} is not compiled in; rebuild with `--features {0}`")]
pub struct BackendMissing(pub BackendKind);

/// Work generic over the backend, run by [`dispatch`] on the one the user chose.
pub trait Job {
    /// What the job returns.
    type Output;

    /// Runs on `devices`, one per rank.
    ///
    /// # Errors
    /// Whatever the job reports.
    fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<Self::Output, Box<dyn std::error::Error>>;
}

/// Where the ranks of a job run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// This many ranks on the backend's default devices: CPU-like backends repeat their one
    /// device, CUDA takes GPUs `0..n`.
    Ranks(usize),
    /// One device number per rank (`--devices 0,0,1`). Ranks may share a device: several CPU
    /// ranks, or two ranks on one GPU when the machine has one.
    Devices(Vec<usize>),
    /// This many ranks from device `first` on: the ranks of the `first / count`-th process of
    /// a machine, so that its processes take different GPUs (CPU-like backends share one).
    From {
        /// The first device.
        first: usize,
        /// Ranks.
        count: usize,
    },
}

impl Placement {
    /// From `--world` and `--devices`: the device list, when given, names the ranks.
    ///
    /// # Errors
    /// An empty device list, or a world that disagrees with the list's length.
    pub fn new(world: usize, devices: Option<&[usize]>) -> Result<Self, DeviceError> {
        match devices {
            None => Ok(Self::Ranks(world)),
            Some([]) => Err(DeviceError::Empty),
            Some(list) if list.len() != world => Err(DeviceError::WorldMismatch {
                world,
                devices: list.to_vec(),
            }),
            Some(list) => Ok(Self::Devices(list.to_vec())),
        }
    }

    /// The placement of the process that is `local_rank`-th on its machine: default ranks
    /// move past the devices of the machine's earlier processes (each holds as many), as
    /// torchrun's `LOCAL_RANK` picks a GPU. A device list is this process's own and stays.
    pub fn for_local_process(self, local_rank: usize) -> Self {
        match self {
            Self::Ranks(count) if local_rank > 0 => Self::From {
                first: local_rank * count,
                count,
            },
            other => other,
        }
    }

    /// Each rank's device number on a backend with `available` devices, of which
    /// `default_spread` says whether default ranks take one device each (CUDA) or share
    /// device 0 (the CPU backends).
    fn ordinals(
        &self,
        backend: BackendKind,
        available: usize,
        default_spread: bool,
    ) -> Result<Vec<usize>, DeviceError> {
        let ordinals = match self {
            Self::Ranks(n) if default_spread => (0..*n).collect(),
            Self::Ranks(n) => vec![0; *n],
            Self::From { first, count } if default_spread => (*first..first + count).collect(),
            Self::From { count, .. } => vec![0; *count],
            Self::Devices(list) => list.clone(),
        };
        match ordinals.iter().find(|&&d| d >= available) {
            Some(&device) => Err(DeviceError::Missing {
                backend,
                device,
                available,
            }),
            None => Ok(ordinals),
        }
    }
}

/// A `--devices` / `--world` combination that names no usable devices.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// `--devices` with no device in it.
    #[error("--devices names no device; give one number per rank, e.g. --devices 0,0")]
    Empty,
    /// Both flags given, and they disagree.
    #[error(
        "--world {world} disagrees with --devices {} ({} ranks); give one of them, or make them agree",
        fmt_devices(devices),
        devices.len()
    )]
    WorldMismatch {
        /// The `--world` given.
        world: usize,
        /// The `--devices` given.
        devices: Vec<usize>,
    },
    /// A device number the backend does not have.
    #[error(
        "device {device} does not exist: the {backend} backend has {available} device(s), numbered from 0 \
         (ranks may share one, e.g. --devices 0,0)"
    )]
    Missing {
        /// The backend.
        backend: BackendKind,
        /// The device number asked for.
        device: usize,
        /// How many the backend has.
        available: usize,
    },
}

fn fmt_devices(devices: &[usize]) -> String {
    devices
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `--devices` as given: one device number per rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceList(pub Vec<usize>);

/// Parses `--devices`: comma-separated device numbers, one per rank.
pub fn parse_devices(s: &str) -> Result<DeviceList, String> {
    s.split(',')
        .map(|d| d.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map(DeviceList)
        .map_err(|_| {
            format!(
                "--devices takes device numbers separated by commas, e.g. 0,0 or 0,1; got {s:?}"
            )
        })
}

/// Runs `job` on `backend` with its ranks placed as `placement` says.
///
/// # Errors
/// The job's error, [`BackendMissing`], or [`DeviceError`] for a device the backend lacks.
pub fn dispatch<J: Job>(
    backend: BackendKind,
    placement: &Placement,
    job: J,
) -> Result<J::Output, Box<dyn std::error::Error>> {
    // The CPU backends and wgpu (its default adapter) have one device that ranks share.
    let shared_one = |placement: &Placement| placement.ordinals(backend, 1, false).map(|o| o.len());
    match backend {
        BackendKind::Flex => job
            .run::<Autodiff<burn::backend::Flex>>(vec![Default::default(); shared_one(placement)?]),
        BackendKind::Ndarray => {
            job.run::<Autodiff<burn::backend::NdArray>>(vec![
                Default::default();
                shared_one(placement)?
            ])
        }
        // The GPU backends train under Burn's fusion (`kiln_kernels::backends`).
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => job.run::<Autodiff<kiln_kernels::backends::Wgpu>>(vec![
            Default::default();
            shared_one(placement)?
        ]),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            use burn::tensor::backend::Backend;
            // CubeCL panics in a thread of its own without the driver; say so first.
            if !kiln_core::cuda::driver_present() {
                return Err(NoCudaDriver.into());
            }
            let available = <burn::backend::Cuda as Backend>::device_count(0);
            let ordinals = placement.ordinals(backend, available, true)?;
            job.run::<Autodiff<kiln_kernels::backends::Cuda>>(
                ordinals
                    .into_iter()
                    .map(burn::backend::cuda::CudaDevice::new)
                    .collect(),
            )
        }
        #[allow(unreachable_patterns)]
        backend => Err(BackendMissing(backend).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_name_the_ranks_and_must_agree_with_the_world() {
        assert_eq!(parse_devices("0, 0,1"), Ok(DeviceList(vec![0, 0, 1])));
        assert!(parse_devices("0,a").unwrap_err().contains("e.g. 0,0"));
        assert_eq!(Placement::new(3, None), Ok(Placement::Ranks(3)));
        // The second process of a machine, two ranks each: GPUs 2 and 3; a CPU shares one.
        let second = Placement::Ranks(2).for_local_process(1);
        assert_eq!(second.ordinals(BackendKind::Flex, 1, false), Ok(vec![0, 0]));
        assert_eq!(second.ordinals(BackendKind::Flex, 4, true), Ok(vec![2, 3]));
        let listed = Placement::Devices(vec![1]).for_local_process(1);
        assert_eq!(listed, Placement::Devices(vec![1]));
        assert_eq!(
            Placement::new(2, Some(&[0, 0])),
            Ok(Placement::Devices(vec![0, 0]))
        );
        assert_eq!(Placement::new(1, Some(&[])), Err(DeviceError::Empty));
        assert_eq!(
            Placement::new(3, Some(&[0, 1])).unwrap_err().to_string(),
            "--world 3 disagrees with --devices 0,1 (2 ranks); give one of them, or make them agree"
        );
    }

    #[test]
    fn a_device_the_backend_lacks_is_named() {
        let cpu = Placement::Devices(vec![0, 1]);
        assert_eq!(
            cpu.ordinals(BackendKind::Flex, 1, false)
                .unwrap_err()
                .to_string(),
            "device 1 does not exist: the flex backend has 1 device(s), numbered from 0 \
             (ranks may share one, e.g. --devices 0,0)"
        );
        assert_eq!(
            Placement::Ranks(3).ordinals(BackendKind::Flex, 1, false),
            Ok(vec![0; 3])
        );
        assert_eq!(
            Placement::Ranks(2).ordinals(BackendKind::Cuda, 2, true),
            Ok(vec![0, 1])
        );
        assert_eq!(
            Placement::Devices(vec![0, 0]).ordinals(BackendKind::Cuda, 1, true),
            Ok(vec![0, 0])
        );
        assert!(
            Placement::Ranks(2)
                .ordinals(BackendKind::Cuda, 1, true)
                .is_err()
        );
    }
}
