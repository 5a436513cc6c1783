//! Reference models: ordinary Burn modules with a burn-train `TrainStep`, so any Kiln strategy
//! trains them. Dropout is off: random masks could not match across different batch splits.

mod lora_transformer;
mod lora_transformer_stages;
mod lora_transformer_tp;
mod mlp;
mod mlp_stages;
mod transformer;
mod transformer_stages;
mod transformer_tp;
mod workload;

pub use lora_transformer::{LoraModel, LoraTransformer, LoraTransformerConfig};
pub use lora_transformer_stages::{LoraStage, LoraTransformerStage};
pub use lora_transformer_tp::{TpLoraTransformer, TpLoraTransformerStage};
pub use mlp::{Mlp, MlpConfig};
pub use mlp_stages::MlpStage;
pub use transformer::{Transformer, TransformerConfig};
pub use transformer_stages::TransformerStage;
pub use transformer_tp::{TpTransformer, TpTransformerStage};
