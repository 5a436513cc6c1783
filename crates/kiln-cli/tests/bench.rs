//! `kiln bench kernels`: one-line errors where it cannot run. (The measurements themselves need
//! a wgpu or CUDA build; the kernels' correctness is tested in kiln-kernels.)

mod common;

use common::assert_one_line_error;

#[test]
fn kernel_benchmarks_refuse_a_cpu_backend() {
    assert_one_line_error(
        &["bench", "kernels", "--backend", "flex"],
        "kernel benchmarks need a CubeCL backend (--backend wgpu or cuda)",
    );
}

#[test]
fn kernel_benchmarks_name_the_missing_feature() {
    // This test binary is built without the `cuda` feature.
    assert_one_line_error(
        &["bench", "kernels", "--backend", "cuda"],
        "backend cuda is not compiled in; rebuild with `--features cuda`",
    );
}
