//! The LLaMA-family decoder: field names follow Hugging Face's (`model.layers.0.self_attn.q_proj`),
//! so checkpoints load by name.

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::{Int, Tensor};
use kiln_kernels::ops;

use super::{LlmConfig, PackedRows, Positions, Proj, Rope};
use crate::layers::rms_norm;
use crate::tensor_parallel::ShardedBackend;

/// Grouped-query self-attention with rotary positions.
#[derive(Module, Debug)]
pub struct Attention<B: ShardedBackend> {
    /// Queries: `hidden → heads × head_dim`.
    pub q_proj: Proj<B>,
    /// Keys: `hidden → kv_heads × head_dim`.
    pub k_proj: Proj<B>,
    /// Values: `hidden → kv_heads × head_dim`.
    pub v_proj: Proj<B>,
    /// Output: `heads × head_dim → hidden`.
    pub o_proj: Proj<B>,
    /// Qwen3's RMSNorm over each query head (`[head_dim]`), before the rotation.
    pub q_norm: Option<RmsNorm<B>>,
    /// Qwen3's RMSNorm over each key head.
    pub k_norm: Option<RmsNorm<B>>,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) head_dim: usize,
}

impl<B: ShardedBackend> Attention<B> {
    fn forward(&self, x: Tensor<B, 3>, rope: &Positions<B>) -> Tensor<B, 3> {
        self.attend(x, rope, |k, v| (k, v))
    }

    /// Attention of `x` `[batch, n, hidden]` at the positions of `rope`'s tables. `context`
    /// is given their rotated keys and values `[batch, n, kv_heads × head_dim]` and returns the
    /// keys and values attended to, which end with them: themselves when training, the
    /// cached positions before them when generating.
    pub(super) fn attend(
        &self,
        x: Tensor<B, 3>,
        rope: &Positions<B>,
        context: impl FnOnce(Tensor<B, 3>, Tensor<B, 3>) -> (Tensor<B, 3>, Tensor<B, 3>),
    ) -> Tensor<B, 3> {
        let [batch, n, _] = x.dims();
        let (h, kv, d) = (self.heads, self.kv_heads, self.head_dim);
        let q = self.q_proj.forward(x.clone()).reshape([batch, n, h, d]);
        let k = self.k_proj.forward(x.clone()).reshape([batch, n, kv, d]);
        let norm = |x: Tensor<B, 4>, norm: &Option<RmsNorm<B>>| match norm {
            Some(norm) => rms_norm(norm, x),
            None => x,
        };
        let (q, k) = (norm(q, &self.q_norm), norm(k, &self.k_norm));
        let v = self.v_proj.forward(x);
        let q = rope.apply(q).reshape([batch, n, h * d]);
        let k = rope.apply(k).reshape([batch, n, kv * d]);
        let (k, v) = context(k, v);
        // Each key/value head serves heads / kv_heads query heads, in order: the attention
        // reads the shared heads as they are (grouped-query attention).
        let out = rope.attend(q, k, v, h);
        self.o_proj.forward(out)
    }
}

/// The SwiGLU feed-forward: `down(silu(gate(x)) · up(x))`.
#[derive(Module, Debug)]
pub struct Mlp<B: ShardedBackend> {
    /// `hidden → intermediate`, through SiLU.
    pub gate_proj: Proj<B>,
    /// `hidden → intermediate`.
    pub up_proj: Proj<B>,
    /// `intermediate → hidden`.
    pub down_proj: Proj<B>,
}

impl<B: ShardedBackend> Mlp<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let hidden = ops::swiglu(self.gate_proj.forward(x.clone()), self.up_proj.forward(x))
            .unwrap_or_else(|e| panic!("{e}"));
        self.down_proj.forward(hidden)
    }
}

/// One pre-norm decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: ShardedBackend> {
    /// The norm before attention.
    pub input_layernorm: RmsNorm<B>,
    /// Self-attention.
    pub self_attn: Attention<B>,
    /// The norm before the feed-forward.
    pub post_attention_layernorm: RmsNorm<B>,
    /// The feed-forward.
    pub mlp: Mlp<B>,
}

impl<B: ShardedBackend> DecoderLayer<B> {
    /// `[batch, seq, hidden]` → same shape, causally.
    pub fn forward(&self, x: Tensor<B, 3>, rope: &Positions<B>) -> Tensor<B, 3> {
        self.forward_with(x, |attn, x| attn.forward(x, rope))
    }

    /// The layer with `attend` as its attention (the cached one when generating).
    pub(super) fn forward_with(
        &self,
        x: Tensor<B, 3>,
        attend: impl FnOnce(&Attention<B>, Tensor<B, 3>) -> Tensor<B, 3>,
    ) -> Tensor<B, 3> {
        let h = x.clone() + attend(&self.self_attn, rms_norm(&self.input_layernorm, x));
        h.clone()
            + self
                .mlp
                .forward(rms_norm(&self.post_attention_layernorm, h))
    }
}

/// The embedding, the layers and the final norm (Hugging Face's `model`).
#[derive(Module, Debug)]
pub struct Decoder<B: ShardedBackend> {
    /// Token embedding `[vocab, hidden]`.
    pub embed_tokens: Embedding<B>,
    /// The decoder layers.
    pub layers: Vec<DecoderLayer<B>>,
    /// The final norm.
    pub norm: RmsNorm<B>,
    #[module(skip)]
    pub(super) rope: Rope,
    /// Whether a training step recomputes each layer's activations in its backward
    /// ([`CausalLm::with_gradient_checkpointing`]).
    #[module(skip)]
    pub(super) checkpointing: bool,
}

/// A causal language model: [`Decoder`] and the LM head (`None`: tied to the embedding).
#[derive(Module, Debug)]
pub struct CausalLm<B: ShardedBackend> {
    /// The decoder.
    pub model: Decoder<B>,
    /// `hidden → vocab`; `None` when tied to the embedding.
    pub lm_head: Option<Linear<B>>,
}

/// What [`LlmConfig::build`] calls for each projection: its Hugging Face path, `in`, `out` and
/// whether it has a bias, to the projection.
pub type ProjBuilder<'a, B, E> = dyn FnMut(&str, usize, usize, bool) -> Result<Proj<B>, E> + 'a;

impl LlmConfig {
    /// A model of these sizes with freshly initialised weights (what [`super::load`] fills).
    pub fn init<B: ShardedBackend>(&self, device: &B::Device) -> CausalLm<B> {
        let linear = |i, o, bias| LinearConfig::new(i, o).with_bias(bias).init::<B>(device);
        let built = self.build(device, &mut |_, d_in, d_out, bias| {
            Ok::<_, std::convert::Infallible>(Proj::dense(linear(d_in, d_out, bias)))
        });
        let Ok(model) = built;
        model
    }

    /// A model of these sizes whose seven projections per layer come from `proj`, called
    /// layer by layer with each projection's Hugging Face path
    /// (`model.layers.0.self_attn.q_proj`), `in`, `out` and whether it has a bias; the
    /// embedding, the norms and the head are freshly initialised.
    ///
    /// # Errors
    /// The first error `proj` returns.
    pub fn build<B: ShardedBackend, E>(
        &self,
        device: &B::Device,
        proj: &mut ProjBuilder<'_, B, E>,
    ) -> Result<CausalLm<B>, E> {
        let (d, f) = (self.hidden_size, self.intermediate_size);
        let (q, kv) = (
            self.num_attention_heads * self.head_dim,
            self.num_key_value_heads * self.head_dim,
        );
        let norm = || {
            RmsNormConfig::new(d)
                .with_epsilon(self.rms_norm_eps)
                .init::<B>(device)
        };
        let head_norm = || {
            RmsNormConfig::new(self.head_dim)
                .with_epsilon(self.rms_norm_eps)
                .init::<B>(device)
        };
        let mut layers = Vec::with_capacity(self.num_hidden_layers);
        for i in 0..self.num_hidden_layers {
            let attn = format!("model.layers.{i}.self_attn");
            let mlp = format!("model.layers.{i}.mlp");
            layers.push(DecoderLayer {
                input_layernorm: norm(),
                self_attn: Attention {
                    q_proj: proj(&format!("{attn}.q_proj"), d, q, self.qkv_bias)?,
                    k_proj: proj(&format!("{attn}.k_proj"), d, kv, self.qkv_bias)?,
                    v_proj: proj(&format!("{attn}.v_proj"), d, kv, self.qkv_bias)?,
                    o_proj: proj(&format!("{attn}.o_proj"), q, d, self.o_bias)?,
                    q_norm: self.qk_norm.then(head_norm),
                    k_norm: self.qk_norm.then(head_norm),
                    heads: self.num_attention_heads,
                    kv_heads: self.num_key_value_heads,
                    head_dim: self.head_dim,
                },
                post_attention_layernorm: norm(),
                mlp: Mlp {
                    gate_proj: proj(&format!("{mlp}.gate_proj"), d, f, false)?,
                    up_proj: proj(&format!("{mlp}.up_proj"), d, f, false)?,
                    down_proj: proj(&format!("{mlp}.down_proj"), f, d, false)?,
                },
            });
        }
        Ok(CausalLm {
            model: Decoder {
                embed_tokens: EmbeddingConfig::new(self.vocab_size, d).init(device),
                layers,
                norm: norm(),
                rope: Rope::new(self),
                checkpointing: false,
            },
            lm_head: (!self.tie_word_embeddings).then(|| {
                LinearConfig::new(d, self.vocab_size)
                    .with_bias(false)
                    .init::<B>(device)
            }),
        })
    }
}

impl<B: ShardedBackend> CausalLm<B> {
    /// Logits `[batch, seq, vocab]` of the tokens `[batch, seq]`, each position seeing itself
    /// and the ones before.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.forward_packed(tokens, None)
    }

    /// [`Self::forward`] of rows that may pack several examples (`packed`): each example's
    /// positions count from 0 and its tokens see only its own.
    pub fn forward_packed(
        &self,
        tokens: Tensor<B, 2, Int>,
        packed: Option<&PackedRows<B>>,
    ) -> Tensor<B, 3> {
        let decoder = &self.model;
        let [batch, seq] = tokens.dims();
        let mut x = decoder.embed_tokens.forward(tokens);
        let rope = decoder
            .rope
            .positions(batch, 0..seq, packed, &x.device(), x.dtype());
        for layer in &decoder.layers {
            x = layer.forward(x, &rope);
        }
        self.head(x)
    }

    /// The final norm and the LM head: hidden states `[batch, seq, hidden]` to logits.
    pub(super) fn head(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = rms_norm(&self.model.norm, x);
        match &self.lm_head {
            Some(head) => crate::layers::linear_rows(head, x),
            None => tied_logits(x, &self.model.embed_tokens),
        }
    }
}

/// The logits of a head tied to `embedding`: normed hidden states `[batch, seq, hidden]` times
/// the embedding's transpose.
pub(super) fn tied_logits<B: ShardedBackend>(
    x: Tensor<B, 3>,
    embedding: &Embedding<B>,
) -> Tensor<B, 3> {
    // On rows, as every matmul of the model: a 3-D matmul against the broadcast weight is a
    // batched product, slower, whose weight gradient is a batch of products summed afterwards.
    ops::linear(x, embedding.weight.val().transpose(), None)
        .expect("the embedding's width is the hidden states'")
}
