//! Bucketed vs one-call-per-parameter gradient all-reduce, 2 in-process ranks, on a model of
//! 100 parameter tensors (an MLP of 50 small Linear layers). Both variants run the same code;
//! only the bucket cap differs (25 MiB: one bucket; 1 byte: a bucket per parameter).
//!
//! `cargo bench --bench collectives`

use std::marker::PhantomData;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use criterion::{Criterion, criterion_group, criterion_main};
use kiln::core::collective::InProcess;
use kiln::core::grads::{BucketPlan, ParamSelection, all_reduce_gradients};
use kiln::nn::models::{Mlp, MlpConfig};

type B = Autodiff<Flex>;

fn model() -> Mlp<B> {
    let device = Default::default();
    let model = MlpConfig::new()
        .with_hidden(16)
        .with_layers(49)
        .init::<B>(&device);
    model.fork(&device)
}

/// A gradient for every parameter, shaped like it (cheap: tensors are reference-counted).
fn fake_grads<M: Module<B>>(model: &M) -> GradientsParams {
    struct Fill<Bk>(GradientsParams, PhantomData<Bk>);
    impl<Bk: AutodiffBackend> ModuleVisitor<Bk> for Fill<Bk> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
            self.0.register(param.id, param.val().inner());
        }
    }
    let mut fill = Fill::<B>(GradientsParams::new(), PhantomData);
    model.visit(&mut fill);
    fill.0
}

/// Time of `iters` gradient synchronisations over 2 ranks, each on its own thread.
fn sync_time(cap_bytes: usize, iters: u64) -> Duration {
    let model = model();
    let plan = BucketPlan::new(&model, cap_bytes, ParamSelection::Trainable);
    let handles =
        InProcess::<<B as AutodiffBackend>::InnerBackend>::group(2, Duration::from_secs(60));
    let start_line = Barrier::new(2);
    let times: Vec<Duration> = std::thread::scope(|s| {
        let jobs: Vec<_> = handles
            .into_iter()
            .map(|mut collective| {
                let (model, plan, start_line) = (model.clone(), &plan, &start_line);
                s.spawn(move || {
                    let device = Default::default();
                    start_line.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        let grads = fake_grads(&model);
                        let (grads, _) = all_reduce_gradients(
                            &model,
                            grads,
                            plan,
                            &mut collective,
                            &device,
                            &[],
                        )
                        .unwrap();
                        // Force the lazy result, as an optimizer would read it.
                        std::hint::black_box(grads.len());
                    }
                    start.elapsed()
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    times.into_iter().max().unwrap()
}

fn bench(c: &mut Criterion) {
    let plan = BucketPlan::new(&model(), 25 << 20, ParamSelection::Trainable);
    let per_param = BucketPlan::new(&model(), 1, ParamSelection::Trainable);
    assert_eq!(plan.num_params(), 100);
    let mut group = c.benchmark_group(format!(
        "gradient all-reduce, 2 ranks, {} tensors, {} floats",
        plan.num_params(),
        plan.bucket_elements().iter().sum::<usize>()
    ));
    group.bench_function(format!("bucketed ({} call)", plan.num_buckets()), |b| {
        b.iter_custom(|iters| sync_time(25 << 20, iters))
    });
    group.bench_function(
        format!("per parameter ({} calls)", per_param.num_buckets()),
        |b| b.iter_custom(|iters| sync_time(1, iters)),
    );
    group.finish();

    // The side-by-side ratio, from one more interleaved measurement.
    let (mut bucketed, mut separate) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..5 {
        bucketed += sync_time(25 << 20, 200);
        separate += sync_time(1, 200);
    }
    println!(
        "bucketed {:.1} µs/sync, per-parameter {:.1} µs/sync: bucketed is {:.2}x faster (target >= 2x)",
        bucketed.as_secs_f64() * 1e6 / 1000.0,
        separate.as_secs_f64() * 1e6 / 1000.0,
        separate.as_secs_f64() / bucketed.as_secs_f64()
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
