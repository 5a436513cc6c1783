//! A model's adapters apart from its base: what a fine-tuning checkpoint holds. The base is
//! the model folder's, frozen, and is read from there again on resume; saving it with every
//! step would write the whole model (its 4-bit codes, its f32 embedding) for nothing.

use burn::module::Module;

use super::{CausalLm, LlmError};
use crate::lora::LoraAdapter;
use crate::tensor_parallel::ShardedBackend;

/// Every projection's adapter, or `None` where it has none, in the order of the layers and of
/// their seven projections. Cloned from the model, they keep their `ParamId`s, which the
/// optimizer state is keyed by.
#[derive(Module, Debug)]
pub struct LoraAdapters<B: ShardedBackend> {
    /// One entry per projection of every layer.
    pub adapters: Vec<Option<LoraAdapter<B>>>,
}

impl<B: ShardedBackend> CausalLm<B> {
    /// This model's adapters (handles to the same tensors).
    pub fn adapters(&self) -> LoraAdapters<B> {
        let mut model = self.clone();
        LoraAdapters {
            adapters: model
                .projections_mut()
                .into_iter()
                .map(|(_, _, proj)| proj.lora.clone())
                .collect(),
        }
    }

    /// This model with `adapters` (what [`Self::adapters`] gave of a model like it) in place
    /// of its own; their scale stays the model's.
    ///
    /// # Errors
    /// [`LlmError::Adapter`] when the adapters are another model's: a projection adapted in
    /// one and not the other, or of other shapes.
    pub fn with_adapters(mut self, adapters: LoraAdapters<B>) -> Result<Self, LlmError> {
        let mut projections = self.projections_mut();
        if projections.len() != adapters.adapters.len() {
            return Err(LlmError::Adapter(format!(
                "the saved adapters are for {} projections, this model has {}",
                adapters.adapters.len(),
                projections.len()
            )));
        }
        for ((path, _, proj), adapter) in projections.iter_mut().zip(adapters.adapters) {
            let shapes = |a: &LoraAdapter<B>| (a.a.dims(), a.b.dims());
            match (&proj.lora, &adapter) {
                (Some(ours), Some(saved)) if shapes(ours) == shapes(saved) => {}
                (None, None) => {}
                _ => {
                    return Err(LlmError::Adapter(format!(
                        "{path}: the saved adapter ({:?}) does not match this model's ({:?}); \
                         use the --lora-rank and --target-modules the run was saved with",
                        adapter.as_ref().map(shapes),
                        proj.lora.as_ref().map(shapes)
                    )));
                }
            }
            proj.lora = adapter;
        }
        Ok(self)
    }
}
