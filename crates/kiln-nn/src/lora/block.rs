//! A pre-norm transformer block whose seven projections are LoRA or QLoRA layers, with the
//! fused RMSNorm and SwiGLU of `kiln-kernels`: the block of a LLaMA-style model being
//! fine-tuned, small enough to train here.

use std::path::Path;

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::LinearConfig;
use burn::record::RecorderError;
use burn::tensor::Tensor;
use kiln_kernels::{KernelBackend, ops};

use super::{LoraAdapter, LoraConfig, LoraLinear, QLoraLinear, QuantConfig};
use crate::layers::attend;

/// Dense or 4-bit base under the adapters.
#[derive(Config, Debug, PartialEq)]
pub enum LoraKind {
    /// LoRA: the base stays in the model's float type.
    Lora,
    /// QLoRA: the base is quantised to 4 bits.
    QLora(QuantConfig),
}

/// Sizes of a [`LoraBlock`].
#[derive(Config, Debug)]
pub struct LoraBlockConfig {
    /// Model width.
    pub d_model: usize,
    /// Attention heads; must divide `d_model`.
    pub heads: usize,
    /// Hidden width of the SwiGLU feed-forward.
    pub d_ff: usize,
    /// The adapters.
    pub lora: LoraConfig,
    /// The base's storage.
    pub kind: LoraKind,
    /// RMSNorm's epsilon.
    #[config(default = 1e-5)]
    pub eps: f32,
}

/// One projection: LoRA or QLoRA.
// Seven per block, held by value: the size difference costs nothing worth a Box (which Burn's
// Module derive would also have to see through).
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Projection<B: KernelBackend> {
    /// Dense frozen base.
    Lora(LoraLinear<B>),
    /// 4-bit frozen base.
    QLora(QLoraLinear<B>),
}

impl<B: KernelBackend> Projection<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match self {
            Self::Lora(l) => l.forward(x),
            Self::QLora(l) => l.forward(x),
        }
    }

    fn adapter(&self) -> &LoraAdapter<B> {
        match self {
            Self::Lora(l) => &l.adapter,
            Self::QLora(l) => &l.adapter,
        }
    }

    fn set_adapter(&mut self, adapter: LoraAdapter<B>) {
        match self {
            Self::Lora(l) => l.adapter = adapter,
            Self::QLora(l) => l.adapter = adapter,
        }
    }
}

/// `h = x + Wo·attn(RMSNorm(x))`, `y = h + W_down·SwiGLU(W_gate·n, W_up·n)` with
/// `n = RMSNorm(h)`. Only the adapters train: the bases and the norm gains are frozen, as in
/// LoRA fine-tuning of a pretrained model.
#[derive(Module, Debug)]
pub struct LoraBlock<B: KernelBackend> {
    pub(crate) norm_attn: Param<Tensor<B, 1>>,
    pub(crate) query: Projection<B>,
    pub(crate) key: Projection<B>,
    pub(crate) value: Projection<B>,
    pub(crate) output: Projection<B>,
    pub(crate) norm_ff: Param<Tensor<B, 1>>,
    pub(crate) gate: Projection<B>,
    pub(crate) up: Projection<B>,
    pub(crate) down: Projection<B>,
    pub(crate) heads: usize,
    pub(crate) eps: f32,
}

/// The seven adapters of a [`LoraBlock`], to save or load on their own.
#[derive(Module, Debug)]
pub struct LoraBlockAdapters<B: KernelBackend> {
    /// One adapter per projection, in the block's order.
    pub adapters: Vec<LoraAdapter<B>>,
}

impl LoraBlockConfig {
    /// A block over freshly initialised dense bases (standing in for pretrained weights).
    ///
    /// # Panics
    /// When `heads` does not divide `d_model` or the rank is zero.
    pub fn init<B: KernelBackend>(&self, device: &B::Device) -> LoraBlock<B> {
        assert!(
            self.heads > 0 && self.d_model.is_multiple_of(self.heads),
            "heads ({}) must divide d_model ({})",
            self.heads,
            self.d_model
        );
        assert!(
            self.lora.rank > 0,
            "a LoRA rank of 0 has no adapter; use a rank ≥ 1"
        );
        let proj = |d_in, d_out| {
            let linear = LinearConfig::new(d_in, d_out)
                .with_bias(false)
                .init::<B>(device);
            match &self.kind {
                LoraKind::Lora => Projection::Lora(LoraLinear::from_linear(linear, &self.lora)),
                LoraKind::QLora(quant) => {
                    Projection::QLora(QLoraLinear::from_linear(linear, &self.lora, quant))
                }
            }
        };
        let gain =
            || Param::from_tensor(Tensor::ones([self.d_model], device)).set_require_grad(false);
        let (d, f) = (self.d_model, self.d_ff);
        LoraBlock {
            norm_attn: gain(),
            query: proj(d, d),
            key: proj(d, d),
            value: proj(d, d),
            output: proj(d, d),
            norm_ff: gain(),
            gate: proj(d, f),
            up: proj(d, f),
            down: proj(f, d),
            heads: self.heads,
            eps: self.eps,
        }
    }
}

impl<B: KernelBackend> crate::layers::SequenceBlock<B> for LoraBlock<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        LoraBlock::forward(self, x)
    }
}

impl<B: KernelBackend> LoraBlock<B> {
    /// `[batch, seq, d_model]` → same shape, causally.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let norm = |x: Tensor<B, 3>, gain: &Param<Tensor<B, 1>>| {
            ops::rms_norm(x, gain.val(), self.eps).unwrap_or_else(|e| panic!("{e}"))
        };
        let n = norm(x.clone(), &self.norm_attn);
        let context = attend(
            self.query.forward(n.clone()),
            self.key.forward(n.clone()),
            self.value.forward(n),
            self.heads,
        );
        let h = x + self.output.forward(context);
        let n = norm(h.clone(), &self.norm_ff);
        let hidden = ops::swiglu(self.gate.forward(n.clone()), self.up.forward(n))
            .unwrap_or_else(|e| panic!("{e}"));
        h + self.down.forward(hidden)
    }

    /// The frozen bases: `(parameters, bytes on the device)`, the bytes counting a 4-bit base's
    /// codes and scales.
    pub fn base_storage(&self) -> (usize, usize) {
        self.projections()
            .into_iter()
            .fold((0, 0), |(params, bytes), p| match p {
                Projection::Lora(l) => {
                    let w = l.base.weight.val();
                    let n = w.shape().num_elements();
                    (params + n, bytes + n * w.dtype().size())
                }
                Projection::QLora(l) => {
                    (params + l.base.k * l.base.n, bytes + l.base.storage_bytes())
                }
            })
    }

    /// The seven projections, in a fixed order (the order of [`LoraBlockAdapters`]).
    fn projections(&self) -> [&Projection<B>; 7] {
        [
            &self.query,
            &self.key,
            &self.value,
            &self.output,
            &self.gate,
            &self.up,
            &self.down,
        ]
    }

    fn projections_mut(&mut self) -> [&mut Projection<B>; 7] {
        [
            &mut self.query,
            &mut self.key,
            &mut self.value,
            &mut self.output,
            &mut self.gate,
            &mut self.up,
            &mut self.down,
        ]
    }

    /// A copy of the block's adapters.
    pub fn adapters(&self) -> LoraBlockAdapters<B> {
        LoraBlockAdapters {
            adapters: self
                .projections()
                .iter()
                .map(|p| p.adapter().clone())
                .collect(),
        }
    }

    /// Replaces the block's adapters.
    pub fn with_adapters(mut self, adapters: LoraBlockAdapters<B>) -> Self {
        for (p, a) in self.projections_mut().into_iter().zip(adapters.adapters) {
            p.set_adapter(a);
        }
        self
    }

    /// Saves only the adapters (a few KB to MB; the frozen base is not written).
    pub fn save_adapters(&self, path: impl AsRef<Path>) -> Result<(), RecorderError> {
        let recorder =
            burn::record::NamedMpkFileRecorder::<burn::record::FullPrecisionSettings>::new();
        self.adapters()
            .save_file(path.as_ref().to_path_buf(), &recorder)
    }

    /// Loads adapters saved by [`LoraBlock::save_adapters`] into this block.
    pub fn load_adapters(
        self,
        path: impl AsRef<Path>,
        device: &B::Device,
    ) -> Result<Self, RecorderError> {
        let recorder =
            burn::record::NamedMpkFileRecorder::<burn::record::FullPrecisionSettings>::new();
        let expected: Vec<_> = self
            .adapters()
            .adapters
            .iter()
            .map(|a| (a.a.dims(), a.b.dims()))
            .collect();
        let loaded = self
            .adapters()
            .load_file(path.as_ref().to_path_buf(), &recorder, device)?;
        let got: Vec<_> = loaded
            .adapters
            .iter()
            .map(|a| (a.a.dims(), a.b.dims()))
            .collect();
        if got != expected {
            return Err(RecorderError::Unknown(format!(
                "adapter file {} holds adapters of shapes {got:?}, but this block's are {expected:?}",
                path.as_ref().display()
            )));
        }
        Ok(self.with_adapters(loaded))
    }
}
