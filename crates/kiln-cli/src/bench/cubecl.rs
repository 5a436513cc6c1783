//! The plain CubeCL backends `kiln bench kernels` and `kiln bench matmul` run on, picked by
//! `--backend` and `--dtype`: one dispatch for both.

use std::path::Path;

use clap::ValueEnum;
use kiln_kernels::KernelBackend;
use kiln_kernels::cube::tune::Tunable;

use crate::backend::{BackendKind, BackendMissing};

/// The float type the kernels run in.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Dtype {
    /// 32-bit floats.
    F32,
    /// 16-bit floats (f32 accumulation inside the kernels).
    F16,
}

/// Writes `fields` (a JSON object) to `path`, the flag `--json`, headed by the run's backend
/// and dtype: the report of a run on `backend` in `dtype`, which the peer scripts read.
///
/// # Errors
/// When `path` cannot be written.
pub fn write_json(
    path: &Path,
    backend: BackendKind,
    dtype: Dtype,
    fields: serde_json::Value,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut json = serde_json::json!({
        "backend": backend.to_string(),
        "dtype": format!("{dtype:?}").to_lowercase(),
    });
    if let (Some(json), serde_json::Value::Object(fields)) = (json.as_object_mut(), fields) {
        json.extend(fields);
    }
    crate::outputs::write(
        "--json",
        path,
        serde_json::to_string_pretty(&json)?.as_bytes(),
    )?;
    Ok(())
}

/// Kernels run only on CubeCL backends.
#[derive(Debug, thiserror::Error)]
#[error(
    "kernel benchmarks need a CubeCL backend (--backend wgpu or cuda); {0} runs the plain-Burn \
     reference, which is what the kernels are measured against"
)]
pub struct NotCubecl(BackendKind);

/// A measurement written once for any plain CubeCL backend.
// Without the `wgpu` and `cuda` features no backend runs a job.
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
pub trait CubeJob {
    /// What it measured.
    type Output;

    /// Runs on `device` of backend `B`.
    fn run<B: KernelBackend + Tunable>(self, device: &B::Device) -> Self::Output;
}

/// Runs `job` on `backend` (its first device) in `dtype`.
///
/// # Errors
/// [`NotCubecl`] for a CPU backend, [`BackendMissing`] for one this binary was built without.
// Without the `wgpu` and `cuda` features every arm is an error and the job goes unused.
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(unused_variables))]
pub fn dispatch<J: CubeJob>(
    backend: BackendKind,
    dtype: Dtype,
    job: J,
) -> Result<J::Output, Box<dyn std::error::Error>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    use burn::tensor::f16;
    match (backend, dtype) {
        (BackendKind::Flex | BackendKind::Ndarray, _) => Err(NotCubecl(backend).into()),
        #[cfg(feature = "wgpu")]
        (BackendKind::Wgpu, Dtype::F32) => {
            Ok(job.run::<burn::backend::Wgpu<f32>>(&Default::default()))
        }
        #[cfg(feature = "wgpu")]
        (BackendKind::Wgpu, Dtype::F16) => {
            Ok(job.run::<burn::backend::Wgpu<f16>>(&Default::default()))
        }
        #[cfg(feature = "cuda")]
        (BackendKind::Cuda, Dtype::F32) => {
            Ok(job.run::<burn::backend::Cuda<f32>>(&burn::backend::cuda::CudaDevice::new(0)))
        }
        #[cfg(feature = "cuda")]
        (BackendKind::Cuda, Dtype::F16) => {
            Ok(job.run::<burn::backend::Cuda<f16>>(&burn::backend::cuda::CudaDevice::new(0)))
        }
        #[allow(unreachable_patterns)]
        (backend, _) => Err(BackendMissing(backend).into()),
    }
}
