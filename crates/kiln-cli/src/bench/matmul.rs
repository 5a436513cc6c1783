//! `kiln bench matmul`: cubek's matmul strategies at Kiln's products, next to Burn's default.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kiln_bench::kernels::Timing;
use kiln_bench::matmul::{Product, Row, best, products, sweep};
use kiln_kernels::KernelBackend;
use kiln_kernels::cube::matmul::MatmulStrategies;

use super::cubecl::{CubeJob, Dtype, dispatch, write_json};
use crate::backend::BackendKind;

/// Options of `kiln bench matmul`.
#[derive(Args, Debug)]
pub struct MatmulArgs {
    /// A CubeCL backend: wgpu (any Vulkan / Metal / DX12 device, lavapipe on a CPU) or cuda.
    #[arg(long, default_value = "wgpu")]
    backend: BackendKind,
    /// Float type of both operands and the output.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: Dtype,
    /// Only the products whose name contains one of these (comma-separated), e.g. `llm,ad`.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Time each strategy for at least this many milliseconds (and 5 calls).
    #[arg(long, default_value_t = 50)]
    min_ms: u64,
    /// Also write every row as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Runs `kiln bench matmul`.
pub fn run(args: MatmulArgs) -> Result<(), Box<dyn std::error::Error>> {
    let _claim = crate::outputs::check_files(&[("--json", args.json.as_deref())])?;
    let products: Vec<Product> = products()
        .into_iter()
        .filter(|p| args.only.is_empty() || args.only.iter().any(|o| p.name.contains(o.as_str())))
        .collect();
    let timing = Timing {
        warmup: 1,
        min_time: Duration::from_millis(args.min_ms),
        ..Timing::default()
    };
    let rows = dispatch(
        args.backend,
        args.dtype,
        Sweep {
            products: &products,
            timing,
        },
    )?;
    println!("\nfastest per product (speed-up over Burn's default):");
    for row in best(&rows) {
        println!("{}", row.line());
    }
    if let Some(path) = args.json {
        write_json(
            &path,
            args.backend,
            args.dtype,
            serde_json::json!({ "rows": rows }),
        )?;
    }
    Ok(())
}

/// The sweep over `products`, each row printed as it is measured.
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
struct Sweep<'a> {
    products: &'a [Product],
    timing: Timing,
}

impl CubeJob for Sweep<'_> {
    type Output = Vec<Row>;

    fn run<B: KernelBackend + MatmulStrategies>(self, device: &B::Device) -> Self::Output {
        sweep::<B>(device, self.products, self.timing, |row| {
            println!("{}", row.line())
        })
    }
}
