//! The tensor-parallel operators on `Autodiff<B>`: `B`'s forward, and the conjugate operator as
//! the backward node.
//!
//! The nodes are compute-bound: a checkpointing strategy never recomputes them, since a
//! recomputed collective would be a call the other ranks never make.
//!
//! A node's collective waits for the peers inside Burn's `backward()`, which holds the lock of
//! this rank's autodiff graph meanwhile. That cannot deadlock the ranks, which are threads of
//! one process sharing Burn's graph registry: a rank's graph shares no node with another
//! rank's (every shard's parameters are fresh leaves, and tensors cross ranks only through
//! collectives on the inner backend), so no other rank ever waits for this graph's lock; and
//! the sweep that ends every backward skips a graph that another thread holds instead of
//! waiting for it (the fix `vendor/burn-autodiff` backports). Tests run dp × tp and pp × tp
//! with GPipe, whose ranks start one backward right after another.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::FloatTensor;

use super::{TpBackend, TpGroup, TpWire};

/// What a backward node keeps: the group, as the inner backend sees it.
struct Group<B: TpBackend>(TpGroup<B>);

impl<B: TpBackend> Clone for Group<B> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<B: TpBackend> std::fmt::Debug for Group<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Which conjugate operator a node's backward runs.
#[derive(Debug, Clone, Copy)]
enum Conjugate {
    /// The backward of `f`: sum the gradient over the group.
    Reduce,
    /// The backward of `g`: pass the gradient on.
    Identity,
    /// The backward of a gather: this rank's slice of the gradient.
    Scatter,
    /// The backward of a scatter: every rank's slice of the gradient, gathered.
    Gather,
}

#[derive(Debug)]
struct TpBackward(Conjugate);

impl<B: TpBackend> Backward<B, 1> for TpBackward {
    type State = Group<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let group = &ops.state.0;
        // Every rank's node runs its backward (the graphs have the same shape), so the
        // collective calls below are made by all ranks of the group, in the same order.
        let dx = match self.0 {
            Conjugate::Reduce => B::tp_reduce(dy, group),
            Conjugate::Identity => dy,
            Conjugate::Scatter => B::tp_scatter(dy, group),
            Conjugate::Gather => B::tp_gather(dy, group),
        };
        if let Some(node) = node {
            grads.register::<B>(node.id, dx);
        }
    }
}

impl<B, C> TpWire for Autodiff<B, C>
where
    B: TpWire,
    C: CheckpointStrategy,
{
    type Wire = B::Wire;
}

impl<B, C> TpBackend for Autodiff<B, C>
where
    B: TpBackend,
    C: CheckpointStrategy,
{
    fn tp_copy(x: FloatTensor<Self>, group: &TpGroup<Self>) -> FloatTensor<Self> {
        record(x, group, B::tp_copy, Conjugate::Reduce)
    }

    fn tp_reduce(x: FloatTensor<Self>, group: &TpGroup<Self>) -> FloatTensor<Self> {
        record(x, group, B::tp_reduce, Conjugate::Identity)
    }

    fn tp_gather(x: FloatTensor<Self>, group: &TpGroup<Self>) -> FloatTensor<Self> {
        record(x, group, B::tp_gather, Conjugate::Scatter)
    }

    fn tp_scatter(x: FloatTensor<Self>, group: &TpGroup<Self>) -> FloatTensor<Self> {
        record(x, group, B::tp_scatter, Conjugate::Gather)
    }
}

/// Runs `forward` on the inner tensor and records `conjugate` as its backward.
fn record<B: TpBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    group: &TpGroup<Autodiff<B, C>>,
    forward: fn(FloatTensor<B>, &TpGroup<B>) -> FloatTensor<B>,
    conjugate: Conjugate,
) -> FloatTensor<Autodiff<B, C>> {
    let inner: TpGroup<B> = group.cast();
    let out = forward(x.primitive, &inner);
    match TpBackward(conjugate)
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(Group(inner), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}
