//! [`TpWire`]: which backend's tensors a tensor-parallel group moves.

use burn::tensor::backend::Backend;

/// A backend whose tensor-parallel group ([`super::TpGroup`]) runs its collective on
/// [`Self::Wire`]'s tensors. The group needs only this, and the operators ([`super::TpBackend`])
/// need the group, so the wire is its own trait below both.
pub trait TpWire: Backend {
    /// The backend whose tensors the group's collective moves: the backend itself for a plain
    /// one, the inner backend for `Autodiff<B>`.
    type Wire: Backend;
}
