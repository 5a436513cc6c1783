//! Activation checkpointing of a [`CausalLm`] (transformers' `gradient_checkpointing`): the
//! forward keeps only each decoder layer's input, and the backward recomputes one layer at a
//! time, from the last to the first, taking its gradients before the next is recomputed.
//!
//! The forward runs on the inner backend, so it records no graph at all; each layer is then
//! run again under autodiff from its kept input and seeded with the gradient of its output,
//! as a pipeline stage that recomputes is. A step holds the layers' inputs and one layer's
//! activations instead of every layer's, for one more forward of the layers. Whatever the
//! strategy around it (`Single`, `DataParallel`, `Ddp`, `Tensor`'s shards, whose collectives
//! run again in the same order on every shard), the gradients are those of the plain step.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use burn::train::SequenceOutput;

use super::model::Decoder;
use super::train::masked_loss;
use super::{CausalLm, LmBatch};
use crate::tensor_parallel::ShardedBackend;
use kiln_core::grads::gather_unit;

impl<B: ShardedBackend> CausalLm<B> {
    /// This model with activation checkpointing on or off: a training step recomputes each
    /// decoder layer's activations in its backward instead of keeping them.
    pub fn with_gradient_checkpointing(mut self, on: bool) -> Self {
        self.model.checkpointing = on;
        self
    }

    /// Whether a training step recomputes the decoder layers' activations.
    pub fn gradient_checkpointing(&self) -> bool {
        self.model.checkpointing
    }
}

impl<B> CausalLm<B>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
    Self: AutodiffModule<B>,
{
    /// The gradients of `batch`'s loss times `loss_scale`, with every decoder layer's
    /// activations recomputed in the backward, and the step's output (its loss unscaled). In
    /// a low precision (the model's own, already cast) the loss is f32 all the same: the fused
    /// cross-entropy computes it in f32, as
    /// [`LowPrecisionStep`](kiln_core::model::LowPrecisionStep) takes it.
    pub(super) fn checkpointed_step(
        &self,
        batch: LmBatch<B>,
        loss_scale: f64,
    ) -> (GradientsParams, SequenceOutput<B>) {
        let device = batch.inputs.device();
        // Under ZeRO-3 with units gathered (`gather_units`), each unit's parameters come from
        // their owners just before it runs, and go with it: the embedding, the final norm and
        // the head for the step, each layer for its forward and again for its backward.
        // Elsewhere `gather_unit` gives the unit back as it is.
        let edges = gather_unit(self.edges());
        // The forward, without a graph: each layer's input is all it keeps.
        let decoder = &self.model;
        let mut x = (edges.model.embed_tokens)
            .valid()
            .forward(batch.inputs.clone().inner());
        let ([rows, seq, _], dtype) = (x.dims(), x.dtype());
        let inner_packed = batch.packed.as_ref().map(|p| p.inner());
        let inner_rope =
            decoder
                .rope
                .positions(rows, 0..seq, inner_packed.as_ref(), &device, dtype);
        let mut inputs = Vec::with_capacity(decoder.layers.len());
        for layer in &decoder.layers {
            inputs.push(x.clone());
            x = gather_unit(layer.clone()).valid().forward(x, &inner_rope);
        }

        // The head and the loss, under autodiff from the last layer's output.
        let hidden = Tensor::<B, 3>::from_inner(x).require_grad();
        let logits = edges.head(hidden.clone());
        let loss = masked_loss(logits.clone(), batch.targets.clone(), batch.mask);
        let seed = match loss_scale == 1.0 {
            true => loss.clone(),
            false => loss.clone().mul_scalar(loss_scale),
        };
        let (mut acc, mut grad) =
            self.gradients(&edges, seed, &hidden, GradientsParams::new(), &device);

        // Each layer again, last first, seeded with the gradient of its output.
        let rope = decoder
            .rope
            .positions(rows, 0..seq, batch.packed.as_ref(), &device, dtype);
        for (layer, input) in decoder.layers.iter().zip(inputs).rev() {
            let layer = gather_unit(layer.clone());
            let x = Tensor::<B, 3>::from_inner(input).require_grad();
            let y = layer.forward(x.clone(), &rope);
            let seed = (y * Tensor::from_inner(grad)).sum();
            (acc, grad) = self.gradients(&layer, seed, &x, acc, &device);
        }
        // The embedding, when it trains (full fine-tuning): the gradient of its lookup.
        let embedding = &edges.model.embed_tokens;
        if embedding.weight.is_require_grad() {
            let seed = (embedding.forward(batch.inputs) * Tensor::from_inner(grad)).sum();
            acc = self.add_params(embedding, seed.backward(), acc, &device);
        }
        (acc, SequenceOutput::new(loss, logits, None, batch.targets))
    }

    /// This model without its layers: the embedding, the final norm and the head.
    fn edges(&self) -> Self {
        CausalLm {
            model: Decoder {
                layers: Vec::new(),
                ..self.model.clone()
            },
            lm_head: self.lm_head.clone(),
        }
    }

    /// Backpropagates `seed` through `segment` (the part of this model it ran): its
    /// parameters' gradients added into `acc`, and the gradient of the segment's input `x`.
    fn gradients<S: AutodiffModule<B>>(
        &self,
        segment: &S,
        seed: Tensor<B, 1>,
        x: &Tensor<B, 3>,
        acc: GradientsParams,
        device: &B::Device,
    ) -> (GradientsParams, Tensor<B::InnerBackend, 3>) {
        let mut grads = seed.backward();
        let input = x
            .grad_remove(&mut grads)
            .expect("the segment's input requires its gradient");
        (self.add_params(segment, grads, acc, device), input)
    }

    /// `acc` with the gradients of `segment`'s parameters from one segment's backward added.
    fn add_params<S: AutodiffModule<B>>(
        &self,
        segment: &S,
        grads: B::Gradients,
        acc: GradientsParams,
        device: &B::Device,
    ) -> GradientsParams {
        // Read from the segment that ran: a gathered unit's parameters are other tensors
        // than the ones this model holds, under the same ids.
        let params = GradientsParams::from_grads(grads, segment);
        kiln_core::grads::add_weighted(self, acc, params, 1.0, device)
    }
}
