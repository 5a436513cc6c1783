//! Layers built from Burn's modules and Kiln's fused ops, shaped for training speed.

mod block;
mod causal_attention;
mod layer_norm;
mod rms_norm;
mod rows;
mod sequence_block;

pub use block::{PreNormBlock, PreNormBlockConfig};
pub use causal_attention::{CausalSelfAttention, CausalSelfAttentionConfig, KvCache, attend};
pub use layer_norm::{LayerNorm, LayerNormConfig};
pub use rms_norm::rms_norm;
pub use rows::{linear_rows, linear_rows_relu, linear_rows_residual};
pub use sequence_block::{SequenceBlock, run_blocks};
