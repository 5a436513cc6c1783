//! The matmul tuner (`kiln_kernels::cube::tune`): each product bucket is timed once per device
//! and its choice kept in the cache folder for later runs; a spent budget leaves products to
//! Burn's default untimed; a chosen strategy gives Burn's result, on the plain backend and as a
//! queued kernel under fusion, for every transpose and the linear layer's epilogue; CPU devices
//! are left alone unless asked.
//!
//! Which strategy wins on lavapipe says nothing about a GPU, so the routed path is tested with
//! a choice written into the cache, as a previous run would have. One test function: the
//! tuner's settings and choices are process-wide.

mod common;

use std::path::Path;
use std::time::Duration;

use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, Tensor, TensorPrimitive};
use common::*;
use kiln_kernels::cube::matmul::MatmulStrategies;
use kiln_kernels::cube::tune::{self, CacheFile, Mode, Record, Settings, bucket, shortlist};
use kiln_kernels::{Epilogue, KernelBackend, Product, Transpose};

/// Products against the CPU's: f32 rounding, or TF32's on CUDA's tensor cores, which cubek's
/// tensor-core strategies (Burn's default among them) use for f32.
const TOL: f32 = if MATMUL_F32_TOL > 1e-5 {
    MATMUL_F32_TOL
} else {
    1e-5
};

/// A product of `[m, k]·[k, n]` in f32.
fn product(m: usize, k: usize, n: usize, transpose: Transpose) -> Product {
    Product {
        m,
        k,
        n,
        transpose,
        dtype: DType::F32,
    }
}

/// The operands' shapes as stored.
fn stored(p: &Product) -> ([usize; 2], [usize; 2]) {
    match p.transpose {
        Transpose::Neither => ([p.m, p.k], [p.k, p.n]),
        Transpose::Lhs => ([p.k, p.m], [p.k, p.n]),
        Transpose::Rhs => ([p.m, p.k], [p.n, p.k]),
    }
}

/// Seeded operands of `p` as stored, on the CPU reference and on `B`.
fn operands(p: &Product, seed: u64) -> [(Vec<f32>, [usize; 2]); 2] {
    let (l, r) = stored(p);
    [
        (values(l[0] * l[1], 1.0, seed, false), l),
        (values(r[0] * r[1], 1.0, seed + 1, false), r),
    ]
}

fn prim<B: KernelBackend>((v, shape): &(Vec<f32>, [usize; 2])) -> FloatTensor<B> {
    tensor::<B, 2>(v, *shape, &Default::default())
        .into_primitive()
        .tensor()
}

fn read<B: KernelBackend>(t: FloatTensor<B>) -> Vec<f32> {
    to_vec(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t)))
}

/// `p` on the CPU with Burn's matmul.
fn reference(p: &Product, seed: u64) -> Vec<f32> {
    let [l, r] = operands(p, seed);
    let device = Default::default();
    let (l, r) = (
        tensor::<Cpu, 2>(&l.0, l.1, &device),
        tensor::<Cpu, 2>(&r.0, r.1, &device),
    );
    let out = match p.transpose {
        Transpose::Neither => l.matmul(r),
        Transpose::Lhs => l.transpose().matmul(r),
        Transpose::Rhs => l.matmul(r.transpose()),
    };
    to_vec(out)
}

/// `p` through `B`'s `KernelBackend::matmul`, checked against the reference.
fn check_product<B: KernelBackend>(what: &str, p: &Product, seed: u64) {
    let [l, r] = operands(p, seed);
    let got = read::<B>(B::matmul(prim::<B>(&l), prim::<B>(&r), p.transpose));
    assert_close(what, &got, &reference(p, seed), TOL);
}

/// `relu(x·w + b)` and `x·w + b + r` through `B`'s linear forward, against the reference.
fn check_linear<B: KernelBackend>(what: &str, p: &Product, seed: u64) {
    let [x, w] = operands(p, seed);
    let bias = values(p.n, 1.0, seed + 2, false);
    let residual = values(p.m * p.n, 1.0, seed + 3, false);
    let y = reference(p, seed);
    let plus_bias = |i: usize| y[i] + bias[i % p.n];
    let relu: Vec<f32> = (0..y.len()).map(|i| plus_bias(i).max(0.0)).collect();
    let res: Vec<f32> = (0..y.len()).map(|i| plus_bias(i) + residual[i]).collect();
    let b = || {
        tensor::<B, 1>(&bias, [p.n], &Default::default())
            .into_primitive()
            .tensor()
    };
    let got = B::linear_forward(prim::<B>(&x), prim::<B>(&w), Some(b()), Epilogue::Relu);
    assert_close(&format!("{what} relu"), &read::<B>(got), &relu, TOL);
    let r = prim::<B>(&(residual, [p.m, p.n]));
    let got = B::linear_forward(
        prim::<B>(&x),
        prim::<B>(&w),
        Some(b()),
        Epilogue::Residual(r),
    );
    assert_close(&format!("{what} residual"), &read::<B>(got), &res, TOL);
}

fn settings(mode: Mode, budget: Duration, dir: &Path) -> Settings {
    Settings {
        mode,
        budget,
        cache_dir: Some(dir.to_path_buf()),
    }
}

/// The device's cache file under `dir` (the one name the tuner gives lavapipe).
fn cache_file(dir: &Path) -> CacheFile {
    let files: Vec<_> = std::fs::read_dir(dir.join("matmul"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    assert_eq!(files.len(), 1, "one device, one file: {files:?}");
    let name = files[0].file_stem().unwrap().to_str().unwrap().to_owned();
    CacheFile::new(dir, &name)
}

#[test]
fn products_are_timed_once_kept_between_runs_and_run_their_choice() {
    let dir = std::env::temp_dir().join(format!("kiln-tune-test-{}", std::process::id()));
    let device = gpu();
    let long = Duration::from_secs(120);

    // A first run: a small product is timed once, with its shortlist, and recorded.
    tune::configure(settings(Mode::Always, long, &dir));
    let small = product(48, 80, 72, Transpose::Neither);
    check_product::<Gpu32>("timed", &small, 1);
    let stats = tune::stats();
    assert_eq!((stats.timed, stats.loaded), (1, 0), "{stats:?}");
    // Again, and with another shape of the same bucket: no more timing.
    check_product::<Gpu32>("again", &small, 2);
    check_product::<Gpu32>("same bucket", &product(40, 70, 100, Transpose::Neither), 3);
    assert_eq!(tune::stats().timed, 1);
    let file = cache_file(&dir);
    let (records, unreadable) = file.load().unwrap();
    assert_eq!((records.len(), unreadable), (1, 0));
    let record = &records[0];
    assert_eq!(record.product, bucket(&small));
    let names: Vec<String> = shortlist(&bucket(&small))
        .into_iter()
        .map(|c| c.name)
        .collect();
    let timed: Vec<String> = record.micros.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(timed, names);
    assert!(
        record.micros[0].1.is_some(),
        "Burn's default ran: {record:?}"
    );
    assert!(names.contains(&record.chosen), "{record:?}");

    // A later run reads the choice and times nothing.
    tune::configure(settings(Mode::Always, long, &dir));
    check_product::<Gpu32>("read back", &small, 4);
    let stats = tune::stats();
    assert_eq!((stats.timed, stats.loaded), (0, 1), "{stats:?}");

    // A choice other than Burn's default, as a GPU run would have written it: the skinny
    // products of a LoRA adapter on the unit kernel.
    let skinny = [
        product(64, 96, 8, Transpose::Neither),
        product(64, 96, 8, Transpose::Lhs),
        product(64, 96, 8, Transpose::Rhs),
    ];
    for p in &skinny {
        let key = bucket(p);
        let list = shortlist(&key);
        let record = Record {
            product: key,
            chosen: list[1].name.clone(),
            micros: list.iter().map(|c| (c.name.clone(), Some(1.0))).collect(),
        };
        file.append(&record).unwrap();
    }
    tune::configure(settings(Mode::Always, long, &dir));
    for (i, p) in skinny.iter().enumerate() {
        assert!(<Gpu32 as KernelBackend>::tuned_matmul(&device, p), "{p:?}");
        assert!(
            <Fused32 as KernelBackend>::tuned_matmul(&device, p),
            "{p:?}"
        );
        let seed = 10 + i as u64;
        // The chosen strategy itself runs these operands (the route falls back to Burn's
        // default where it cannot, which would test nothing).
        let [l, r] = operands(p, seed);
        let (l, r) = (prim::<Gpu32>(&l), prim::<Gpu32>(&r));
        let (l, r) = match p.transpose {
            Transpose::Neither => (l, r),
            Transpose::Lhs => (Gpu32::float_transpose(l), r),
            Transpose::Rhs => (l, Gpu32::float_transpose(r)),
        };
        let chosen = &shortlist(&bucket(p))[1];
        let out = Gpu32::matmul_with(l, r, chosen);
        assert!(out.is_ok(), "{} on {p:?}: {:?}", chosen.name, out.err());
        check_product::<Gpu32>(&format!("chosen {:?}", p.transpose), p, seed);
        check_product::<Fused32>(&format!("chosen fused {:?}", p.transpose), p, seed);
    }
    check_linear::<Gpu32>("chosen linear", &skinny[0], 20);
    check_linear::<Fused32>("chosen fused linear", &skinny[0], 20);
    let stats = tune::stats();
    assert_eq!((stats.timed, stats.loaded), (0, 4), "{stats:?}");

    // By default only CUDA devices are tuned: lavapipe runs Burn's default.
    tune::configure(settings(Mode::Auto, long, &dir));
    assert!(!<Fused32 as KernelBackend>::tuned_matmul(
        &device, &skinny[0]
    ));
    check_linear::<Fused32>("untuned fused linear", &skinny[0], 21);
    assert_eq!(tune::stats(), tune::Stats::default());

    // A spent budget times nothing, writes nothing, and still computes.
    let empty = dir.join("empty");
    tune::configure(settings(Mode::Always, Duration::ZERO, &empty));
    check_product::<Fused32>("no budget", &product(33, 65, 17, Transpose::Rhs), 30);
    let stats = tune::stats();
    assert_eq!((stats.timed, stats.over_budget), (0, 1), "{stats:?}");
    assert!(!empty.join("matmul").exists());

    tune::configure(Settings::off());
    std::fs::remove_dir_all(&dir).unwrap();
}
