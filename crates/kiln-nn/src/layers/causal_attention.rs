//! Causal multi-head self-attention through Kiln's fused kernel
//! ([`kiln_kernels::ops::causal_attention`]): on the CPU one pass per head over the
//! projections as they are (no head split or merge copies, no `[batch, heads, seq, seq]` mask
//! or score tensor); elsewhere the plain-Burn composite.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_kernels::{KernelBackend, ops};

use super::rows::{linear_rows, linear_rows_residual};

/// Configuration of [`CausalSelfAttention`].
#[derive(Config, Debug)]
pub struct CausalSelfAttentionConfig {
    /// Model width.
    pub d_model: usize,
    /// Heads; must divide `d_model`.
    pub heads: usize,
}

impl CausalSelfAttentionConfig {
    /// Builds the layer on `device`.
    ///
    /// # Panics
    /// When `heads` does not divide `d_model` (a configuration bug, checked by callers' configs).
    pub fn init<B: Backend>(&self, device: &B::Device) -> CausalSelfAttention<B> {
        assert!(
            self.heads > 0 && self.d_model.is_multiple_of(self.heads),
            "heads ({}) must divide d_model ({})",
            self.heads,
            self.d_model
        );
        let linear = || LinearConfig::new(self.d_model, self.d_model).init(device);
        CausalSelfAttention {
            query: linear(),
            key: linear(),
            value: linear(),
            output: linear(),
            heads: self.heads,
        }
    }
}

/// Softmax attention of every position over itself and the positions before it.
///
/// # Shapes
/// `[batch, seq, d_model]` → `[batch, seq, d_model]`.
#[derive(Module, Debug)]
pub struct CausalSelfAttention<B: Backend> {
    pub(crate) query: Linear<B>,
    pub(crate) key: Linear<B>,
    pub(crate) value: Linear<B>,
    pub(crate) output: Linear<B>,
    pub(crate) heads: usize,
}

impl<B: KernelBackend> CausalSelfAttention<B> {
    /// Attends causally over `x`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward_cached(x, &mut KvCache::new())
    }

    /// Attends causally over the positions in `cache` followed by `x`'s, the positions that
    /// come next, and adds `x`'s keys and values to the cache: `[batch, new, d_model]` →
    /// `[batch, new, d_model]`. A decoder calls it with one new position per step; with an
    /// empty cache it is [`Self::forward`].
    pub fn forward_cached(&self, x: Tensor<B, 3>, cache: &mut KvCache<B>) -> Tensor<B, 3> {
        linear_rows(&self.output, self.context(x, cache))
    }

    /// `residual + self.forward_cached(x, cache)`, the residual added in the output
    /// projection's pass ([`linear_rows_residual`]): a block's attention half.
    pub fn forward_residual(
        &self,
        x: Tensor<B, 3>,
        residual: Tensor<B, 3>,
        cache: &mut KvCache<B>,
    ) -> Tensor<B, 3> {
        linear_rows_residual(&self.output, self.context(x, cache), residual)
    }

    /// The heads' context before the output projection.
    fn context(&self, x: Tensor<B, 3>, cache: &mut KvCache<B>) -> Tensor<B, 3> {
        let project = |linear: &Linear<B>| linear_rows(linear, x.clone());
        let (k, v) = cache.extend(project(&self.key), project(&self.value));
        attend(project(&self.query), k, v, self.heads)
    }
}

/// The keys and values `[batch, positions, d_model]` an attention layer has computed so far,
/// so that a decoder computes each position's once.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    keys_values: Option<(Tensor<B, 3>, Tensor<B, 3>)>,
}

impl<B: Backend> Default for KvCache<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend> KvCache<B> {
    /// An empty cache.
    pub fn new() -> Self {
        Self { keys_values: None }
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.keys_values.as_ref().map_or(0, |(k, _)| k.dims()[1])
    }

    /// Whether no position is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the new positions' keys and values; returns all of them.
    fn extend(&mut self, k: Tensor<B, 3>, v: Tensor<B, 3>) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let all = match self.keys_values.take() {
            None => (k, v),
            Some((keys, values)) => (
                Tensor::cat(vec![keys, k], 1),
                Tensor::cat(vec![values, v], 1),
            ),
        };
        self.keys_values = Some(all.clone());
        all
    }
}

/// Causal multi-head attention of already projected queries, keys and values, each
/// `[batch, seq, d_model]`: the context `[batch, seq, d_model]` before the output projection.
/// Shared by every attention layer whose projections differ (dense, LoRA, QLoRA).
///
/// # Panics
/// When the three shapes differ or `heads` does not divide `d_model` (the layers' configs
/// check both when they are built).
pub fn attend<B: KernelBackend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    heads: usize,
) -> Tensor<B, 3> {
    ops::causal_attention(q, k, v, heads).unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::nn::attention::{MhaInput, MultiHeadAttentionConfig, generate_autoregressive_mask};
    use burn::tensor::{Distribution, TensorData, Tolerance};

    use super::*;

    type B = Autodiff<Flex>;

    /// Same weights, same inputs: the result equals Burn's masked `MultiHeadAttention`, and
    /// the gradient of the input too.
    #[test]
    fn matches_burns_masked_multi_head_attention() {
        let device = Default::default();
        B::seed(&device, 3);
        let (batch, seq, d_model, heads) = (3, 7, 12, 3);
        let burn_mha = MultiHeadAttentionConfig::new(d_model, heads)
            .with_dropout(0.0)
            .init::<B>(&device)
            // Materialise the lazily initialised weights before sharing them.
            .fork(&device);
        let ours = CausalSelfAttention {
            query: burn_mha.query.clone(),
            key: burn_mha.key.clone(),
            value: burn_mha.value.clone(),
            output: burn_mha.output.clone(),
            heads,
        };
        let x = Tensor::<B, 3>::random(
            [batch, seq, d_model],
            Distribution::Normal(0.0, 1.0),
            &device,
        )
        .require_grad();
        let mask = generate_autoregressive_mask::<B>(batch, seq, &device);
        let expected = burn_mha
            .forward(MhaInput::self_attn(x.clone()).mask_attn(mask))
            .context;
        let actual = ours.forward(x.clone());
        actual
            .clone()
            .into_data()
            .assert_approx_eq::<f32>(&expected.clone().into_data(), Tolerance::absolute(1e-5));

        let grad_expected = x.grad(&(expected.powi_scalar(2).sum()).backward()).unwrap();
        let grad_actual = x.grad(&(actual.powi_scalar(2).sum()).backward()).unwrap();
        grad_actual
            .into_data()
            .assert_approx_eq::<f32>(&grad_expected.into_data(), Tolerance::absolute(1e-5));
    }

    #[test]
    fn a_position_ignores_the_future() {
        let device = Default::default();
        let layer = CausalSelfAttentionConfig::new(8, 2).init::<Flex>(&device);
        let x = Tensor::<Flex, 3>::random([1, 5, 8], Distribution::Normal(0.0, 1.0), &device);
        let mut changed = x.clone().into_data().to_vec::<f32>().unwrap();
        for v in &mut changed[4 * 8..] {
            *v += 10.0;
        }
        let y = layer.forward(x).narrow(1, 0, 4);
        let y_changed = layer
            .forward(Tensor::from_data(
                TensorData::new(changed, [1, 5, 8]),
                &device,
            ))
            .narrow(1, 0, 4);
        y.into_data()
            .assert_approx_eq::<f32>(&y_changed.into_data(), Tolerance::absolute(1e-6));
    }
}
