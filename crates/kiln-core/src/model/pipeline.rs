//! The contract of pipeline parallelism: how a model splits into an ordered list of stages,
//! and how a batch enters the first stage and is scored by the last.
//!
//! A model built as a sequence of blocks (an embedding, `n` blocks, a head) splits between
//! blocks: stage `s` holds a contiguous range of blocks, the first stage also the embedding and
//! the last also the head. Kiln runs a stage as
//!
//! ```text
//! x = embed(input)                        first stage only
//! x = blocks(x, context)                  every stage, its own blocks
//! loss = loss(x, target)                  last stage only: the mean loss of the micro-batch
//! ```
//!
//! Between stages only an [`Activation`] travels, forward, and its gradient, backward. What
//! every stage's blocks need of the batch besides it (the context: where the examples of packed
//! rows begin, say) each stage reads from the batch itself. A stage
//! is an ordinary Burn module (its own type, holding clones of the model's parts with their
//! `ParamId`s), so it moves to its device, trains with any Burn optimizer and is assembled back
//! into the whole model by [`assemble`](crate::stages::assemble), which matches parameters by
//! id.

use std::ops::Range;

use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::TrainModel;
use crate::stages::Activation;

/// A model that splits into pipeline stages. See the [module docs](self).
pub trait PipelineModel<B: AutodiffBackend>: TrainModel<B> {
    /// A contiguous part of the model, as a Burn module.
    type Stage: AutodiffModule<B> + 'static;
    /// What one stage hands the next: a tensor of any rank.
    type Activation: Activation<B>;
    /// What the first stage embeds (e.g. token ids). Cloned to be kept between a
    /// micro-batch's forward and backward.
    type FirstInput: Clone + Send + 'static;
    /// What the last stage scores its output against (e.g. labels); cloned likewise.
    type Target: Clone + Send + 'static;
    /// What every stage's blocks read of the batch besides the activation (e.g. where the
    /// examples of packed rows begin), `()` when nothing. A stage between the first and the
    /// last loads each micro-batch for it, unless it is zero-sized as `()` is: then it takes
    /// the default.
    type Context: Clone + Default + Send + 'static;

    /// How many blocks the model splits between: at most this many stages.
    fn num_blocks(&self) -> usize;

    /// Refuses, with the reason, a split into `stages` stages that this model cannot train
    /// exactly (e.g. a trainable weight shared by the first and the last stage, whose two
    /// gradients nothing would sum). Every split is accepted unless a model says otherwise.
    ///
    /// # Errors
    /// Why the split cannot train as single-device training does, and what to do instead.
    fn check_split(&self, stages: usize) -> Result<(), String> {
        let _ = stages;
        Ok(())
    }

    /// The stages holding `ranges` of blocks (contiguous, in order, covering `0..num_blocks`):
    /// stage 0 also holds what comes before the blocks, the last stage what comes after.
    /// Parameters keep their `ParamId`s.
    fn split(&self, ranges: &[Range<usize>]) -> Vec<Self::Stage>;

    /// A batch as the first stage's input, every stage's context and the last stage's target.
    fn split_input(
        input: <Self as burn::train::TrainStep>::Input,
    ) -> (Self::FirstInput, Self::Context, Self::Target);

    /// The first stage's embedding of its input (before its blocks).
    fn embed(stage: &Self::Stage, input: Self::FirstInput) -> Self::Activation;

    /// The stage's blocks, in the micro-batch's context.
    fn blocks(
        stage: &Self::Stage,
        x: Self::Activation,
        context: &Self::Context,
    ) -> Self::Activation;

    /// The last stage's mean loss over the micro-batch (after its blocks), shape `[1]`.
    fn loss(stage: &Self::Stage, x: Self::Activation, target: Self::Target) -> Tensor<B, 1>;
}

/// `blocks` cut into `stages` contiguous ranges whose lengths differ by at most one, the
/// longer ones first (torchtitan's default split).
///
/// # Panics
/// When `stages` is 0 or exceeds `blocks`; strategies check that first.
pub fn even_ranges(blocks: usize, stages: usize) -> Vec<Range<usize>> {
    assert!(
        stages >= 1 && stages <= blocks,
        "{stages} stages of {blocks} blocks"
    );
    crate::data::split_even(blocks, stages)
}
