//! LoRA over a frozen dense `Linear`.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::{LoraAdapter, LoraConfig};

/// A frozen Burn `Linear` plus a trainable low-rank adapter. Merging folds `scale·A·B` into
/// the weight for inference at no extra cost; unmerging takes it out again.
#[derive(Module, Debug)]
pub struct LoraLinear<B: Backend> {
    /// The frozen base (its parameters do not require gradients).
    pub base: Linear<B>,
    /// The trainable adapter.
    pub adapter: LoraAdapter<B>,
    pub(crate) dropout: Dropout,
    pub(crate) scale: f32,
    pub(crate) merged: bool,
}

impl<B: Backend> LoraLinear<B> {
    /// Wraps `linear`, freezing it, with a fresh adapter (so the output is unchanged).
    pub fn from_linear(linear: Linear<B>, config: &LoraConfig) -> Self {
        let [d_in, d_out] = linear.weight.dims();
        let device = linear.weight.device();
        Self {
            // Materialise Burn's lazily initialised weights so that clones share them.
            base: linear.fork(&device).no_grad(),
            adapter: LoraAdapter::new(d_in, d_out, config.rank, &device),
            dropout: DropoutConfig::new(config.dropout).init(),
            scale: config.scale(),
            merged: false,
        }
    }

    /// `x·W (+ bias) + scale·dropout(x)·A·B` over `[.., d_in]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let y = self.base.forward(x.clone());
        if self.merged {
            return y;
        }
        let a = self.adapter.a.val().unsqueeze::<D>();
        let b = self.adapter.b.val().unsqueeze::<D>();
        y + self
            .dropout
            .forward(x)
            .matmul(a)
            .matmul(b)
            .mul_scalar(self.scale)
    }

    /// Whether the adapter is folded into the base weight.
    pub fn is_merged(&self) -> bool {
        self.merged
    }

    /// Folds `scale·A·B` into the base weight; the forward pass is then one matmul. A no-op
    /// when already merged.
    pub fn merge(mut self) -> Self {
        if !self.merged {
            let delta = self.adapter.delta(self.scale);
            self.base.weight = self.base.weight.map(|w| w + delta).set_require_grad(false);
            self.merged = true;
        }
        self
    }

    /// Takes `scale·A·B` back out of the base weight (up to f32 rounding). A no-op when not
    /// merged.
    pub fn unmerge(mut self) -> Self {
        if self.merged {
            let delta = self.adapter.delta(self.scale);
            self.base.weight = self.base.weight.map(|w| w - delta).set_require_grad(false);
            self.merged = false;
        }
        self
    }
}
