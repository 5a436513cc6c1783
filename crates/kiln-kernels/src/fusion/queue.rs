//! A Kiln kernel as a custom operation of a fusion stream.
//!
//! `Fusion<B>` records operations and runs them later, fusing chains of Burn's element-wise ops
//! into single kernels. A Kiln kernel joins the stream as a `CustomOpIr` (never fused, run in
//! stream order): the caller declares its outputs' shapes and dtypes now, and [`Queued`] runs
//! the inner backend's kernel on the resolved inputs when the stream reaches it.

use std::fmt;
use std::marker::PhantomData;

use burn::backend::ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_fusion::client::GlobalFusionClient;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{FusionBackend, FusionRuntime, FusionTensor};

type Runtime<B> = <B as FusionBackend>::FusionRuntime;
/// The fusion client of `B`'s devices.
pub(super) type Client<B> = GlobalFusionClient<Runtime<B>>;
type Handles<B> = HandleContainer<<Runtime<B> as FusionRuntime>::FusionHandle>;

/// An input or output of a queued kernel on the inner backend.
pub(super) enum Prim<B: FusionBackend> {
    /// A float tensor.
    Float(FloatTensor<B>),
    /// An integer tensor.
    Int(IntTensor<B>),
}

impl<B: FusionBackend> Prim<B> {
    /// The float tensor this input is.
    pub(super) fn float(self) -> FloatTensor<B> {
        match self {
            Self::Float(t) => t,
            Self::Int(_) => unreachable!("the op declared this input as a float tensor"),
        }
    }

    /// The integer tensor this input is.
    pub(super) fn int(self) -> IntTensor<B> {
        match self {
            Self::Int(t) => t,
            Self::Float(_) => unreachable!("the op declared this input as an integer tensor"),
        }
    }
}

/// The inputs of a queued kernel, in the order they were given.
pub(super) fn take<B: FusionBackend, const N: usize>(inputs: Vec<Prim<B>>) -> [Prim<B>; N] {
    inputs
        .try_into()
        .unwrap_or_else(|_| unreachable!("a queued kernel gets the inputs it was given"))
}

type Run<B> = Box<dyn Fn(Vec<Prim<B>>) -> Vec<Prim<B>> + Send + Sync>;

/// A queued kernel: its description on the stream, and what computes its outputs from its
/// inputs on the inner backend.
struct Queued<B: FusionBackend> {
    desc: CustomOpIr,
    run: Run<B>,
    backend: PhantomData<B>,
}

impl<B: FusionBackend> fmt::Debug for Queued<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queued").field("desc", &self.desc).finish()
    }
}

impl<B: FusionBackend> Operation<Runtime<B>> for Queued<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let inputs = self
            .desc
            .inputs
            .iter()
            .map(|ir| {
                if ir.dtype.is_float() {
                    Prim::Float(handles.get_float_tensor::<B>(ir))
                } else {
                    Prim::Int(handles.get_int_tensor::<B>(ir))
                }
            })
            .collect();
        let outputs = (self.run)(inputs);
        debug_assert_eq!(outputs.len(), self.desc.outputs.len());
        for (ir, out) in self.desc.outputs.iter().zip(outputs) {
            match out {
                Prim::Float(out) => {
                    debug_assert_eq!(out.shape(), ir.shape, "{}: an output's shape", self.desc.id);
                    // The stream's later operations read the dtype declared here; a backend
                    // whose kernel fell back to another dtype is brought to it, never read as it.
                    let out = if out.dtype() == ir.dtype {
                        out
                    } else {
                        B::float_cast(out, ir.dtype.into())
                    };
                    handles.register_float_tensor::<B>(&ir.id, out);
                }
                Prim::Int(out) => {
                    debug_assert_eq!(out.dtype(), ir.dtype, "{}: an output's dtype", self.desc.id);
                    handles.register_int_tensor::<B>(&ir.id, out);
                }
            }
        }
    }
}

/// Queues kernel `name` reading `inputs` (float or integer tensors, on `client`'s device) and
/// writing outputs of the given shapes and dtypes (float or integer), which `run` computes on
/// the inner backend from the inputs in the same order; returns the outputs.
pub(super) fn queue<B, F>(
    name: &'static str,
    client: &Client<B>,
    inputs: Vec<FusionTensor<Runtime<B>>>,
    outputs: &[(Shape, DType)],
    run: F,
) -> Vec<FusionTensor<Runtime<B>>>
where
    B: FusionBackend,
    F: Fn(Vec<Prim<B>>) -> Vec<Prim<B>> + Send + Sync + 'static,
{
    let streams = OperationStreams::with_inputs(&inputs);
    // Consumed: an input this op holds the last reference to may be freed once it ran.
    let inputs: Vec<TensorIr> = inputs.into_iter().map(FusionTensor::into_ir).collect();
    let outputs: Vec<TensorIr> = outputs
        .iter()
        .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape.clone(), *dtype))
        .collect();
    let desc = CustomOpIr::new(name, &inputs, &outputs);
    let op = Queued::<B> {
        desc: desc.clone(),
        run: Box::new(run),
        backend: PhantomData,
    };
    client.register(streams, OperationIr::Custom(desc), op)
}
