//! [`TpGroup`]: a rank's handle on its tensor-parallel group, held by the layers that use it.

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use burn::module::{
    AutodiffModule, Devices, HasAutodiffModule, Module, ModuleDisplay, ModuleDisplayDefault,
    ModuleMapper, ModuleVisitor,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, Tensor, TensorMetadata, TensorPrimitive};

use super::TpWire;
use crate::collective::{Collective, CollectiveCounters, CollectiveError, ReduceOp};

/// One rank's handle on its tensor-parallel group: the ranks that hold the shards of the same
/// layers. Layers hold a clone (clones share the handle) and call it from inside the autodiff
/// graph through [`super::ops`].
///
/// A group of one rank ([`TpGroup::single`]) makes every operator an identity, so a sharded
/// layer of one shard is the ordinary layer.
pub struct TpGroup<B: TpWire> {
    /// A `Shared<B::Wire>`, erased: the autodiff backend and its inner backend share one
    /// wire, but the type system cannot see it in the bounds Burn's `Module` derive writes.
    /// `None` for a group of one, or an unconnected group.
    shared: Option<Arc<dyn Any + Send + Sync>>,
    /// This rank and the group's size.
    rank: usize,
    size: usize,
    backend: PhantomData<B>,
}

/// The handle itself, typed by the backend its tensors travel on.
pub(crate) struct Shared<W: Backend> {
    rank: usize,
    size: usize,
    collective: Mutex<Box<dyn Collective<W>>>,
    /// Nanoseconds spent in the group's calls, waiting for peers included.
    busy_ns: AtomicU64,
}

/// The traffic of a rank's tensor-parallel group: what the operators inside its forward and
/// backward passes cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TpTraffic {
    /// Collective calls.
    pub calls: u64,
    /// Elements this rank contributed.
    pub elements: u64,
    /// Time in the calls, waiting for peers included.
    pub time: Duration,
}

impl<B: TpWire> TpGroup<B> {
    /// A group over `collective`: its ranks hold the shards, `collective.rank()` is this
    /// rank's shard.
    pub fn new(collective: Box<dyn Collective<B::Wire>>) -> Self {
        let shared: Arc<Shared<B::Wire>> = Arc::new(Shared {
            rank: collective.rank(),
            size: collective.world_size(),
            collective: Mutex::new(collective),
            busy_ns: AtomicU64::new(0),
        });
        let (rank, size) = (shared.rank, shared.size);
        Self {
            shared: Some(shared),
            rank,
            size,
            backend: PhantomData,
        }
    }

    /// The group of one rank: every operator is an identity.
    pub fn single() -> Self {
        Self::unconnected(1)
    }

    /// Rank 0 of a group of `size` that is connected to nothing: for checking that a model
    /// shards `size` ways before any group exists. Its operators panic (one rank: they are
    /// identities, as [`Self::single`]'s).
    pub fn unconnected(size: usize) -> Self {
        Self::unconnected_rank(0, size)
    }

    /// Rank `rank` of a group of `size` that is connected to nothing: for cutting shard `rank`
    /// of a model where that shard's rank lives elsewhere (another process), as a template
    /// that receives the shard's parameters. Its operators panic, as [`Self::unconnected`]'s.
    ///
    /// # Panics
    /// When `rank` is not below `size`.
    pub fn unconnected_rank(rank: usize, size: usize) -> Self {
        assert!(rank < size, "rank {rank} of a group of {size}");
        Self {
            shared: None,
            rank,
            size,
            backend: PhantomData,
        }
    }

    /// This rank's shard, in `0..size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks (shards) in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Marks this rank failed in the group, releasing the peers that wait for it.
    pub fn abort(&self, reason: &str) {
        if self.shared.is_some()
            && let Some(shared) = self.shared()
        {
            shared.lock().abort(reason);
        }
    }

    /// The group's traffic from this rank so far.
    pub fn traffic(&self) -> TpTraffic {
        if self.shared.is_none() {
            return TpTraffic::default();
        }
        self.shared().map_or_else(TpTraffic::default, |s| {
            let CollectiveCounters { calls, elements } = s.lock().counters();
            TpTraffic {
                calls,
                elements,
                time: Duration::from_nanos(s.busy_ns.load(Ordering::Relaxed)),
            }
        })
    }

    /// The handle of the group, for the operators; `None` for a group of one.
    ///
    /// # Panics
    /// For an unconnected group of several ranks: one made to check shapes, or a shard's
    /// handed out of its run ([`disconnect`]).
    pub(crate) fn shared(&self) -> Option<&Shared<B::Wire>> {
        assert!(
            self.shared.is_some() || self.size == 1,
            "shard {} of a tensor-parallel group of {} ranks is not connected to its peers (a \
             shard handed out of its run, or one made to check shapes), so it cannot run its \
             sharded layers; run the whole model (Strategy::model gathers it) instead",
            self.rank,
            self.size
        );
        self.shared.as_ref().map(|s| {
            s.downcast_ref::<Shared<B::Wire>>()
                .expect("a tensor-parallel group is used with the backend it was made for")
        })
    }

    /// The same group seen from another backend with the same wire (the autodiff backend and
    /// its inner backend).
    pub(super) fn cast<O: TpWire>(&self) -> TpGroup<O> {
        TpGroup {
            shared: self.shared.clone(),
            rank: self.rank,
            size: self.size,
            backend: PhantomData,
        }
    }
}

thread_local! {
    /// Set while [`disconnect`] maps a module: every group it meets comes out unconnected.
    static DISCONNECTING: Cell<bool> = const { Cell::new(false) };
}

/// `module` with every [`TpGroup`] inside it unconnected (same rank and size, no peers): what
/// a strategy hands out of a run. Such a copy can be inspected, saved or gathered; running it
/// panics with a clear message instead of calling collectives its peers never match (which
/// would time out and fail the run), and it keeps no group alive after the ranks end.
pub fn disconnect<B: Backend, M: Module<B>>(module: M) -> M {
    struct Same;
    impl<B: Backend> ModuleMapper<B> for Same {}
    /// Clears the flag however the map ends.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            DISCONNECTING.with(|d| d.set(false));
        }
    }
    DISCONNECTING.with(|d| d.set(true));
    let _reset = Reset;
    module.map(&mut Same)
}

/// What a strategy keeps of a rank's tensor-parallel group, whatever the group's backend: a way
/// to fail it, and its traffic.
pub(crate) trait GroupHandle: Send {
    /// See [`TpGroup::abort`].
    fn abort(&self, reason: &str);
    /// See [`TpGroup::traffic`].
    fn traffic(&self) -> TpTraffic;
}

impl<B: TpWire> GroupHandle for TpGroup<B> {
    fn abort(&self, reason: &str) {
        TpGroup::abort(self, reason);
    }

    fn traffic(&self) -> TpTraffic {
        TpGroup::traffic(self)
    }
}

impl<W: Backend> Shared<W> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Box<dyn Collective<W>>> {
        // A rank that panicked inside a call leaves the mutex poisoned; the collective itself
        // is then poisoned too and answers every later call with an error.
        self.collective
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs one call on the collective, timed; a failure unwinds (see [`fail`]).
    fn call<T>(&self, f: impl FnOnce(&mut dyn Collective<W>) -> Result<T, CollectiveError>) -> T {
        let start = Instant::now();
        let result = f(self.lock().as_mut());
        let spent = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns.fetch_add(spent, Ordering::Relaxed);
        result.unwrap_or_else(|e| fail(e))
    }

    /// Sums `x` (any shape) over the group, in rank order.
    pub(crate) fn all_reduce(&self, x: FloatTensor<W>) -> FloatTensor<W> {
        let shape = x.shape();
        let flat = flat::<W>(x);
        let sum = self.call(|c| c.all_reduce(flat, ReduceOp::Sum));
        W::float_reshape(sum.into_primitive().tensor(), shape)
    }

    /// Every rank's `x` concatenated along the last dimension, in rank order.
    pub(crate) fn all_gather_last(&self, x: FloatTensor<W>) -> FloatTensor<W> {
        let shape = x.shape();
        let rank = shape.num_dims();
        // Gathered flat, the ranks' tensors follow each other: `[size, rows, cols]`, which a
        // swap of the first two axes turns into `[rows, size, cols]`, i.e. `[rows, size·cols]`.
        let cols = shape[rank - 1];
        let rows = shape.num_elements() / cols.max(1);
        let gathered = self.call(|c| c.all_gather(flat::<W>(x)));
        let parts = gathered
            .reshape([self.size, rows, cols])
            .swap_dims(0, 1)
            .reshape([rows, self.size * cols]);
        let mut dims = shape.to_vec();
        dims[rank - 1] = self.size * cols;
        W::float_reshape(parts.into_primitive().tensor(), Shape::from(dims))
    }

    /// This rank's slice of the last dimension of `x`, which must divide by the group size.
    pub(crate) fn slice_last(&self, x: FloatTensor<W>) -> FloatTensor<W> {
        slice_last::<W>(x, self.rank, self.size)
    }
}

/// Rank `rank`'s slice of `size` equal slices of the last dimension of `x`.
///
/// # Panics
/// When the last dimension does not divide by `size` (the layers check their widths when they
/// are sharded).
pub(crate) fn slice_last<W: Backend>(
    x: FloatTensor<W>,
    rank: usize,
    size: usize,
) -> FloatTensor<W> {
    let shape = x.shape();
    let last = shape.num_dims() - 1;
    let width = shape[last];
    assert!(
        width.is_multiple_of(size),
        "a tensor-parallel split of width {width} over {size} ranks"
    );
    let part = width / size;
    let ranges: Vec<_> = (0..shape.num_dims())
        .map(|d| {
            if d == last {
                burn::tensor::Slice::from(rank * part..(rank + 1) * part)
            } else {
                burn::tensor::Slice::from(0..shape[d])
            }
        })
        .collect();
    W::float_slice(x, &ranges)
}

fn flat<W: Backend>(x: FloatTensor<W>) -> Tensor<W, 1> {
    let n = x.shape().num_elements();
    Tensor::<W, 1>::from_primitive(TensorPrimitive::Float(W::float_reshape(x, Shape::new([n]))))
}

/// A collective call failed inside a forward or backward: unwind with the error itself, which
/// the strategies turn back into a [`CollectiveError`] naming the culprit.
fn fail(error: CollectiveError) -> ! {
    std::panic::panic_any(error)
}

impl<B: TpWire> Clone for TpGroup<B> {
    fn clone(&self) -> Self {
        self.cast()
    }
}

impl<B: TpWire> fmt::Debug for TpGroup<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TpGroup(rank {} of {})", self.rank(), self.size())
    }
}

impl<W: Backend> fmt::Debug for Shared<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TpGroup(rank {} of {})", self.rank, self.size)
    }
}

// A group is part of a model's structure, not of its parameters: it has no record, moves with
// the model to any device (the collective takes tensors on any device), and the inference
// copy of a model (`valid`) keeps calling the same group.
impl<B: TpWire> Module<B> for TpGroup<B> {
    type Record = burn::module::EmptyRecord;

    fn collect_devices(&self, devices: Devices<B>) -> Devices<B> {
        devices
    }

    fn fork(self, _device: &B::Device) -> Self {
        self
    }

    fn to_device(self, _device: &B::Device) -> Self {
        self
    }

    fn visit<V: ModuleVisitor<B>>(&self, _visitor: &mut V) {}

    fn map<M: ModuleMapper<B>>(self, _mapper: &mut M) -> Self {
        if DISCONNECTING.with(Cell::get) {
            return Self {
                shared: None,
                ..self
            };
        }
        self
    }

    fn load_record(self, _record: Self::Record) -> Self {
        self
    }

    fn into_record(self) -> Self::Record {
        burn::module::EmptyRecord::new()
    }
}

impl<B: TpWire> ModuleDisplayDefault for TpGroup<B> {
    fn content(&self, content: burn::module::Content) -> Option<burn::module::Content> {
        content
            .add_formatted(&format!("rank {} of {}", self.rank(), self.size()))
            .optional()
    }
}

impl<B: TpWire> ModuleDisplay for TpGroup<B> {}

impl<B> AutodiffModule<B> for TpGroup<B>
where
    B: AutodiffBackend + TpWire,
    B::InnerBackend: TpWire,
{
    type InnerModule = TpGroup<B::InnerBackend>;

    fn valid(&self) -> Self::InnerModule {
        self.cast()
    }

    fn from_inner(module: Self::InnerModule) -> Self {
        module.cast()
    }
}

impl<B> HasAutodiffModule<B> for TpGroup<B::InnerBackend>
where
    B: AutodiffBackend + TpWire,
    B::InnerBackend: TpWire,
{
    type TrainModule = TpGroup<B>;
}
