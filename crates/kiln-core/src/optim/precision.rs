//! Mixed precision: the forward and backward in bf16 or f16, with f32 master weights that the
//! optimizer keeps and steps.
//!
//! [`MixedPrecision`] wraps a model and is itself a model any strategy trains. Its training
//! step casts a copy of the parameters to the low precision in one pass, as leaves of the graph
//! whose gradients are cast back to f32 in one pass too (`precision_cast`), and asks the model
//! to compute its output in that precision
//! ([`LowPrecisionStep`](crate::model::LowPrecisionStep)): the model casts its inputs, and computes its loss in f32, because a
//! mean over a batch and a softmax are where half precision loses most. For f16, whose
//! gradients below 6e-8 underflow, a [`LossScale`] shared with the PerformanceOptimizer scales
//! the loss before the backward; bf16 has f32's range and needs none.
//!
//! What Burn 0.21 runs in half precision, measured: Flex runs bf16 and f16 matmuls (256 × 256:
//! 0.47 and 0.57 ms against 0.57 ms in f32) and autodiff through casts, with f32 gradients;
//! NdArray panics on any bf16 or f16 tensor ("Unsupported dtype").

use burn::module::{AutodiffModule, Module};
use burn::tensor::FloatDType;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::train::{TrainOutput, TrainStep};
use serde::{Deserialize, Serialize};

use kiln_kernels::LowCopies;

use super::LossScale;
use super::precision_cast::{grads_to_f32, low_precision_copy};
use crate::model::{LowPrecisionStep, StepLoss};

/// The float precision of the forward and backward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32.
    #[default]
    F32,
    /// bfloat16 compute (f32's range, 8 bits of mantissa), f32 master weights.
    Bf16,
    /// IEEE half compute (range ±65504, 11 bits of mantissa), f32 master weights.
    F16,
}

/// What a precision keeps per value and per parameter, as the planner's cost model counts it.
impl Precision {
    /// Bytes of a stored weight: the copy the forward reads.
    pub fn weight_bytes(self) -> f64 {
        match self {
            Precision::F32 => 4.0,
            Precision::Bf16 | Precision::F16 => 2.0,
        }
    }

    /// Bytes of an activation (and of a gradient of one).
    pub fn activation_bytes(self) -> f64 {
        self.weight_bytes()
    }

    /// Bytes of a weight's gradient: the weights' own precision (low-precision gradients,
    /// whose f32 master copy is the optimizer's).
    pub fn gradient_bytes(self) -> f64 {
        self.weight_bytes()
    }

    /// Bytes per trainable parameter besides its weight: its gradient, AdamW's two f32
    /// moments, and an f32 master copy in a low precision (16 bytes a parameter in all, either
    /// way).
    pub fn trainable_extra_bytes(self) -> f64 {
        match self {
            Precision::F32 => 4.0 + 8.0,
            Precision::Bf16 | Precision::F16 => 2.0 + 8.0 + 4.0,
        }
    }
}

impl Precision {
    /// Every precision, in the order help texts list them.
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::Bf16, Precision::F16];
    /// Their names, in the same order.
    pub const ALL_NAMES: [&'static str; 3] = ["f32", "bf16", "f16"];

    /// The precision's name in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    /// The dtype of the compute.
    pub fn dtype(self) -> FloatDType {
        match self {
            Precision::F32 => FloatDType::F32,
            Precision::Bf16 => FloatDType::BF16,
            Precision::F16 => FloatDType::F16,
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown precision {s:?}; use {}",
                    Precision::ALL_NAMES.join(", ")
                )
            })
    }
}

/// `model` trained in `precision`: a model any strategy trains, whose parameters stay f32
/// (the optimizer's master weights) while its forward and backward run in bf16 or f16.
#[derive(Module, Debug)]
pub struct MixedPrecision<B: Backend, Model: Module<B>> {
    /// The model, with its f32 parameters.
    pub model: Model,
    #[module(skip)]
    precision: Precision,
    #[module(skip)]
    loss_scale: Option<LossScale>,
    /// Whether the step's gradients stay in the compute dtype (see [`Self::with_low_precision_grads`]).
    #[module(skip)]
    low_grads: bool,
    /// The optimizer's copies of the parameters in the compute dtype (see [`Self::with_low_copies`]).
    #[module(skip)]
    copies: Option<LowCopies>,
    #[module(skip)]
    backend: std::marker::PhantomData<B>,
}

impl<B: Backend, Model: Module<B>> MixedPrecision<B, Model> {
    /// `model` trained in `precision`.
    pub fn new(model: Model, precision: Precision) -> Self {
        Self {
            model,
            precision,
            loss_scale: None,
            low_grads: false,
            copies: None,
            backend: std::marker::PhantomData,
        }
    }

    /// This model, multiplying its loss by `scale` before the backward: give the same `scale`
    /// to the [`PerformanceOptimizer`](super::PerformanceOptimizer), which divides the
    /// gradients by it and adjusts it. For f16, whose gradients below 6e-8 underflow.
    pub fn with_loss_scale(self, scale: LossScale) -> Self {
        Self {
            loss_scale: Some(scale),
            ..self
        }
    }

    /// This model, returning its gradients in the compute dtype (bf16 or f16) under the f32
    /// parameters' ids, without the pass that casts them to f32. Only for an optimizer that
    /// reads them as they are
    /// ([`OptimizerSpec::reads_low_precision_grads`](crate::strategy::OptimizerSpec::reads_low_precision_grads))
    /// on a strategy where nothing
    /// else does: no collective, no accumulation (`fit` decides).
    pub fn with_low_precision_grads(self) -> Self {
        Self {
            low_grads: true,
            ..self
        }
    }

    /// This model, taking its compute-dtype parameters from `copies` where the optimizer left
    /// one made from the parameter as it is (the fused AdamW writes them as it steps, when
    /// `copies` is on), and casting only the others: no cast pass over the parameters in a step
    /// that follows the optimizer's.
    pub fn with_low_copies(self, copies: LowCopies) -> Self {
        Self {
            copies: Some(copies),
            ..self
        }
    }

    /// The compute precision.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// `model` in this model's precision, with its loss scale: a shard of this model, or the
    /// whole model gathered from a shard.
    pub(crate) fn around<N: Module<B>>(&self, model: N) -> MixedPrecision<B, N> {
        MixedPrecision {
            model,
            precision: self.precision,
            loss_scale: self.loss_scale.clone(),
            low_grads: self.low_grads,
            copies: self.copies.clone(),
            backend: std::marker::PhantomData,
        }
    }
}

impl<B, M> TrainStep for MixedPrecision<B, M>
where
    B: AutodiffBackend<InnerBackend: kiln_kernels::KernelBackend>,
    M: AutodiffModule<B> + LowPrecisionStep<B>,
    M::Output: StepLoss<B>,
{
    type Input = M::Input;
    type Output = M::Output;

    fn step(&self, input: M::Input) -> TrainOutput<M::Output> {
        if self.precision == Precision::F32 {
            return self.model.step(input);
        }
        let dtype = self.precision.dtype();
        let copies = self.copies.as_ref().filter(|c| c.is_on());
        let low = low_precision_copy::<B, M>(&self.model, dtype, copies);
        let scale = self.loss_scale.as_ref().map(|s| s.value());
        let (grads, output) = low.grads_in(input, dtype, scale);
        let grads = if self.low_grads {
            grads
        } else {
            grads_to_f32::<B, M>(&low, grads)
        };
        TrainOutput {
            grads,
            item: output,
        }
    }
}
