//! The LLaMA-family decoder: field names follow Hugging Face's (`model.layers.0.self_attn.q_proj`),
//! so checkpoints load by name.

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::{Int, Tensor};
use kiln_kernels::{KernelBackend, ops};

use super::{LlmConfig, Proj, Rope};

/// Grouped-query self-attention with rotary positions.
#[derive(Module, Debug)]
pub struct Attention<B: KernelBackend> {
    /// Queries: `hidden → heads × head_dim`.
    pub q_proj: Proj<B>,
    /// Keys: `hidden → kv_heads × head_dim`.
    pub k_proj: Proj<B>,
    /// Values: `hidden → kv_heads × head_dim`.
    pub v_proj: Proj<B>,
    /// Output: `heads × head_dim → hidden`.
    pub o_proj: Proj<B>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl<B: KernelBackend> Attention<B> {
    fn forward(&self, x: Tensor<B, 3>, rope: &Rope) -> Tensor<B, 3> {
        let [batch, seq, _] = x.dims();
        let (h, kv, d) = (self.heads, self.kv_heads, self.head_dim);
        let q = self.q_proj.forward(x.clone()).reshape([batch, seq, h, d]);
        let k = self.k_proj.forward(x.clone()).reshape([batch, seq, kv, d]);
        let v = self.v_proj.forward(x).reshape([batch, seq, kv, d]);
        let (q, k) = (rope.apply(q, 0), rope.apply(k, 0));
        // Each key/value head serves heads / kv_heads query heads, in order.
        let repeat = |t: Tensor<B, 4>| {
            if kv == h {
                t
            } else {
                t.unsqueeze_dim::<5>(3)
                    .expand([batch, seq, kv, h / kv, d])
                    .reshape([batch, seq, h, d])
            }
        };
        let flat = |t: Tensor<B, 4>| t.reshape([batch, seq, h * d]);
        let context = ops::causal_attention(flat(q), flat(repeat(k)), flat(repeat(v)), h)
            .unwrap_or_else(|e| panic!("{e}"));
        self.o_proj.forward(context)
    }
}

/// The SwiGLU feed-forward: `down(silu(gate(x)) · up(x))`.
#[derive(Module, Debug)]
pub struct Mlp<B: KernelBackend> {
    /// `hidden → intermediate`, through SiLU.
    pub gate_proj: Proj<B>,
    /// `hidden → intermediate`.
    pub up_proj: Proj<B>,
    /// `intermediate → hidden`.
    pub down_proj: Proj<B>,
}

impl<B: KernelBackend> Mlp<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let hidden = ops::swiglu(self.gate_proj.forward(x.clone()), self.up_proj.forward(x))
            .unwrap_or_else(|e| panic!("{e}"));
        self.down_proj.forward(hidden)
    }
}

/// One pre-norm decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: KernelBackend> {
    /// The norm before attention.
    pub input_layernorm: RmsNorm<B>,
    /// Self-attention.
    pub self_attn: Attention<B>,
    /// The norm before the feed-forward.
    pub post_attention_layernorm: RmsNorm<B>,
    /// The feed-forward.
    pub mlp: Mlp<B>,
}

impl<B: KernelBackend> DecoderLayer<B> {
    /// `[batch, seq, hidden]` → same shape, causally.
    pub fn forward(&self, x: Tensor<B, 3>, rope: &Rope) -> Tensor<B, 3> {
        let h = x.clone()
            + self
                .self_attn
                .forward(self.input_layernorm.forward(x), rope);
        h.clone() + self.mlp.forward(self.post_attention_layernorm.forward(h))
    }
}

/// The embedding, the layers and the final norm (Hugging Face's `model`).
#[derive(Module, Debug)]
pub struct Decoder<B: KernelBackend> {
    /// Token embedding `[vocab, hidden]`.
    pub embed_tokens: Embedding<B>,
    /// The decoder layers.
    pub layers: Vec<DecoderLayer<B>>,
    /// The final norm.
    pub norm: RmsNorm<B>,
    #[module(skip)]
    rope: Rope,
}

/// A causal language model: [`Decoder`] and the LM head (`None`: tied to the embedding).
#[derive(Module, Debug)]
pub struct CausalLm<B: KernelBackend> {
    /// The decoder.
    pub model: Decoder<B>,
    /// `hidden → vocab`; `None` when tied to the embedding.
    pub lm_head: Option<Linear<B>>,
}

impl LlmConfig {
    /// A model of these sizes with freshly initialised weights (what [`super::load`] fills).
    pub fn init<B: KernelBackend>(&self, device: &B::Device) -> CausalLm<B> {
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
    pub fn build<B: KernelBackend, E>(
        &self,
        device: &B::Device,
        proj: &mut dyn FnMut(&str, usize, usize, bool) -> Result<Proj<B>, E>,
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
            },
            lm_head: (!self.tie_word_embeddings).then(|| {
                LinearConfig::new(d, self.vocab_size)
                    .with_bias(false)
                    .init::<B>(device)
            }),
        })
    }
}

impl<B: KernelBackend> CausalLm<B> {
    /// Logits `[batch, seq, vocab]` of the tokens `[batch, seq]`, each position seeing itself
    /// and the ones before.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let decoder = &self.model;
        let mut x = decoder.embed_tokens.forward(tokens);
        for layer in &decoder.layers {
            x = layer.forward(x, &decoder.rope);
        }
        let x = decoder.norm.forward(x);
        match &self.lm_head {
            Some(head) => head.forward(x),
            None => {
                let embedding = decoder.embed_tokens.weight.val();
                x.matmul(embedding.transpose().unsqueeze_dim(0))
            }
        }
    }
}
