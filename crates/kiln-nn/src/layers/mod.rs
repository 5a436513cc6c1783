//! Layers built from Burn's modules and tensor ops, shaped for training speed.

mod block;
mod causal_attention;

pub use block::{PreNormBlock, PreNormBlockConfig};
pub use causal_attention::{CausalSelfAttention, CausalSelfAttentionConfig, attend};
