//! A pre-norm transformer block: `x + attn(norm(x))`, then `x + ff(norm(x))`.

use burn::config::Config;
use burn::module::Module;
use burn::nn::activation::{Activation, ActivationConfig};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_kernels::KernelBackend;

use super::causal_attention::{CausalSelfAttention, CausalSelfAttentionConfig, KvCache};
use super::layer_norm::{LayerNorm, LayerNormConfig};
use super::rows::{linear_rows, linear_rows_relu, linear_rows_residual};

/// Configuration of [`PreNormBlock`].
#[derive(Config, Debug)]
pub struct PreNormBlockConfig {
    /// Model width.
    pub d_model: usize,
    /// Feed-forward width.
    pub d_ff: usize,
    /// Attention heads; must divide `d_model`.
    pub heads: usize,
    /// The feed-forward activation.
    #[config(default = "ActivationConfig::Gelu")]
    pub activation: ActivationConfig,
}

impl PreNormBlockConfig {
    /// Builds the block on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> PreNormBlock<B> {
        PreNormBlock {
            norm_attn: LayerNormConfig::new(self.d_model).init(device),
            attn: CausalSelfAttentionConfig::new(self.d_model, self.heads).init(device),
            norm_ff: LayerNormConfig::new(self.d_model).init(device),
            ff_in: LinearConfig::new(self.d_model, self.d_ff).init(device),
            ff_out: LinearConfig::new(self.d_ff, self.d_model).init(device),
            activation: self.activation.init(device),
        }
    }
}

/// Causal self-attention and a feed-forward (GELU by default), each on a layer-normalised input and added
/// back to the residual stream (GPT-2's block, without dropout).
///
/// # Shapes
/// `[batch, seq, d_model]` → `[batch, seq, d_model]`.
#[derive(Module, Debug)]
pub struct PreNormBlock<B: Backend> {
    pub(crate) norm_attn: LayerNorm<B>,
    pub(crate) attn: CausalSelfAttention<B>,
    pub(crate) norm_ff: LayerNorm<B>,
    pub(crate) ff_in: Linear<B>,
    pub(crate) ff_out: Linear<B>,
    pub(crate) activation: Activation<B>,
}

impl<B: KernelBackend> super::SequenceBlock<B> for PreNormBlock<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        PreNormBlock::forward(self, x)
    }
}

impl<B: KernelBackend> PreNormBlock<B> {
    /// Applies the block.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward_cached(x, &mut KvCache::new())
    }

    /// Applies the block to the positions that follow those in `cache`, which their
    /// attention reads and extends (see [`CausalSelfAttention::forward_cached`]).
    pub fn forward_cached(&self, x: Tensor<B, 3>, cache: &mut KvCache<B>) -> Tensor<B, 3> {
        // Each residual is added in its output projection's pass, and ReLU in the first
        // feed-forward layer's: one launch after each matmul on a GPU.
        let x = self
            .attn
            .forward_residual(self.norm_attn.forward(x.clone()), x, cache);
        let normed = self.norm_ff.forward(x.clone());
        let hidden = match &self.activation {
            Activation::Relu(_) => linear_rows_relu(&self.ff_in, normed),
            activation => activation.forward(linear_rows(&self.ff_in, normed)),
        };
        linear_rows_residual(&self.ff_out, hidden, x)
    }
}
