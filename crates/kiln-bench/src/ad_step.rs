//! The Algorithm Distillation training step as the benchmarks run it: `Single` on one device, in
//! f32, with the guards, or in a lower precision, with the fused AdamW; and its kernel launches
//! and host synchronisations per step, counted on any CubeCL runtime ([`crate::launches`]).

use std::sync::OnceLock;

use burn::tensor::FloatDType;
use burn::tensor::backend::AutodiffBackend;
use kiln_ad::config::AdConfig;
use kiln_ad::dataset::{AdBatch, WindowBatcher, WindowDataset, WindowRef};
use kiln_ad::model::AdTransformer;
use kiln_ad::train::{Data, generate};
use kiln_core::data::{DataSource, EpochSampler};
use kiln_core::optim::{MixedPrecision, PerformanceConfig, PerformanceOptimizer, Precision};
use kiln_core::strategy::{Single, SingleConfig, Strategy};
use kiln_kernels::{FusedAdamWConfig, KernelBackend, LowCopies};

use crate::launches::{self, Counts, Launch};

/// The learning rate of every benchmarked step.
pub const LR: f64 = 1e-3;

/// Which step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The plain step in f32.
    Single,
    /// With the PerformanceOptimizer's global-norm clipping (and its NaN check).
    Guarded,
    /// In a lower precision with f32 master weights.
    Precision(Precision),
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Variant::Single => f.write_str("single"),
            Variant::Guarded => f.write_str("guarded (clip_norm 1.0)"),
            Variant::Precision(p) => write!(f, "{p}"),
        }
    }
}

/// The source's learning histories, generated once per process: every runner and round trains
/// on the same data, and generating it is not what is measured.
pub fn histories(config: &AdConfig) -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| generate(config).expect("default config"))
}

/// The AD data set as Kiln reads it, its features in `dtype` (the compute dtype, as
/// `kiln ad train` batches them).
pub fn source<B: AutodiffBackend>(
    config: &AdConfig,
    dtype: FloatDType,
) -> DataSource<B, WindowRef, AdBatch<B>> {
    let data = histories(config);
    let context = config.model.context;
    DataSource::new(
        WindowDataset::new(data.histories.clone(), context).expect("default context"),
        WindowBatcher::new(data.histories.clone(), context).with_features_dtype(dtype),
    )
}

/// The first `count` global batches of the AD data set, seeded.
pub fn batches(config: &AdConfig, count: usize) -> Vec<Vec<usize>> {
    let data = histories(config);
    let windows = data.histories.count() * (data.histories.len() - config.model.context + 1);
    EpochSampler::new(windows, config.train.batch, 7)
        .expect("sampler")
        .batches()
        .take(count)
        .collect()
}

/// The strategy of `variant` on `device`: `Single` over the AD model in one thread, with the
/// fused AdamW.
pub fn strategy<B>(
    config: &AdConfig,
    variant: Variant,
    device: &B::Device,
) -> Box<dyn Strategy<B, MixedPrecision<B, AdTransformer<B>>>>
where
    B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend,
{
    B::seed(device, 1);
    let model = config.model.init::<B>(&config.env, device);
    let single = SingleConfig {
        grad_accumulation: 1,
        threads_per_rank: Some(1),
    };
    let optim = FusedAdamWConfig::new().init::<B, _>();
    let dtype = match variant {
        Variant::Precision(precision) => precision.dtype(),
        Variant::Single | Variant::Guarded => FloatDType::F32,
    };
    let source = source::<B>(config, dtype);
    let on = device.clone();
    match variant {
        Variant::Single => Box::new(
            Single::new(
                MixedPrecision::new(model, Precision::F32),
                optim,
                source,
                on,
                single,
            )
            .expect("single"),
        ),
        // One rank and the fused AdamW, as `fit` sets them up: the gradients reach it uncast,
        // and it leaves the next step's compute-dtype parameters as it steps.
        Variant::Precision(precision) => {
            let copies = LowCopies::new(precision.dtype());
            copies.set_on(true);
            let model = MixedPrecision::new(model, precision)
                .with_low_precision_grads()
                .with_low_copies(copies.clone());
            let optim = optim.with_low_copies(copies);
            Box::new(Single::new(model, optim, source, on, single).expect("single"))
        }
        Variant::Guarded => {
            let guards = PerformanceConfig::new().with_clip_norm(Some(1.0));
            let optim = PerformanceOptimizer::new(optim, guards).expect("valid guards");
            Box::new(
                Single::new(
                    MixedPrecision::new(model, Precision::F32),
                    optim,
                    source,
                    on,
                    single,
                )
                .expect("single"),
            )
        }
    }
}

/// What [`count`] saw.
#[derive(Debug, Clone)]
pub struct StepCounts {
    /// Launches and host synchronisations of each counted step.
    pub per_step: Vec<Counts>,
    /// The last step's launches, in order.
    pub last: Vec<Launch>,
}

impl StepCounts {
    /// The most launches of a counted step.
    pub fn most_launches(&self) -> u64 {
        self.per_step.iter().map(|c| c.launches).max().unwrap_or(0)
    }

    /// The fewest and most of `f` over the counted steps.
    pub fn range(&self, f: fn(&Counts) -> u64) -> (u64, u64) {
        let values = self.per_step.iter().map(f);
        (values.clone().min().unwrap_or(0), values.max().unwrap_or(0))
    }
}

/// The launches and host synchronisations of `steps` steps of `variant` on `device`, after two
/// warm-up steps. Needs [`launches::install`]'s subscriber, and counts every thread's
/// launches: nothing else may run on the device meanwhile.
pub fn count<B>(config: &AdConfig, variant: Variant, steps: usize, device: &B::Device) -> StepCounts
where
    B: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend,
{
    let mut strategy = strategy::<B>(config, variant, device);
    let taken = steps + 2;
    let mut per_step = Vec::new();
    for (i, batch) in batches(config, taken).iter().enumerate() {
        launches::record(i + 1 == taken);
        let counts =
            launches::measure_step::<B, _, _>(device, || strategy.step(batch, LR)).expect("step");
        launches::record(false);
        if i >= 2 {
            per_step.push(counts);
        }
    }
    StepCounts {
        per_step,
        last: launches::take_log(),
    }
}
