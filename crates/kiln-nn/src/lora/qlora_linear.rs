//! LoRA over a frozen 4-bit base: the QLoRA layer.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::Tensor;
use kiln_kernels::quant::QuantizedWeight;
use kiln_kernels::{KernelBackend, QuantFormat, ScaleDtype, ops, reference};

use super::{LoraAdapter, LoraConfig};

/// How the base weight is quantised.
#[derive(Config, Debug, PartialEq)]
pub struct QuantConfig {
    /// The 4-bit code book.
    #[config(default = "QuantFormat::Nf4")]
    pub format: QuantFormat,
    /// The precision of the per-64-value scales.
    #[config(default = "ScaleDtype::F32")]
    pub scales: ScaleDtype,
}

/// A base weight frozen in 4 bits (≤ 0.5625 bytes per parameter) plus a trainable adapter.
/// The forward pass is one fused kernel on the CubeCL backends (dequantising inside the matmul
/// tile) and the plain-Burn reference elsewhere; the base gets no gradient and nothing of its
/// size is allocated for one.
#[derive(Module, Debug)]
pub struct QLoraLinear<B: KernelBackend> {
    /// The frozen 4-bit base.
    pub base: QuantizedWeight<B>,
    /// The frozen bias of the original layer, if it had one.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// The trainable adapter.
    pub adapter: LoraAdapter<B>,
    pub(crate) dropout: Dropout,
    pub(crate) scale: f32,
}

impl<B: KernelBackend> QLoraLinear<B> {
    /// Quantises `linear`'s weight block-wise and adds a fresh adapter.
    pub fn from_linear(linear: Linear<B>, lora: &LoraConfig, quant: &QuantConfig) -> Self {
        let [d_in, d_out] = linear.weight.dims();
        let device = linear.weight.device();
        Self {
            base: QuantizedWeight::quantize(&linear.weight.val(), quant.format, quant.scales),
            bias: linear.bias.map(|b| b.set_require_grad(false)),
            adapter: LoraAdapter::new(d_in, d_out, lora.rank, &device),
            dropout: DropoutConfig::new(lora.dropout).init(),
            scale: lora.scale(),
        }
    }

    /// `x·deq(W) (+ bias) + scale·dropout(x)·A·B` over `[.., d_in]`.
    ///
    /// # Panics
    /// When `x`'s last dimension is not the layer's `d_in` (with the message of
    /// [`ops::KernelError`]), as Burn's own `Linear` panics on a mismatched input.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let t = self
            .dropout
            .forward(x.clone())
            .matmul(self.adapter.a.val().unsqueeze::<D>());
        let y = ops::qlora_matmul(x, &self.base, t, self.adapter.b.val(), self.scale)
            .unwrap_or_else(|e| panic!("{e}"));
        match &self.bias {
            Some(bias) => y + bias.val().unsqueeze::<D>(),
            None => y,
        }
    }

    /// A dense `Linear` computing what this layer computes without dropout:
    /// `deq(W) + scale·A·B`, for inference or export. The 4-bit base is not touched.
    pub fn merge(&self) -> Linear<B> {
        let weight = reference::qlora::dequantize(&self.base.primitive()).detach()
            + self.adapter.delta(self.scale);
        Linear {
            weight: Param::from_tensor(weight),
            bias: self.bias.clone(),
        }
    }

    /// The inverse of [`QLoraLinear::merge`]: subtracts `scale·A·B` from a merged `Linear`
    /// and quantises the rest again. Because `merge` wrote the decoded values exactly, the
    /// codes come back the same (the test checks it) and the scales within f32 rounding.
    pub fn unmerge(
        merged: Linear<B>,
        adapter: LoraAdapter<B>,
        lora: &LoraConfig,
        quant: &QuantConfig,
    ) -> Self {
        let base = merged.weight.val() - adapter.delta(lora.scale());
        Self {
            base: QuantizedWeight::quantize(&base, quant.format, quant.scales),
            bias: merged.bias.map(|b| b.set_require_grad(false)),
            adapter,
            dropout: DropoutConfig::new(lora.dropout).init(),
            scale: lora.scale(),
        }
    }
}
