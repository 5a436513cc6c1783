//! `kiln bench kernels`: every CubeCL kernel next to the Burn composite it replaces.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kiln_bench::kernels::{Measurement, Sizes, Timing};
use kiln_kernels::KernelBackend;
use kiln_kernels::cube::tune::Tunable;

use super::cubecl::{CubeJob, Dtype, dispatch, write_json};
use crate::backend::BackendKind;

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
    let results = dispatch(
        args.backend,
        args.dtype,
        Kernels {
            sizes: &sizes,
            timing,
        },
    )?;
    print!("{}", kiln_bench::kernels::table(&results));
    if let Some(path) = args.json {
        let fields = serde_json::json!({ "sizes": sizes, "results": results });
        write_json(&path, args.backend, args.dtype, fields)?;
    }
    Ok(())
}

/// The kernel benchmark at `sizes`.
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
struct Kernels<'a> {
    sizes: &'a Sizes,
    timing: Timing,
}

impl CubeJob for Kernels<'_> {
    type Output = Vec<Measurement>;

    fn run<B: KernelBackend + Tunable>(self, device: &B::Device) -> Self::Output {
        kiln_bench::kernels::run::<B>(device, self.sizes, self.timing)
    }
}
