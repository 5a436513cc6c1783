//! `kiln bench kernels`: every CubeCL kernel next to the Burn composite it replaces.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use kiln_bench::kernels::{Measurement, Sizes, Timing};

use crate::backend::{BackendKind, BackendMissing};

/// The float type the kernels run in.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Dtype {
    /// 32-bit floats.
    F32,
    /// 16-bit floats (f32 accumulation inside the kernels).
    F16,
}

/// Options of `kiln bench kernels`.
#[derive(Args, Debug)]
pub struct KernelArgs {
    /// A CubeCL backend: wgpu (any Vulkan / Metal / DX12 device, lavapipe on a CPU) or cuda.
    #[arg(long, default_value = "wgpu")]
    backend: BackendKind,
    /// Float type of the activations and adapters.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: Dtype,
    /// GPU sizes (QLoRA at M = 1, 16, 256, 4096 with K = N = 4096; fused ops over 4096²
    /// values) instead of sizes a CPU driver finishes in a minute.
    #[arg(long)]
    full: bool,
    /// Time each variant for at least this many milliseconds (and 5 calls).
    #[arg(long, default_value_t = 300)]
    min_ms: u64,
    /// Also write the measurements as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Runs `kiln bench kernels`.
pub fn run(args: KernelArgs) -> Result<(), Box<dyn std::error::Error>> {
    let _claim = crate::outputs::check_files(&[("--json", args.json.as_deref())])?;
    let sizes = if args.full {
        Sizes::full()
    } else {
        Sizes::quick()
    };
    let timing = Timing {
        min_time: Duration::from_millis(args.min_ms),
        ..Timing::default()
    };
    let results = measure(args.backend, args.dtype, &sizes, timing)?;
    print!("{}", kiln_bench::kernels::table(&results));
    if let Some(path) = args.json {
        let json = serde_json::json!({
            "backend": args.backend.to_string(),
            "dtype": format!("{:?}", args.dtype).to_lowercase(),
            "sizes": sizes,
            "results": results,
        });
        crate::outputs::write(
            "--json",
            &path,
            serde_json::to_string_pretty(&json)?.as_bytes(),
        )?;
    }
    Ok(())
}

/// Kernels run only on CubeCL backends.
#[derive(Debug, thiserror::Error)]
#[error(
    "kernel benchmarks need a CubeCL backend (--backend wgpu or cuda); {0} runs the plain-Burn \
     reference, which is what the kernels are measured against"
)]
pub struct NotCubecl(pub BackendKind);

// Without the `wgpu` and `cuda` features every arm is an error and the sizes go unused.
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(unused_variables))]
fn measure(
    backend: BackendKind,
    dtype: Dtype,
    sizes: &Sizes,
    timing: Timing,
) -> Result<Vec<Measurement>, Box<dyn std::error::Error>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    use {burn::tensor::f16, kiln_bench::kernels::run};
    match (backend, dtype) {
        (BackendKind::Flex | BackendKind::Ndarray, _) => Err(NotCubecl(backend).into()),
        #[cfg(feature = "wgpu")]
        (BackendKind::Wgpu, Dtype::F32) => Ok(run::<burn::backend::Wgpu<f32>>(
            &Default::default(),
            sizes,
            timing,
        )),
        #[cfg(feature = "wgpu")]
        (BackendKind::Wgpu, Dtype::F16) => Ok(run::<burn::backend::Wgpu<f16>>(
            &Default::default(),
            sizes,
            timing,
        )),
        #[cfg(feature = "cuda")]
        (BackendKind::Cuda, Dtype::F32) => Ok(run::<burn::backend::Cuda<f32>>(
            &burn::backend::cuda::CudaDevice::new(0),
            sizes,
            timing,
        )),
        #[cfg(feature = "cuda")]
        (BackendKind::Cuda, Dtype::F16) => Ok(run::<burn::backend::Cuda<f16>>(
            &burn::backend::cuda::CudaDevice::new(0),
            sizes,
            timing,
        )),
        #[allow(unreachable_patterns)]
        (backend, _) => Err(BackendMissing(backend).into()),
    }
}
