//! Text generation: a key/value cache so that each new token costs one position's work, and
//! greedy or nucleus (top-p) sampling.

use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::CausalLm;
use crate::tensor_parallel::ShardedBackend;

/// The keys and values of every position seen so far, per layer (`[batch, positions,
/// kv_heads × head_dim]`, the keys rotated).
#[derive(Debug, Clone)]
pub struct KvCache<B: ShardedBackend> {
    layers: Vec<Option<(Tensor<B, 3>, Tensor<B, 3>)>>,
    len: usize,
}

impl<B: ShardedBackend> KvCache<B> {
    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// How the next token is chosen.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// 0: greedy (the most likely token); otherwise logits are divided by it.
    pub temperature: f32,
    /// Nucleus sampling: draw from the most likely tokens whose probabilities sum to `top_p`.
    pub top_p: f32,
    /// Draw from the `top_k` most likely tokens only (before the nucleus); 0 keeps them all.
    pub top_k: usize,
    /// Seed of the draws.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            max_new_tokens: 64,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }
}

impl<B: ShardedBackend> CausalLm<B> {
    /// An empty cache for this model.
    pub fn new_cache(&self) -> KvCache<B> {
        KvCache {
            layers: vec![None; self.model.layers.len()],
            len: 0,
        }
    }

    /// Logits `[batch, n, vocab]` of `tokens` `[batch, n]` at the positions after the
    /// cached ones, which they attend to; their keys and values join the cache.
    pub fn forward_cached(
        &self,
        tokens: Tensor<B, 2, Int>,
        cache: &mut KvCache<B>,
    ) -> Tensor<B, 3> {
        let hidden = self.decode_cached(tokens, cache);
        self.head(hidden)
    }

    /// [`Self::forward_cached`] before the final norm and the head: hidden states
    /// `[batch, n, hidden]`.
    fn decode_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> Tensor<B, 3> {
        let [batch, n] = tokens.dims();
        let start = cache.len;
        let decoder = &self.model;
        let mut x = decoder.embed_tokens.forward(tokens);
        let rope = decoder
            .rope
            .positions(batch, start..start + n, None, &x.device(), x.dtype());
        for (layer, entry) in decoder.layers.iter().zip(&mut cache.layers) {
            x = layer.forward_with(x, |attn, x| {
                attn.attend(x, &rope, |k, v| {
                    let (k, v) = match entry.take() {
                        Some((ck, cv)) => {
                            (Tensor::cat(vec![ck, k], 1), Tensor::cat(vec![cv, v], 1))
                        }
                        None => (k, v),
                    };
                    *entry = Some((k.clone(), v.clone()));
                    (k, v)
                })
            });
        }
        cache.len += n;
        x
    }

    /// The tokens that follow `prompt` (not including it): one pass over the prompt, then
    /// one position per token, until `sampling.max_new_tokens` or a token `stop` accepts
    /// (which is included).
    pub fn generate(
        &self,
        prompt: &[u32],
        sampling: &Sampling,
        stop: impl Fn(u32) -> bool,
    ) -> Vec<u32> {
        let device = self.model.embed_tokens.weight.device();
        let mut rng = StdRng::seed_from_u64(sampling.seed);
        let mut cache = self.new_cache();
        let mut out = Vec::new();
        let mut next: Vec<u32> = prompt.to_vec();
        while out.len() < sampling.max_new_tokens && !next.is_empty() {
            let ids: Vec<i64> = next.iter().map(|&t| i64::from(t)).collect();
            let tokens =
                Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, next.len()]), &device);
            let hidden = self.decode_cached(tokens, &mut cache);
            let n = hidden.dims()[1];
            // Only the last position's logits are needed: the head runs on it alone.
            let last = self
                .head(hidden.narrow(1, n - 1, 1))
                .flatten::<1>(0, 2)
                .into_data()
                .convert::<f32>()
                .into_vec::<f32>()
                .expect("f32 logits");
            let token = choose(&last, sampling, &mut rng);
            out.push(token);
            if stop(token) {
                break;
            }
            next = vec![token];
        }
        out
    }
}

/// The next token from one position's logits.
fn choose(logits: &[f32], sampling: &Sampling, rng: &mut StdRng) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i as u32)
    };
    if sampling.temperature <= 0.0 {
        return argmax();
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut probs: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, ((l - max) / sampling.temperature).exp()))
        .collect();
    probs.sort_by(|a, b| b.1.total_cmp(&a.1));
    // As transformers' warpers: the top k first, then the nucleus of what is left.
    if sampling.top_k > 0 {
        probs.truncate(sampling.top_k);
    }
    let total: f32 = probs.iter().map(|p| p.1).sum();
    // The nucleus: the fewest most likely tokens whose mass reaches top_p (at least one).
    let mut mass = 0.0;
    let mut keep = 0;
    for &(_, p) in &probs {
        mass += p / total;
        keep += 1;
        if mass >= sampling.top_p {
            break;
        }
    }
    probs.truncate(keep);
    let nucleus: f32 = probs.iter().map(|p| p.1).sum();
    let mut draw = rng.random::<f32>() * nucleus;
    for &(token, p) in &probs {
        if draw < p {
            return token;
        }
        draw -= p;
    }
    probs.last().map_or_else(argmax, |p| p.0)
}
