//! Kernel launches per training step and cubes per reduction, counted on wgpu (lavapipe in CI):
//! counts, not timings, so they hold on a shared machine. A change that launches more kernels
//! per step, or sums a large tensor on a few cubes, fails here.
//!
//! The counts are CubeCL's, the same on CUDA but for two things wgpu does differently: it binds
//! at most 31 buffers to a launch, so the fused AdamW and the multi-tensor casts run in 3 and 2
//! launches where CUDA runs one, and lavapipe has no bf16 (f16 stands for it).
//!
//! One test function: the counter is process-wide, so nothing may run beside it.

use burn::backend::Autodiff;
use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use kiln_ad::config::AdConfig;
use kiln_bench::ad_step::{Variant, count};
use kiln_bench::launches::{self, Launch};
use kiln_bench::llm_step;
use kiln_core::optim::Precision;
use kiln_kernels::ops;

type Plain = CubeBackend<WgpuRuntime, f32, i32, u32>;
type Fused = burn_fusion::Fusion<Plain>;

/// Launches per AD step (batch 32), on the plain CubeCL backend and under Burn's fusion.
/// Measured 2026-11-28 before this work: 149 single, 231 guarded, 228 in f16. In f16 the
/// cross-entropy reads the logits as they are (no cast of them, nor of their gradient):
/// 125 → 123, 120 → 118 on 2026-11-29. With the residual adds and the feed-forward's ReLU in
/// their linear layers' epilogues (one launch after each matmul), 6 fewer each (same day).
/// The loss's mean and the position table's gradient on Kiln's column sum (many cubes), the
/// mean's gradient one broadcast scalar: 2 fewer on the plain backend (same day). The flat
/// buffers' segments as views with their padding (Burn's slice copied the head's 5-value bias
/// after every AdamW step and every multi-tensor cast): 1 fewer, 3 in f16. In f16, the
/// features batched in f16 on the host and the gradients handed to the fused AdamW uncast (it
/// widens them itself): 3 fewer. Under fusion, the f16 parameters are the fused AdamW's own
/// copies, written as it steps from the last step's flat output (the cast's 2 launches gone,
/// and the AdamW binds one buffer for all parameters: 2 launches on wgpu instead of 3). bf16
/// (f16 on lavapipe) now launches fewer than f32 under fusion.
const BUDGETS: [(Variant, u64, u64); 3] = [
    (Variant::Single, 107, 104),
    (Variant::Guarded, 110, 107),
    (Variant::Precision(Precision::F16), 109, 103),
];

/// A reduction's first launch (the one that reads the large input) must run on this many cubes.
const MIN_CUBES: u64 = 32;

fn device() -> WgpuDevice {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // SAFETY: set before any thread reads the environment.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
    WgpuDevice::Cpu
}

/// The launches `run` makes on `device`, after it and everything before it finished.
fn launches_of<B: Backend>(device: &B::Device, run: impl FnOnce()) -> Vec<Launch> {
    B::sync(device).unwrap();
    launches::take_log();
    launches::record(true);
    run();
    B::sync(device).unwrap();
    launches::record(false);
    launches::take_log()
}

fn check_budgets(config: &AdConfig) {
    let device = device();
    for (variant, plain, fused) in BUDGETS {
        let got = count::<Autodiff<Plain>>(config, variant, 1, &device).most_launches();
        assert!(
            got <= plain,
            "{variant} on wgpu: {got} launches per step, over the budget of {plain}"
        );
        let got = count::<Autodiff<Fused>>(config, variant, 1, &device).most_launches();
        assert!(
            got <= fused,
            "{variant} on fused wgpu: {got} launches per step, over the budget of {fused}"
        );
    }
}

/// The cubes of the first launch of Kiln's column sum in `log` (the one that reads the large
/// input), 0 when there is none.
fn first_column_sum_cubes(log: &[Launch]) -> u64 {
    log.iter()
        .find(|l| l.short_name() == "ColumnPartialsKernel")
        .and_then(|l| l.cubes)
        .unwrap_or(0)
}

/// Every column reduction of a backward reads its large input on at least `MIN_CUBES` cubes,
/// and none of them is Burn's `sum_dim` (one unit per column).
fn check_reductions() {
    type Ad = Autodiff<Plain>;
    let device = device();
    let shapes = [(30_720, 5), (3840, 64), (3840, 256)];
    for (rows, cols) in shapes {
        let x = Tensor::<Ad, 2>::random([rows, 16], Distribution::Default, &device).require_grad();
        let w = Tensor::<Ad, 2>::random([16, cols], Distribution::Default, &device).require_grad();
        let b = Tensor::<Ad, 1>::zeros([cols], &device).require_grad();
        let y = ops::linear(x, w, Some(b.clone())).unwrap();
        let log = launches_of::<Ad>(&device, || {
            let grads = y.sum().backward();
            b.grad(&grads).unwrap();
        });
        let sums: Vec<&Launch> = log
            .iter()
            .filter(|l| l.short_name() == "ColumnPartialsKernel")
            .collect();
        assert!(!sums.is_empty(), "{rows}x{cols}: no column sum in {log:?}");
        assert!(
            sums[0].cubes.unwrap_or(0) >= MIN_CUBES,
            "{rows}x{cols}: the bias's gradient read on {:?} cubes",
            sums[0].cubes
        );
        assert!(
            log.iter().all(|l| l.short_name() != "ReduceKernel"),
            "{rows}x{cols}: a reduction of Burn's in {log:?}"
        );
    }
    let x = Tensor::<Ad, 2>::random([4096, 576], Distribution::Default, &device).require_grad();
    let gamma = Tensor::<Ad, 1>::ones([576], &device).require_grad();
    let y = ops::rms_norm(x, gamma.clone(), 1e-5).unwrap();
    let log = launches_of::<Ad>(&device, || {
        let grads = y.sum().backward();
        gamma.grad(&grads).unwrap();
    });
    assert!(
        first_column_sum_cubes(&log) >= MIN_CUBES,
        "RMSNorm's dγ over 4096 rows: {log:?}"
    );
}

/// The AD step at batch 256 (30,720 positions) runs none of Burn's reductions (one unit per
/// output without autotune: its loss's mean ran on one cube, the position table's gradient on
/// 30) and no matmul on fewer than `MIN_CUBES` cubes, and each of Kiln's column sums that reads
/// more than `SMALL` values runs on `MIN_CUBES`.
fn check_step_reductions() {
    let device = device();
    let mut config = AdConfig::default();
    config.train.batch = 256;
    let step = count::<Autodiff<Fused>>(&config, Variant::Single, 1, &device).last;
    let burns: Vec<&Launch> = step
        .iter()
        .filter(|l| l.short_name().contains("Reduce") || l.short_name().contains("SharedSum"))
        .collect();
    assert!(
        burns.is_empty(),
        "Burn's reductions in the AD step: {burns:?}"
    );
    // Nor a product on a handful of cubes: the weights' gradients (64 × 64 over 15,360 rows,
    // one cube each as Burn's matmul tiles them) are cut along their rows (`split_k`).
    let narrow: Vec<&Launch> = step
        .iter()
        .filter(|l| l.short_name() == "MatmulEntry" && l.cubes.unwrap_or(0) < MIN_CUBES)
        .collect();
    assert!(
        narrow.is_empty(),
        "products on few cubes in the AD step: {narrow:?}"
    );
    // The mean (30,720 values in one column) and the table's gradient (256 rows of 7,680).
    type Ad = Autodiff<Plain>;
    let losses = Tensor::<Ad, 1>::random([30_720], Distribution::Default, &device).require_grad();
    let log = launches_of::<Ad>(&device, || {
        ops::mean(losses.clone()).into_scalar();
    });
    assert!(
        log.first().and_then(|l| l.cubes).unwrap_or(0) >= MIN_CUBES,
        "the mean of 30,720 losses: {log:?}"
    );
    // The LLM's loss sums each sequence over its tokens: 8 sequences of 2,048.
    let tokens = Tensor::<Ad, 2>::random([8, 2048], Distribution::Default, &device);
    let log = launches_of::<Ad>(&device, || {
        ops::column_sum(tokens.clone().transpose()).into_data();
    });
    assert!(
        log.first().and_then(|l| l.cubes).unwrap_or(0) >= MIN_CUBES
            && log.iter().all(|l| l.short_name() == "ColumnPartialsKernel"),
        "8 sequences' sums over 2,048 tokens: {log:?}"
    );
    let table = Tensor::<Ad, 1>::random([7680], Distribution::Default, &device).require_grad();
    let y = ops::broadcast_rows(table.clone(), 256);
    let log = launches_of::<Ad>(&device, || {
        let grads = y.sum().backward();
        table.grad(&grads).unwrap();
    });
    assert!(
        first_column_sum_cubes(&log) >= MIN_CUBES,
        "a broadcast table's gradient over 256 rows: {log:?}"
    );
}

/// Launches per decoder layer of the LoRA or QLoRA fine-tuning step on `B`, in f32 at the
/// test's batch.
fn llm_launches_per_layer<B>(four_bit: bool) -> u64
where
    B: burn::tensor::backend::AutodiffBackend<
            InnerBackend: kiln_nn::tensor_parallel::ShardedBackend,
            Device = WgpuDevice,
        > + kiln_nn::tensor_parallel::ShardedBackend,
{
    let step = llm_step::LlmStep {
        four_bit,
        ..Default::default()
    };
    llm_step::per_layer::<B>(step, &device()).unwrap().per_layer
}

/// Launches per decoder layer of the LLM step (rank-8 adapters on all seven projections, f32,
/// grouped-query attention): LoRA, then QLoRA, on the plain CubeCL backend and under Burn's
/// fusion. First counted 2026-11-28 at 207 and 186 (plain); then 180 and 166 with the fused
/// AdamW; then 118 / 103 and 104 / 91 (plain / fused) with Kiln's RMSNorm (no gain gradient when
/// frozen), RoPE as one op whose backward is a rotation (no concatenation, no scatter) and
/// attention reading shared key heads in place; now with the adapter's term in its product's
/// residual epilogue and no multiply by a scale of 1 in QLoRA's backward: under fusion, well
/// under half the first counts.
const LLM_LAYER_BUDGETS: [(bool, u64, u64); 2] = [(false, 104, 91), (true, 90, 77)];

fn check_llm_layers() {
    for (four_bit, plain, fused) in LLM_LAYER_BUDGETS {
        let name = if four_bit { "QLoRA" } else { "LoRA" };
        for (backend, got, budget) in [
            (
                "wgpu",
                llm_launches_per_layer::<Autodiff<Plain>>(four_bit),
                plain,
            ),
            (
                "fused wgpu",
                llm_launches_per_layer::<Autodiff<Fused>>(four_bit),
                fused,
            ),
        ] {
            assert!(
                got <= budget,
                "the {name} step on {backend} launches {got} kernels per decoder layer, over \
                 the budget of {budget}"
            );
        }
    }
}

#[test]
fn steps_and_reductions_stay_within_their_launches_and_cubes() {
    launches::install().expect("this test binary installs the only subscriber");
    check_llm_layers();
    check_reductions();
    check_step_reductions();
    check_budgets(&AdConfig::default());
}
