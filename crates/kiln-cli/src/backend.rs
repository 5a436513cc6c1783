//! The backends `kiln` can train on, the devices of each, and running a job on the chosen one.

use std::fmt;

use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;

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
    fn run<B: AutodiffBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<Self::Output, Box<dyn std::error::Error>>;
}

/// Runs `job` on `backend` with `world` ranks: CPU-like backends repeat their one device,
/// CUDA takes GPUs `0..world`.
///
/// # Errors
/// The job's error, or [`BackendMissing`].
pub fn dispatch<J: Job>(
    backend: BackendKind,
    world: usize,
    job: J,
) -> Result<J::Output, Box<dyn std::error::Error>> {
    match backend {
        BackendKind::Flex => {
            job.run::<Autodiff<burn::backend::Flex>>(vec![Default::default(); world])
        }
        BackendKind::Ndarray => {
            job.run::<Autodiff<burn::backend::NdArray>>(vec![Default::default(); world])
        }
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => {
            job.run::<Autodiff<burn::backend::Wgpu>>(vec![Default::default(); world])
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => job.run::<Autodiff<burn::backend::Cuda>>(
            (0..world)
                .map(burn::backend::cuda::CudaDevice::new)
                .collect(),
        ),
        #[allow(unreachable_patterns)]
        backend => Err(BackendMissing(backend).into()),
    }
}
