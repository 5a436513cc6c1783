//! [`SequenceBlock`]: what a model made of a stack of blocks asks of each block, so that one
//! model type serves its blocks whole and as a tensor-parallel shard's.

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// A block of a causal sequence model: `[batch, seq, d_model]` → the same shape. Implemented
/// by the whole blocks ([`super::PreNormBlock`], [`crate::lora::LoraBlock`]) and by their
/// tensor-parallel shards, whose output is the same on every shard.
pub trait SequenceBlock<B: Backend>: Module<B> {
    /// Applies the block.
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3>;
}

/// `x` through every block of `blocks`, in order.
pub fn run_blocks<B: Backend, L: SequenceBlock<B>>(blocks: &[L], x: Tensor<B, 3>) -> Tensor<B, 3> {
    blocks.iter().fold(x, |x, block| block.forward(x))
}
