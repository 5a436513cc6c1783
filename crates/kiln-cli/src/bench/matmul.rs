//! `kiln bench matmul`: cubek's matmul strategies at Kiln's products, next to Burn's default,
//! and what Kiln's matmul tuner would choose among them and costs.

use std::path::PathBuf;
use std::time::Duration;

use burn::tensor::DType;
use clap::Args;
use kiln_bench::kernels::Timing;
use kiln_bench::matmul::{Product, Row, TunerCost, best, products, shortlisted, sweep, tuner_cost};
use kiln_kernels::KernelBackend;
use kiln_kernels::cube::tune::Tunable;

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
    let (rows, tuner) = dispatch(
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
    let dtype = match args.dtype {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
    };
    println!("\nthe tuner's choice per product (its shortlist, 10 % over Burn's default):");
    for p in &products {
        if let Some(row) = shortlisted(&rows, p, dtype) {
            println!("{}", row.line());
        }
    }
    println!(
        "\nthe tuner's cost: a first run timed {} products in {:.2} s; a second read {} \
         choices in {:.1} ms",
        tuner.timed,
        tuner.first_seconds,
        tuner.loaded,
        tuner.second_seconds * 1e3
    );
    if let Some(path) = args.json {
        write_json(
            &path,
            args.backend,
            args.dtype,
            serde_json::json!({ "rows": rows, "tuner": tuner }),
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
    type Output = (Vec<Row>, TunerCost);

    fn run<B: KernelBackend + Tunable>(self, device: &B::Device) -> Self::Output {
        let rows = sweep::<B>(device, self.products, self.timing, |row| {
            println!("{}", row.line())
        });
        (rows, tuner_cost::<B>(device, self.products))
    }
}
