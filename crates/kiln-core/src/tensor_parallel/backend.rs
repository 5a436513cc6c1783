//! [`TpBackend`]: the tensor-parallel operators as a backend extension.

use burn::tensor::ops::FloatTensor;

use super::{TpGroup, TpWire};

/// A backend on which tensor-parallel layers run: the four operators of [`super::ops`] on its
/// primitives. Plain backends run them as collectives (their backward is not theirs to know);
/// `Autodiff<B>` runs `B`'s and records the conjugate operator as the backward.
pub trait TpBackend: TpWire {
    /// `f`: the identity; its backward sums the gradient over the group.
    fn tp_copy(x: FloatTensor<Self>, group: &TpGroup<Self>) -> FloatTensor<Self>;

    /// `g`: the sum over the group; its backward is the identity.
    fn tp_reduce(x: FloatTensor<Self>, group: &TpGroup<Self>) -> FloatTensor<Self>;

    /// Every rank's `x` side by side along the last dimension, in rank order; its backward
    /// keeps this rank's slice.
    fn tp_gather(x: FloatTensor<Self>, group: &TpGroup<Self>) -> FloatTensor<Self>;

    /// This rank's slice of the last dimension; its backward gathers the slices.
    fn tp_scatter(x: FloatTensor<Self>, group: &TpGroup<Self>) -> FloatTensor<Self>;
}

/// The operators of a plain backend, whose wire is itself.
macro_rules! plain_tp_backend {
    ($(impl [$($generics:tt)*] for $backend:ty $(where [$($bounds:tt)*])?;)*) => {$(
        impl<$($generics)*> TpWire for $backend $(where $($bounds)*)? {
            type Wire = Self;
        }

        impl<$($generics)*> TpBackend for $backend $(where $($bounds)*)? {
            fn tp_copy(x: FloatTensor<Self>, _group: &TpGroup<Self>) -> FloatTensor<Self> {
                x
            }

            fn tp_reduce(x: FloatTensor<Self>, group: &TpGroup<Self>) -> FloatTensor<Self> {
                match group.shared() {
                    Some(shared) => shared.all_reduce(x),
                    None => x,
                }
            }

            fn tp_gather(x: FloatTensor<Self>, group: &TpGroup<Self>) -> FloatTensor<Self> {
                match group.shared() {
                    Some(shared) => shared.all_gather_last(x),
                    None => x,
                }
            }

            fn tp_scatter(x: FloatTensor<Self>, group: &TpGroup<Self>) -> FloatTensor<Self> {
                match group.shared() {
                    Some(shared) => shared.slice_last(x),
                    None => x,
                }
            }
        }
    )*};
}

plain_tp_backend! {
    impl [] for burn::backend::Flex;
    impl [E, I, Q] for burn::backend::NdArray<E, I, Q> where [
        E: burn::backend::ndarray::FloatNdArrayElement,
        I: burn::backend::ndarray::IntNdArrayElement,
        Q: burn::backend::ndarray::QuantElement,
        burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>
            + From<burn::backend::ndarray::SharedArray<I>>,
    ];
    impl [R, F, I, BT] for burn_cubecl::CubeBackend<R, F, I, BT> where [
        R: burn_cubecl::CubeRuntime,
        F: burn_cubecl::FloatElement,
        I: burn_cubecl::IntElement,
        BT: burn_cubecl::element::BoolElement,
    ];
    impl [B] for burn_fusion::Fusion<B> where [B: burn_fusion::FusionBackend];
}
