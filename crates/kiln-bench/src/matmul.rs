//! cubek's matmul strategies at Kiln's own products, one row per product and strategy: the
//! time, the achieved TFLOP/s, the speed-up over Burn's default (what Kiln runs today) and the
//! result's distance from it; beside them, what Kiln's tuner (`kiln_kernels::cube::tune`)
//! would choose from its shortlist, and what its first run costs. Whether the shortlist holds
//! the winners is read off these rows on a GPU. Used by `kiln bench matmul`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorPrimitive};
use serde::Serialize;

use burn::tensor::{DType, Element};
use kiln_kernels::Transpose;
use kiln_kernels::cube::matmul::{Candidate, MatmulStrategies, candidates};
use kiln_kernels::cube::tune::{self, Mode, Settings, Stats, Tunable, bucket, pick, shortlist};

use crate::kernels::{Timing, time};

/// One product of a Kiln step, `[m, k]·[k, n]`.
#[derive(Clone, Debug, Serialize)]
pub struct Product {
    /// Where the product comes from.
    pub name: &'static str,
    /// Output rows.
    pub m: usize,
    /// The reduction.
    pub k: usize,
    /// Output columns.
    pub n: usize,
    /// `lhs` arrives as a transposed view (`xᵀ·dy`: a weight's gradient).
    pub lhs_t: bool,
    /// `rhs` arrives as a transposed view (`dy·wᵀ`: an input's gradient).
    pub rhs_t: bool,
}

impl Product {
    /// The product as the tuner keys it, in `dtype`.
    pub fn key(&self, dtype: DType) -> kiln_kernels::Product {
        let transpose = match (self.lhs_t, self.rhs_t) {
            (true, _) => Transpose::Lhs,
            (_, true) => Transpose::Rhs,
            _ => Transpose::Neither,
        };
        kiln_kernels::Product {
            m: self.m,
            k: self.k,
            n: self.n,
            transpose,
            dtype,
        }
    }
}

const fn product(name: &'static str, m: usize, k: usize, n: usize) -> Product {
    Product {
        name,
        m,
        k,
        n,
        lhs_t: false,
        rhs_t: false,
    }
}

/// The products of the steps Kiln's benchmarks time on a GPU, the users' first:
/// - the LoRA step of `kiln bench llm --size 100m` at batch 8 × 256 (2,048 rows; width 768,
///   4 of 12 heads for keys and values, SwiGLU width 2,048, 32,000 tokens, rank 16);
/// - one token of generation on that model;
/// - the AD step at batch 32 (1,920 rows of width 64, feed-forward 256).
pub fn products() -> Vec<Product> {
    let (rows, d, kv, ff, vocab, r) = (2048, 768, 256, 2048, 32_000, 16);
    let (ad_rows, ad_d, ad_ff) = (1920, 64, 256);
    vec![
        product("llm q, o", rows, d, d),
        product("llm k, v", rows, d, kv),
        product("llm gate, up", rows, d, ff),
        product("llm down", rows, ff, d),
        product("llm head", rows, d, vocab),
        product("llm lora x·A", rows, d, r),
        product("llm lora t·B", rows, r, d),
        Product {
            rhs_t: true,
            ..product("llm q input grad dy·Wᵀ", rows, d, d)
        },
        Product {
            lhs_t: true,
            ..product("llm lora A grad xᵀ·dt", d, rows, r)
        },
        Product {
            lhs_t: true,
            ..product("llm lora B grad tᵀ·dy", r, rows, d)
        },
        product("decode q", 1, d, d),
        product("decode head", 1, d, vocab),
        product("ad attention proj", ad_rows, ad_d, ad_d),
        product("ad ff up", ad_rows, ad_d, ad_ff),
        product("ad ff down", ad_rows, ad_ff, ad_d),
        Product {
            lhs_t: true,
            ..product("ad weight grad xᵀ·dy", ad_d, ad_rows, ad_d)
        },
    ]
}

/// One strategy on one product.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// [`Product::name`].
    pub product: &'static str,
    /// `[m, k, n]`.
    pub shape: [usize; 3],
    /// [`Product::lhs_t`].
    pub lhs_t: bool,
    /// [`Product::rhs_t`].
    pub rhs_t: bool,
    /// cubek's name of the strategy.
    pub strategy: String,
    /// Median seconds per product; `None` where the strategy did not run.
    pub seconds: Option<f64>,
    /// Burn's default's time over this one's (above 1: faster than what Kiln runs today).
    pub speedup: Option<f64>,
    /// `‖out − default‖ / ‖default‖`.
    pub rel_err: Option<f64>,
    /// Why the strategy did not run (cubek's setup error, or a panic).
    pub error: Option<String>,
}

impl Row {
    /// Achieved TFLOP/s.
    pub fn tflops(&self) -> Option<f64> {
        let [m, k, n] = self.shape;
        self.seconds.map(|s| 2.0 * (m * k * n) as f64 / s / 1e12)
    }

    /// The row as one line of the table.
    pub fn line(&self) -> String {
        let head = format!("{:<26} {:<60}", self.product, self.strategy);
        match (self.seconds, &self.error) {
            (Some(s), _) => format!(
                "{head} {:>9.4} ms {:>7.2} TFLOP/s {:>6.2}x  err {:.1e}",
                s * 1e3,
                self.tflops().unwrap_or(0.0),
                self.speedup.unwrap_or(0.0),
                self.rel_err.unwrap_or(f64::NAN)
            ),
            (None, Some(e)) => format!("{head} -- {}", e.chars().take(70).collect::<String>()),
            (None, None) => head,
        }
    }
}

fn operand<B: MatmulStrategies>(
    rows: usize,
    cols: usize,
    transposed: bool,
    device: &B::Device,
) -> Tensor<B, 2> {
    let uniform = Distribution::Uniform(-1.0, 1.0);
    if transposed {
        Tensor::random([cols, rows], uniform, device).transpose()
    } else {
        Tensor::random([rows, cols], uniform, device)
    }
}

fn run<B: MatmulStrategies>(
    lhs: &Tensor<B, 2>,
    rhs: &Tensor<B, 2>,
    candidate: &Candidate,
) -> Result<Tensor<B, 2>, String> {
    let (l, r) = (
        lhs.clone().into_primitive().tensor(),
        rhs.clone().into_primitive().tensor(),
    );
    match catch_unwind(AssertUnwindSafe(|| B::matmul_with(l, r, candidate))) {
        Ok(out) => out.map(|t| Tensor::from_primitive(TensorPrimitive::Float(t))),
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .map_or_else(|| "panicked".into(), |m| format!("panicked: {m}"))),
    }
}

fn host<B: MatmulStrategies>(t: Tensor<B, 2>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().expect("f32 data")
}

/// Times every strategy of [`candidates`] on each of `products`, calling `each` with every row
/// as it is measured (a long sweep prints as it goes), and returns the rows.
pub fn sweep<B: MatmulStrategies>(
    device: &B::Device,
    products: &[Product],
    timing: Timing,
    mut each: impl FnMut(&Row),
) -> Vec<Row> {
    let candidates = candidates();
    let mut rows = Vec::new();
    for p in products {
        let lhs = operand::<B>(p.m, p.k, p.lhs_t, device);
        let rhs = operand::<B>(p.k, p.n, p.rhs_t, device);
        let reference = run(&lhs, &rhs, &Candidate::burn_default()).map(host);
        let mut default_seconds = None;
        for candidate in &candidates {
            let mut row = Row {
                product: p.name,
                shape: [p.m, p.k, p.n],
                lhs_t: p.lhs_t,
                rhs_t: p.rhs_t,
                strategy: candidate.name.clone(),
                seconds: None,
                speedup: None,
                rel_err: None,
                error: None,
            };
            match run(&lhs, &rhs, candidate) {
                Err(e) => row.error = Some(e),
                Ok(out) => {
                    if let Ok(reference) = &reference {
                        row.rel_err = Some(relative_error(&host(out), reference));
                    }
                    let seconds = time_queued::<B>(device, timing, || {
                        let _ = run(&lhs, &rhs, candidate);
                    });
                    let default = *default_seconds.get_or_insert(seconds);
                    row.seconds = Some(seconds);
                    row.speedup = Some(default / seconds);
                }
            }
            each(&row);
            rows.push(row);
        }
    }
    rows
}

/// Median seconds of one call of `f`, queued back to back between synchronisations: the
/// products of a step follow one another on the device without waiting for the host, so a
/// host synchronisation after each (microseconds on a GPU) would drown the small ones. Each
/// sample queues enough calls to last about a millisecond, by a first synchronised timing.
fn time_queued<B: Backend>(device: &B::Device, timing: Timing, mut f: impl FnMut()) -> f64 {
    let once = Timing {
        min_iters: 1,
        min_time: Duration::ZERO,
        ..timing
    };
    let one = time::<B>(device, once, &mut f);
    let queued = (1e-3 / one.max(1e-7)).clamp(1.0, 256.0) as usize;
    // Warm already: every sample from the first is timed.
    let samples = Timing {
        warmup: 0,
        ..timing
    };
    let batch = time::<B>(device, samples, || {
        for _ in 0..queued {
            f();
        }
    });
    batch / queued as f64
}

fn relative_error(out: &[f32], reference: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        diff += (o as f64 - r as f64).powi(2);
        norm += (r as f64).powi(2);
    }
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// Per product, the fastest strategy that ran and its speed-up over Burn's default.
pub fn best(rows: &[Row]) -> Vec<&Row> {
    let mut best: Vec<&Row> = Vec::new();
    for row in rows.iter().filter(|r| r.seconds.is_some()) {
        match best.iter_mut().find(|b| b.product == row.product) {
            Some(b) if row.seconds < b.seconds => *b = row,
            Some(_) => {}
            None => best.push(row),
        }
    }
    best
}

/// The row of `product` the tuner would choose from `rows` (a sweep in `dtype`): the fastest
/// of its shortlist if it beats Burn's default by the tuner's margin, else the default's.
pub fn shortlisted<'a>(rows: &'a [Row], product: &Product, dtype: DType) -> Option<&'a Row> {
    let list = shortlist(&bucket(&product.key(dtype)));
    let ran = |name: &str| {
        rows.iter()
            .find(|r| r.product == product.name && r.strategy == name && r.seconds.is_some())
    };
    let micros: Vec<(String, Option<f64>)> = list
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                ran(&c.name).and_then(|r| r.seconds).map(|s| s * 1e6),
            )
        })
        .collect();
    let chosen = pick(&list, &micros).map_or_else(|| list[0].name.clone(), |c| c.name);
    ran(&chosen)
}

/// What the tuner's first run costs on `products`, and a later run's reading of its cache.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct TunerCost {
    /// Products timed by a first run (an empty cache).
    pub timed: usize,
    /// Seconds the first run spent choosing.
    pub first_seconds: f64,
    /// Choices a second run read from the cache.
    pub loaded: usize,
    /// Seconds the second run spent choosing.
    pub second_seconds: f64,
}

/// Runs the tuner over `products` twice, on `device`, with an empty cache folder of its own
/// and no budget to speak of (60 s): the first run times every bucket, the second reads them
/// back. The environment's settings are restored after.
pub fn tuner_cost<B: Tunable>(device: &B::Device, products: &[Product]) -> TunerCost {
    let dtype = <B::FloatElem as Element>::dtype();
    let dir = std::env::temp_dir().join(format!("kiln-bench-tuner-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let settings = Settings {
        mode: Mode::Always,
        budget: Duration::from_secs(60),
        cache_dir: Some(dir.clone()),
    };
    let run = || -> (Stats, f64) {
        tune::configure(settings.clone());
        let start = Instant::now();
        for p in products {
            tune::choice::<B>(device, &p.key(dtype));
        }
        (tune::stats(), start.elapsed().as_secs_f64())
    };
    let (first, first_seconds) = run();
    let (second, second_seconds) = run();
    tune::configure(Settings::from_env().unwrap_or_else(|_| Settings::off()));
    let _ = std::fs::remove_dir_all(&dir);
    TunerCost {
        timed: first.timed,
        first_seconds,
        loaded: second.loaded,
        second_seconds,
    }
}
