//! A projection of a decoder layer: the pretrained base, in full precision or in 4 bits, and a
//! LoRA adapter when one is attached.

use burn::module::{Module, Param};
use burn::nn::{DropoutConfig, Linear};
use burn::tensor::Tensor;
use kiln_core::tensor_parallel::TpGroup;
use kiln_kernels::quant::QuantizedWeight;
use kiln_kernels::{ops, reference};

use crate::lora::LoraAdapter;
use crate::tensor_parallel::ShardedBackend;

/// A frozen 4-bit base: the weight's codes and scales (Kiln's block format) and the original
/// bias in f32.
#[derive(Module, Debug)]
pub struct QuantizedBase<B: ShardedBackend> {
    /// `[in, out]` in 4 bits.
    pub weight: QuantizedWeight<B>,
    /// The bias (Qwen2's q/k/v), frozen.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

/// `y = base(x) + scale · x·A·B`: the pretrained projection and its adapter.
///
/// Exactly one of `base` and `quantized` holds the pretrained weight; the two are fields
/// rather than an enum so that a full-precision base keeps Hugging Face's path
/// (`q_proj.base.weight`) whatever Burn does with enum variants in record paths.
#[derive(Module, Debug)]
pub struct Proj<B: ShardedBackend> {
    /// The pretrained weight (and bias) in full precision; `None` when loaded in 4 bits.
    pub base: Option<Linear<B>>,
    /// The pretrained weight in 4 bits ([`super::load_4bit`]); `None` in full precision.
    pub quantized: Option<QuantizedBase<B>>,
    /// The adapter, when attached.
    pub lora: Option<LoraAdapter<B>>,
    #[module(skip)]
    pub(crate) scale: f32,
    /// The adapter's input dropout while training (PEFT's `lora_dropout`).
    #[module(skip)]
    pub(crate) dropout: f64,
    /// The group of the tensor-parallel shard this projection is, if it is one (see
    /// [`super::tensor_parallel`]).
    #[module(skip)]
    pub(crate) tp: Option<TpGroup<B>>,
    /// A shard of the input features (row-parallel), not of the outputs.
    #[module(skip)]
    pub(crate) row: bool,
}

impl<B: ShardedBackend> Proj<B> {
    /// A full-precision projection without an adapter.
    pub fn dense(base: Linear<B>) -> Self {
        Self {
            base: Some(base),
            quantized: None,
            lora: None,
            scale: 0.0,
            dropout: 0.0,
            tp: None,
            row: false,
        }
    }

    /// A 4-bit projection without an adapter.
    pub fn quantized(base: QuantizedBase<B>) -> Self {
        Self {
            base: None,
            quantized: Some(base),
            lora: None,
            scale: 0.0,
            dropout: 0.0,
            tp: None,
            row: false,
        }
    }

    /// `[in, out]`.
    pub fn dims(&self) -> [usize; 2] {
        match (&self.base, &self.quantized) {
            (Some(linear), _) => linear.weight.dims(),
            (None, Some(q)) => [q.weight.k, q.weight.n],
            (None, None) => unreachable!("a Proj is built with a base"),
        }
    }

    /// The device the base lives on.
    pub fn device(&self) -> B::Device {
        match (&self.base, &self.quantized) {
            (Some(linear), _) => linear.weight.device(),
            (None, Some(q)) => q.weight.scales.device(),
            (None, None) => unreachable!("a Proj is built with a base"),
        }
    }

    /// Whether the base is held in 4 bits.
    pub fn is_quantized(&self) -> bool {
        self.quantized.is_some()
    }

    /// `[.., in]` → `[.., out]` (a shard's part of them, for a tensor-parallel shard).
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match (&self.tp, self.row) {
            (None, _) => self.forward_whole(x),
            (Some(group), false) => self.forward_column(x, group),
            (Some(group), true) => self.forward_row(x, group),
        }
    }

    /// The whole projection.
    fn forward_whole(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        // On rows (`[batch·seq, in]`), as every matmul here: Burn's 3-D matmul against a
        // broadcast `[1, in, r]` weight is a batched product, slower, whose weight gradient is
        // a batch of products summed afterwards.
        let low = self
            .lora
            .as_ref()
            .map(|a| rows_matmul(self.adapter_input(x.clone()), a.a.val()));
        self.base_plus_adapter(x, low)
    }

    /// What the adapter reads of the input `x`: `x` with PEFT's `lora_dropout` while
    /// training (under autodiff), `x` itself otherwise.
    pub(super) fn adapter_input(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match self.dropout > 0.0 {
            true => DropoutConfig::new(self.dropout).init().forward(x),
            false => x,
        }
    }

    /// `u·W (+ b) + scale·t·B`: the base applied to `u`, and the adapter's `B` to the low-rank
    /// product `t = x·A` (`None` without an adapter). A shard passes its own `u` and `t` (see
    /// [`super::tensor_parallel`]).
    pub(super) fn base_plus_adapter(
        &self,
        u: Tensor<B, 3>,
        t: Option<Tensor<B, 3>>,
    ) -> Tensor<B, 3> {
        let b = || {
            self.lora
                .as_ref()
                .expect("a low-rank product comes with an adapter")
                .b
                .val()
        };
        if let Some(linear) = &self.base {
            // Kiln's linear: the frozen weight gets no gradient, and the input's is one matmul.
            let y = crate::layers::linear_rows(linear, u);
            return match t {
                Some(t) => ops::add_low_rank(y, t, b(), self.scale)
                    .expect("the adapter's factors chain: rank → out"),
                None => y,
            };
        }
        let q = self
            .quantized
            .as_ref()
            .expect("a Proj is built with a base");
        // The adapter's term rides in the 4-bit matmul's epilogue (one kernel on CubeCL).
        let y = match t {
            Some(t) => ops::qlora_matmul(u, &q.weight, t, b(), self.scale),
            None => ops::quantized_matmul(u, &q.weight),
        }
        .unwrap_or_else(|e| panic!("{e}"));
        match &q.bias {
            Some(bias) => y + bias.val().unsqueeze::<3>(),
            None => y,
        }
    }

    /// Folds the adapter into a full-precision base (`W + scale·A·B`) and drops it: a 4-bit
    /// base is decoded first, as PEFT's `merge_and_unload` does.
    pub fn merge(&mut self) {
        let delta = self.lora.take().map(|a| a.delta(self.scale));
        let linear = match (self.base.take(), self.quantized.take()) {
            (Some(linear), _) => linear,
            (None, Some(q)) => Linear {
                weight: Param::from_tensor(
                    reference::qlora::dequantize(&q.weight.primitive()).detach(),
                )
                .set_require_grad(false),
                bias: q.bias,
            },
            (None, None) => unreachable!("a Proj is built with a base"),
        };
        self.base = Some(match delta {
            Some(delta) => Linear {
                weight: Param::initialized(linear.weight.id, linear.weight.val().detach() + delta),
                bias: linear.bias,
            },
            None => linear,
        });
    }
}

/// `x [.., in]·w [in, out]` on the rows of `x`.
pub(super) fn rows_matmul<B: ShardedBackend>(x: Tensor<B, 3>, w: Tensor<B, 2>) -> Tensor<B, 3> {
    ops::linear(x, w, None).expect("the adapter's factors chain: in → rank → out")
}
