//! The AD transformer: one token per step, a causal pre-norm transformer, and the source's
//! next action as the target at every position.

use burn::module::{AutodiffModule, Module, Param};
use burn::nn::activation::ActivationConfig;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{FloatDType, Int, Tensor};
use burn::train::{SequenceOutput, TrainOutput, TrainStep};
use kiln_core::model::LowPrecisionStep;
use kiln_kernels::{KernelBackend, ops};
use kiln_nn::layers::{
    KvCache, LayerNorm, LayerNormConfig, PreNormBlock, PreNormBlockConfig, SequenceBlock,
    linear_rows, run_blocks,
};
use serde::{Deserialize, Serialize};

use crate::dataset::{AdBatch, feature_width};
use crate::env::{ACTIONS, DarkRoomConfig};

/// Shape of the [`AdTransformer`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdModelConfig {
    /// Steps of context (tokens), the longest window the model reads.
    pub context: usize,
    /// Model width.
    pub d_model: usize,
    /// Transformer layers.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Feed-forward width.
    pub d_ff: usize,
    /// Feed-forward activation.
    pub activation: FeedForwardActivation,
}

/// The activation between the two feed-forward layers.
///
/// ReLU is the default: on the CPU, GELU's `erf` and its backward took about a tenth of this
/// model's training step in a profile of `benches/ad_step.rs`, and Dark Room needs nothing
/// smoother.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeedForwardActivation {
    /// `max(x, 0)`.
    #[default]
    Relu,
    /// The exact, `erf`-based GELU.
    Gelu,
}

impl From<FeedForwardActivation> for ActivationConfig {
    fn from(activation: FeedForwardActivation) -> Self {
        match activation {
            FeedForwardActivation::Relu => ActivationConfig::Relu,
            FeedForwardActivation::Gelu => ActivationConfig::Gelu,
        }
    }
}

impl Default for AdModelConfig {
    fn default() -> Self {
        Self {
            // Six episodes of the default room. The source explores for about ten episodes
            // and AD must keep in context where it has been and where a reward was: held out,
            // three episodes (60) reached 7.3 over the last 10 episodes, six reached 8.9, at
            // the same steps (the book's AD page has the ablations).
            context: 120,
            d_model: 64,
            layers: 2,
            heads: 4,
            d_ff: 256,
            activation: FeedForwardActivation::Relu,
        }
    }
}

impl AdModelConfig {
    /// Builds the model for `room` on `device`.
    pub fn init<B: Backend>(&self, room: &DarkRoomConfig, device: &B::Device) -> AdTransformer<B> {
        AdTransformer {
            embed: LinearConfig::new(feature_width(room), self.d_model)
                .with_bias(false)
                .init(device),
            positions: Initializer::Normal {
                mean: 0.0,
                std: 0.02,
            }
            .init([self.context, self.d_model], device),
            blocks: (0..self.layers)
                .map(|_| {
                    PreNormBlockConfig::new(self.d_model, self.d_ff, self.heads)
                        .with_activation(self.activation.into())
                        .init(device)
                })
                .collect(),
            norm: LayerNormConfig::new(self.d_model).init(device),
            head: LinearConfig::new(self.d_model, ACTIONS).init(device),
        }
    }
}

/// Multi-hot step tokens → summed embeddings plus learned positions → causal pre-norm
/// transformer blocks (no dropout, so every strategy computes the same function) → final norm
/// → action logits.
///
/// # Shapes
/// Input `[batch, seq, feature_width]` with `seq ≤ context`; output `[batch, seq, ACTIONS]`.
pub type AdTransformer<B> = AdModel<B, PreNormBlock<B>>;

/// The AD transformer over blocks `L`: [`PreNormBlock`]s for the whole model
/// ([`AdTransformer`]), a tensor-parallel shard's blocks for one shard of it
/// ([`TpAdTransformer`](crate::sharded::TpAdTransformer)). Both run the same forward, step and
/// pipeline stages.
#[derive(Module, Debug)]
pub struct AdModel<B: Backend, L: Module<B>> {
    pub(crate) embed: Linear<B>,
    pub(crate) positions: Param<Tensor<B, 2>>,
    pub(crate) blocks: Vec<L>,
    pub(crate) norm: LayerNorm<B>,
    pub(crate) head: Linear<B>,
}

impl<B: KernelBackend, L: SequenceBlock<B>> AdModel<B, L> {
    /// The longest window the model reads.
    pub fn context(&self) -> usize {
        self.positions.dims()[0]
    }

    /// Action logits at every position (the same on every shard).
    ///
    /// # Panics
    /// When `seq` exceeds the context the model was built for (a caller's bug: the evaluator
    /// and the data set never pass longer windows).
    pub fn forward(&self, features: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = embed(&self.embed, &self.positions, features);
        linear_rows(&self.head, self.norm.forward(run_blocks(&self.blocks, x)))
    }

    /// Logits and the mean cross-entropy of the source's actions over every position.
    pub fn forward_loss(&self, batch: AdBatch<B>) -> SequenceOutput<B> {
        let logits = self.forward(batch.features);
        let loss = action_loss(logits.clone(), batch.targets.clone());
        SequenceOutput::new(loss, logits, None, batch.targets)
    }
}

impl<B: KernelBackend> AdTransformer<B> {
    /// An empty cache for [`Self::forward_cached`].
    pub fn cache(&self) -> AdCache<B> {
        AdCache {
            layers: vec![KvCache::new(); self.blocks.len()],
        }
    }

    /// Action logits `[batch, new, ACTIONS]` of `new` steps that follow the steps in `cache`
    /// (at the window positions after them), which the attention reads and extends: a decoder
    /// appends one step at a time and computes each step's keys and values once. With an
    /// empty cache it is [`AdModel::forward`], the same operations in the same order.
    ///
    /// # Panics
    /// When the cached and new steps together exceed the context (a caller's bug).
    pub fn forward_cached(&self, features: Tensor<B, 3>, cache: &mut AdCache<B>) -> Tensor<B, 3> {
        let start = cache.len();
        let x = embed_at(&self.embed, &self.positions, features, start);
        let x = self
            .blocks
            .iter()
            .zip(&mut cache.layers)
            .fold(x, |x, (block, cache)| block.forward_cached(x, cache));
        linear_rows(&self.head, self.norm.forward(x))
    }
}

/// The keys and values each block of an [`AdTransformer`] has computed for the steps of the
/// window so far (see [`AdTransformer::forward_cached`]).
#[derive(Debug, Clone)]
pub struct AdCache<B: Backend> {
    layers: Vec<KvCache<B>>,
}

impl<B: Backend> AdCache<B> {
    /// Steps cached: the window position the next step takes.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, KvCache::len)
    }

    /// Whether no step is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Multi-hot step tokens through the embedding plus the learned positions of the first `seq`
/// steps: `[batch, seq, feature_width]` → `[batch, seq, d_model]`.
///
/// # Panics
/// When `seq` exceeds the context the positions cover (a caller's bug: the evaluator and the
/// data set never pass longer windows).
pub(crate) fn embed<B: KernelBackend>(
    embed: &Linear<B>,
    positions: &Param<Tensor<B, 2>>,
    features: Tensor<B, 3>,
) -> Tensor<B, 3> {
    embed_at(embed, positions, features, 0)
}

/// [`embed`] of steps at window positions `start..start + seq`.
fn embed_at<B: KernelBackend>(
    embed: &Linear<B>,
    positions: &Param<Tensor<B, 2>>,
    features: Tensor<B, 3>,
    start: usize,
) -> Tensor<B, 3> {
    let [_, seq, _] = features.dims();
    let [context, d_model] = positions.dims();
    assert!(
        start + seq <= context,
        "a window of {} steps exceeds the context of {context}",
        start + seq
    );
    // The whole table as it is when the window covers it (training's case): a narrowed view
    // would cost its backward two launches, zeros and a slice-assign, on a GPU.
    let positions = match (start, seq == context) {
        (0, true) => positions.val(),
        _ => positions.val().narrow(0, start, seq),
    };
    // Repeated for every sequence as a view, so that the table's gradient is a column sum over
    // the batch on many cubes (Burn's broadcast add sums it with one unit per value).
    let y = linear_rows(embed, features);
    let [batch, _, _] = y.dims();
    let positions = ops::broadcast_rows(positions.reshape([seq * d_model]), batch);
    (y.reshape([batch, seq * d_model]) + positions).reshape([batch, seq, d_model])
}

/// Mean cross-entropy of `[batch, seq, ACTIONS]` logits against the source's actions, by the
/// fused softmax cross-entropy (one pass per row on the CPU, no log-softmax tensor).
///
/// # Panics
/// When a target is not an action (the data set only holds actions the source took).
pub(crate) fn action_loss<B: KernelBackend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
) -> Tensor<B, 1> {
    let [b, s, a] = logits.dims();
    // Averaged by Kiln's column sum: over many cubes on a GPU, where Burn's mean is one unit.
    ops::mean(
        ops::cross_entropy(logits.reshape([b * s, a]), targets.reshape([b * s]))
            .unwrap_or_else(|e| panic!("{e}")),
    )
}

impl<B, L> LowPrecisionStep<B> for AdModel<B, L>
where
    B: AutodiffBackend + KernelBackend,
    L: SequenceBlock<B>,
    Self: AutodiffModule<B>,
{
    fn forward_in(&self, batch: AdBatch<B>, dtype: FloatDType) -> SequenceOutput<B> {
        // The loss (a softmax and a mean over every position) is computed in f32: the fused
        // cross-entropy reads the low-precision logits as they are and returns f32 losses.
        let logits = self.forward(batch.features.cast(dtype));
        let loss = action_loss(logits.clone(), batch.targets.clone());
        SequenceOutput::new(loss, logits, None, batch.targets)
    }
}

impl<B, L> TrainStep for AdModel<B, L>
where
    B: AutodiffBackend + KernelBackend,
    L: SequenceBlock<B>,
    Self: AutodiffModule<B>,
{
    type Input = AdBatch<B>;
    type Output = SequenceOutput<B>;

    fn step(&self, batch: AdBatch<B>) -> TrainOutput<SequenceOutput<B>> {
        let output = self.forward_loss(batch);
        TrainOutput::new(self, output.loss.backward(), output)
    }
}
