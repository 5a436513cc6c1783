//! Tensor parallelism's communication inside the autodiff graph: the tensor-parallel group a
//! layer holds ([`TpGroup`]) and the four conjugate operators Megatron-LM builds its sharded
//! layers from ([`ops`]).
//!
//! A layer whose weight is split over the `tp` ranks of a mesh computes a part of its output
//! (column-parallel) or a part of a sum (row-parallel). The operators that join the parts are
//! Burn autodiff operations with their own backward, so a model made of sharded layers trains
//! with an ordinary `loss.backward()`, and its gradients are exactly those of the unsharded
//! model:
//!
//! | operator | forward | backward |
//! | --- | --- | --- |
//! | [`ops::copy_to_tp`] (`f`) | identity | all-reduce (sum) |
//! | [`ops::reduce_from_tp`] (`g`) | all-reduce (sum) | identity |
//! | [`ops::gather_from_tp`] | all-gather along the last dim | this rank's slice |
//! | [`ops::scatter_to_tp`] | this rank's slice of the last dim | all-gather |
//!
//! Every call goes through the group's [`Collective`](crate::Collective), so the collective's
//! guarantees hold inside a forward or a backward: a call that waits longer than the timeout
//! fails naming the missing rank, and a rank that fails releases the others at once. A failed
//! call panics with the [`CollectiveError`](crate::CollectiveError) as the payload (a forward
//! cannot return an error); the strategies catch it and report it as that collective error.
//!
//! The operators are a backend extension, [`TpBackend`], implemented for Burn's CPU backends,
//! the CubeCL backends and `Autodiff<B>` over any of them.

mod autodiff;
mod backend;
mod group;
pub mod ops;
mod wire;

pub use backend::TpBackend;
pub(crate) use group::GroupHandle;
pub use group::{TpGroup, TpTraffic, disconnect};
pub use wire::TpWire;

#[cfg(test)]
mod tests;
