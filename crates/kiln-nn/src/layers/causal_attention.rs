//! Causal multi-head self-attention with the causal mask written out at the scores' full shape.
//!
//! Burn's `MultiHeadAttention` takes a boolean mask `[batch, seq, seq]` and `mask_fill`s the
//! `[batch, heads, seq, seq]` scores through a broadcast view of it. On CPU backends that view
//! is expanded by a strided copy in the forward pass and again in the backward pass, which cost
//! about 8 % of a training step of the AD model. A contiguous mask of the full shape, built
//! directly, is read in place both times. (An additive `[seq, seq]` float bias is no better on
//! Flex: the broadcast add takes the same strided path.)

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor, TensorData};

/// What masked scores are set to: `exp` of it underflows to exactly 0 next to any real score.
const MASKED: f32 = -1.0e9;

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
    query: Linear<B>,
    key: Linear<B>,
    value: Linear<B>,
    output: Linear<B>,
    heads: usize,
}

impl<B: Backend> CausalSelfAttention<B> {
    /// Attends causally over `x`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let context = attend(
            self.query.forward(x.clone()),
            self.key.forward(x.clone()),
            self.value.forward(x),
            self.heads,
        );
        self.output.forward(context)
    }
}

/// Causal multi-head attention of already projected queries, keys and values, each
/// `[batch, seq, d_model]`: the context `[batch, seq, d_model]` before the output projection.
/// Shared by every attention layer whose projections differ (dense, LoRA, QLoRA).
pub fn attend<B: Backend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    heads: usize,
) -> Tensor<B, 3> {
    let [batch, seq, d_model] = q.dims();
    let d_head = d_model / heads;
    let split = |t: Tensor<B, 3>| t.reshape([batch, seq, heads, d_head]).swap_dims(1, 2);
    // Scaling the queries touches seq × d_model values instead of seq × seq per head.
    let q = split(q.mul_scalar((d_head as f64).powf(-0.5)));
    let mask = causal_mask::<B>([batch, heads, seq, seq], &q.device());
    let weights = softmax(
        q.matmul(split(k).swap_dims(2, 3)).mask_fill(mask, MASKED),
        3,
    );
    weights
        .matmul(split(v))
        .swap_dims(1, 2)
        .reshape([batch, seq, d_model])
}

fn causal_mask<B: Backend>(shape: [usize; 4], device: &B::Device) -> Tensor<B, 4, Bool> {
    let [batch, heads, seq, _] = shape;
    let one: Vec<bool> = (0..seq)
        .flat_map(|i| (0..seq).map(move |j| j > i))
        .collect();
    let values = one.repeat(batch * heads);
    Tensor::from_data(TensorData::new(values, shape), device)
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::nn::attention::{MhaInput, MultiHeadAttentionConfig, generate_autoregressive_mask};
    use burn::tensor::{Distribution, Tolerance};

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
