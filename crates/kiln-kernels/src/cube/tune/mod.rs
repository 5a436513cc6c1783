//! Kiln's matmul tuner: each product of a step is timed once per device with a few of cubek's
//! strategies ([`shortlist`]), within a budget of seconds per run, and the winner is kept on
//! disk for later runs ([`cache`]).
//!
//! Burn 0.21 without its `autotune` feature runs one strategy for every product (cubek's
//! `Auto`); with it, Burn times up to nineteen per shape at first use, which took the AD step's
//! first step past 75 s on an H100. Here a product is timed on synthetic operands of its shape
//! and layout when it is first asked for, before its operands exist, so that the fusion
//! backend can decide while it records the step ([`crate::KernelBackend::tuned_matmul`]).
//! Products are bucketed by their sides rounded up to powers of two, as autotune's anchors do:
//! a batch of 200 tokens uses what 256 chose.
//!
//! A strategy replaces Burn's default only where it is at least [`MARGIN`] faster: timings
//! closer than that are noise, and under fusion Burn's own matmul also takes the element-wise
//! ops around it into its kernel, which a Kiln product cannot. When the budget is spent, the
//! products not yet timed run Burn's default and are timed by a later run. The first run on a
//! device can therefore choose differently from later ones for a few products (equal results
//! up to rounding); `KILN_MATMUL_TUNE=off` runs Burn's default everywhere.

pub mod cache;
pub mod settings;
pub mod shortlist;

use std::any::TypeId;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::tensor::backend::{Backend, DeviceId, DeviceOps};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Distribution, Shape};
use burn_cubecl::element::BoolElement;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};
use tracing::{debug, info, warn};

pub use self::cache::{CacheFile, Record};
pub use self::settings::{Mode, Settings, SettingsError};
pub use self::shortlist::shortlist;
use crate::backend::transposed;
use crate::cube::matmul::{Candidate, MatmulStrategies};
use crate::{Product, Transpose};

/// How much faster than Burn's default a strategy must be to replace it: 10 %.
pub const MARGIN: f64 = 0.9;
/// Products timed per candidate after its first (which compiles it).
const REPS: u32 = 5;

/// A device as the tuner tells them apart: its runtime and the hardware properties that decide
/// which kernel wins.
#[derive(Clone, Debug)]
pub struct DeviceIdentity {
    /// The name of the device's file in the cache (`cuda-132sm-…`).
    pub name: String,
    /// Tuned in [`Mode::Auto`]: a CUDA device. cubecl-wgpu 0.10 reports no property that
    /// tells a CPU adapter (Mesa's lavapipe, where CI counts launches) from a GPU, so wgpu
    /// devices are tuned only in [`Mode::Always`].
    pub tuned_by_default: bool,
}

/// The backends the tuner times products on: Burn's plain CubeCL backends.
pub trait Tunable: MatmulStrategies {
    /// Which device `device` is, for the cache.
    fn identity(device: &Self::Device) -> DeviceIdentity;
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> Tunable
    for CubeBackend<R, F, I, BT>
{
    fn identity(device: &Self::Device) -> DeviceIdentity {
        let client = R::client(device);
        let hw = &client.properties().hardware;
        let name = format!(
            "{}-{}sm-{}tc-{}kib-plane{}",
            R::name(&client),
            hw.num_streaming_multiprocessors.unwrap_or(0),
            hw.num_tensor_cores.unwrap_or(0),
            hw.max_shared_memory_size / 1024,
            hw.plane_size_max,
        );
        DeviceIdentity {
            tuned_by_default: R::name(&client) == "cuda",
            name,
        }
    }
}

/// What the tuner did in this process, over every device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Products timed.
    pub timed: usize,
    /// Choices read from cache files.
    pub loaded: usize,
    /// Products left to Burn's default because the budget was spent.
    pub over_budget: usize,
    /// Time spent timing.
    pub spent: Duration,
}

/// One device's choices: `None` is Burn's default.
#[derive(Default)]
struct DeviceChoices {
    chosen: HashMap<Product, Option<Candidate>>,
    cache: Option<CacheFile>,
}

/// A device handle as a map key (its type and id), so that its identity is worked out once
/// rather than on every product. Two handles may name one device (`WgpuDevice::Cpu` and
/// `DefaultDevice` on a machine whose only adapter is lavapipe): choices are kept by identity.
type DeviceKey = (TypeId, DeviceId);

struct Tuner {
    settings: Settings,
    /// Each device handle's identity: its name, and whether `auto` tunes it.
    identities: HashMap<DeviceKey, (Arc<str>, bool)>,
    /// Each identity's choices.
    devices: HashMap<Arc<str>, DeviceChoices>,
    stats: Stats,
    budget_told: bool,
}

static TUNER: Mutex<Option<Tuner>> = Mutex::new(None);

/// Replaces the settings (the environment's otherwise) and forgets every choice in memory, so
/// that the next product reads the cache again. For the CLI at start-up and for tests.
pub fn configure(settings: Settings) {
    *lock() = Some(Tuner::new(settings));
}

/// What the tuner did in this process.
pub fn stats() -> Stats {
    lock().as_ref().map(|t| t.stats).unwrap_or_default()
}

fn lock() -> std::sync::MutexGuard<'static, Option<Tuner>> {
    // A panic while timing is caught inside; a poisoned lock still holds consistent choices.
    TUNER.lock().unwrap_or_else(|e| e.into_inner())
}

/// The strategy `product` runs with on `device`, `None` for Burn's default; timed now if the
/// product is new to the device and the budget allows.
pub fn choice<B: Tunable>(device: &B::Device, product: &Product) -> Option<Candidate> {
    let mut guard = lock();
    let tuner = guard.get_or_insert_with(|| {
        Tuner::new(Settings::from_env().unwrap_or_else(|e| {
            warn!("{e}; the matmul tuner is off");
            Settings::off()
        }))
    });
    tuner.choice::<B>(device, product)
}

/// `lhs·rhs` (the operand `transpose` names multiplied transposed) with the strategy the tuner
/// chose, Burn's matmul where it chose none or the strategy cannot run these operands.
pub fn matmul<B: Tunable>(
    lhs: FloatTensor<B>,
    rhs: FloatTensor<B>,
    product: &Product,
) -> FloatTensor<B> {
    let device = B::float_device(&lhs);
    let (lhs, rhs) = transposed::<B>(lhs, rhs, product.transpose);
    if let Some(candidate) = choice::<B>(&device, product) {
        // A bucket is timed on one of its shapes; another may be one this strategy refuses.
        match launch::<B>(lhs.clone(), rhs.clone(), &candidate) {
            Ok(out) => return out,
            Err(e) => debug!("{} on {product:?}: {e}; Burn's default", candidate.name),
        }
    }
    B::float_matmul(lhs, rhs)
}

fn launch<B: MatmulStrategies>(
    lhs: FloatTensor<B>,
    rhs: FloatTensor<B>,
    candidate: &Candidate,
) -> Result<FloatTensor<B>, String> {
    catch_unwind(AssertUnwindSafe(|| B::matmul_with(lhs, rhs, candidate)))
        .unwrap_or_else(|_| Err("panicked".into()))
}

/// `product`'s sides rounded up to powers of two.
pub fn bucket(product: &Product) -> Product {
    Product {
        m: product.m.next_power_of_two(),
        k: product.k.next_power_of_two(),
        n: product.n.next_power_of_two(),
        ..*product
    }
}

impl Tuner {
    fn new(settings: Settings) -> Self {
        Self {
            settings,
            identities: HashMap::new(),
            devices: HashMap::new(),
            stats: Stats::default(),
            budget_told: false,
        }
    }

    fn choice<B: Tunable>(&mut self, device: &B::Device, product: &Product) -> Option<Candidate> {
        if self.settings.mode == Mode::Off {
            return None;
        }
        let device_key = (TypeId::of::<B::Device>(), device.id());
        let (name, tuned_by_default) = self
            .identities
            .entry(device_key)
            .or_insert_with(|| {
                let identity = B::identity(device);
                (identity.name.into(), identity.tuned_by_default)
            })
            .clone();
        if !tuned_by_default && self.settings.mode == Mode::Auto {
            return None;
        }
        if !self.devices.contains_key(&name) {
            let choices = self.open(&name);
            self.devices.insert(name.clone(), choices);
        }
        let key = bucket(product);
        if let Some(chosen) = self.devices[&name].chosen.get(&key) {
            return chosen.clone();
        }
        let chosen = self.time::<B>(device, product, &key, &name);
        self.devices
            .get_mut(&name)
            .expect("opened above")
            .chosen
            .insert(key, chosen.clone());
        chosen
    }

    /// The choices of the device named `name` from its cache file, if there is one.
    fn open(&mut self, name: &str) -> DeviceChoices {
        let mut choices = DeviceChoices::default();
        let Some(dir) = &self.settings.cache_dir else {
            info!(
                "matmul tuner on {name}: no cache folder (set {}), choices kept for this run only",
                settings::CACHE_VAR
            );
            return choices;
        };
        let file = CacheFile::new(dir, name);
        let mut chosen = HashMap::new();
        match file.load() {
            Ok((records, unreadable)) => {
                for record in records {
                    let list = shortlist(&record.product);
                    let candidate = list.into_iter().find(|c| c.name == record.chosen);
                    if let Some(candidate) = candidate {
                        let strategy = (!candidate.is_burn_default()).then_some(candidate);
                        chosen.insert(record.product, strategy);
                    }
                }
                self.stats.loaded += chosen.len();
                info!(
                    "matmul tuner on {name}: {} products' choices read from {} ({unreadable} \
                     unreadable lines); new products are timed, at most {:.1} s in this run",
                    chosen.len(),
                    file.path().display(),
                    self.settings.budget.as_secs_f64(),
                );
            }
            Err(e) => warn!(
                "matmul tuner: cannot read {} ({e}); timing products afresh",
                file.path().display()
            ),
        }
        choices.chosen = chosen;
        choices.cache = Some(file);
        choices
    }

    /// Times `product`'s shortlist on synthetic operands and records the winner; `None` (Burn's
    /// default) without timing when the budget is spent.
    fn time<B: Tunable>(
        &mut self,
        device: &B::Device,
        product: &Product,
        key: &Product,
        device_name: &str,
    ) -> Option<Candidate> {
        let left = self.settings.budget.saturating_sub(self.stats.spent);
        let start = Instant::now();
        let list = shortlist(key);
        let mut micros = Vec::with_capacity(list.len());
        let operands = (!left.is_zero()).then(|| operands::<B>(product, device));
        for candidate in &list {
            let Some((lhs, rhs)) = operands.as_ref().filter(|_| start.elapsed() < left) else {
                self.stats.spent += start.elapsed();
                self.over_budget();
                return None;
            };
            let took = time_one::<B>(device, lhs, rhs, candidate);
            micros.push((candidate.name.clone(), took.map(|d| d.as_secs_f64() * 1e6)));
        }
        self.stats.spent += start.elapsed();
        self.stats.timed += 1;
        let chosen = pick(&list, &micros);
        debug!(
            "matmul tuner: {product:?} → {} ({micros:?})",
            chosen.as_ref().map_or("Burn's default", |c| &c.name)
        );
        let record = Record {
            product: *key,
            chosen: chosen
                .as_ref()
                .map_or_else(|| list[0].name.clone(), |c| c.name.clone()),
            micros,
        };
        let cache = self.devices.get(device_name).and_then(|d| d.cache.as_ref());
        if let Some(file) = cache
            && let Err(e) = file.append(&record)
        {
            warn!(
                "matmul tuner: cannot write {} ({e}); this run's choices are not kept",
                file.path().display()
            );
            self.devices.get_mut(device_name).expect("opened").cache = None;
        }
        chosen
    }

    /// Counts a product left untimed, and says once that the budget is spent.
    fn over_budget(&mut self) {
        self.stats.over_budget += 1;
        if !self.budget_told {
            self.budget_told = true;
            info!(
                "matmul tuner: the {:.1} s budget is spent after {} products; the rest run \
                 Burn's default until a later run times them ({} to change it)",
                self.settings.budget.as_secs_f64(),
                self.stats.timed,
                settings::SECONDS_VAR
            );
        }
    }
}

/// The fastest of `list` by `micros` (each candidate's name and microseconds per product,
/// `None` where it could not run), if it beats Burn's default (`list[0]`) by [`MARGIN`]: the
/// tuner's decision, which `kiln bench matmul` also reads off its sweep.
pub fn pick(list: &[Candidate], micros: &[(String, Option<f64>)]) -> Option<Candidate> {
    let default = micros[0].1.unwrap_or(f64::INFINITY);
    let (best, time) = micros
        .iter()
        .enumerate()
        .skip(1)
        .filter_map(|(i, (_, t))| t.map(|t| (i, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    (time < default * MARGIN).then(|| list[best].clone())
}

/// Random operands of `product`'s shape and layout, the transposed one as a view.
fn operands<B: Backend>(product: &Product, device: &B::Device) -> (FloatTensor<B>, FloatTensor<B>) {
    let Product { m, k, n, .. } = *product;
    let (lhs, rhs) = match product.transpose {
        Transpose::Lhs => ([k, m], [k, n]),
        Transpose::Rhs => ([m, k], [n, k]),
        Transpose::Neither => ([m, k], [k, n]),
    };
    let dtype = product.dtype.into();
    let random = |shape: [usize; 2]| {
        B::float_random(Shape::new(shape), Distribution::Default, device, dtype)
    };
    transposed::<B>(random(lhs), random(rhs), product.transpose)
}

/// Seconds per product of `candidate` on these operands, after one run that compiles it; `None`
/// where it cannot run them.
fn time_one<B: MatmulStrategies>(
    device: &B::Device,
    lhs: &FloatTensor<B>,
    rhs: &FloatTensor<B>,
    candidate: &Candidate,
) -> Option<Duration> {
    let first = launch::<B>(lhs.clone(), rhs.clone(), candidate);
    if let Err(e) = &first {
        debug!("matmul tuner: {} cannot run: {e}", candidate.name);
        return None;
    }
    drop(first);
    B::sync(device).ok()?;
    let start = Instant::now();
    for _ in 0..REPS {
        launch::<B>(lhs.clone(), rhs.clone(), candidate).ok()?;
    }
    B::sync(device).ok()?;
    Some(start.elapsed() / REPS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::matmul::candidates;

    #[test]
    fn a_strategy_replaces_the_default_only_when_clearly_faster() {
        let list = candidates()[..3].to_vec();
        let micros = |t: [Option<f64>; 3]| {
            list.iter()
                .zip(t)
                .map(|(c, t)| (c.name.clone(), t))
                .collect::<Vec<_>>()
        };
        let name = |c: Option<Candidate>| c.map(|c| c.name);
        // 5 % faster is noise; 20 % faster wins; the fastest of several wins.
        assert_eq!(
            name(pick(&list, &micros([Some(100.0), Some(95.0), None]))),
            None
        );
        let won = pick(&list, &micros([Some(100.0), Some(80.0), Some(85.0)]));
        assert_eq!(name(won), Some(list[1].name.clone()));
        let won = pick(&list, &micros([Some(100.0), Some(80.0), Some(60.0)]));
        assert_eq!(name(won), Some(list[2].name.clone()));
        // Nothing ran but the default, or nothing ran at all.
        assert_eq!(name(pick(&list, &micros([Some(100.0), None, None]))), None);
        let won = pick(&list, &micros([None, Some(80.0), None]));
        assert_eq!(name(won), Some(list[1].name.clone()));
    }

    #[test]
    fn buckets_round_sides_up_to_powers_of_two() {
        let p = Product {
            m: 200,
            k: 768,
            n: 32_000,
            transpose: Transpose::Rhs,
            dtype: burn::tensor::DType::F16,
        };
        let b = bucket(&p);
        assert_eq!([b.m, b.k, b.n], [256, 1024, 32_768]);
        assert_eq!((b.transpose, b.dtype), (p.transpose, p.dtype));
    }
}
