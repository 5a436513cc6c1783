//! Low-rank adapters (LoRA, Hu et al. 2021) over a frozen dense base ([`LoraLinear`]) or a
//! frozen 4-bit base ([`QLoraLinear`], Dettmers et al. 2023), and a transformer block built
//! from them ([`LoraBlock`]).
//!
//! `y = x·W (+ bias) + (α / r) · dropout(x)·A·B`: `W` and the bias are frozen; only `A [d_in, r]`
//! and `B [r, d_out]` train. `B` starts at zero, so a new adapter leaves the model's output
//! unchanged. Adapters save and load on their own ([`LoraAdapter`]), a few MB next to a
//! multi-GB base.

mod adapter;
mod block;
mod config;
mod lora_linear;
mod qlora_linear;

pub use adapter::LoraAdapter;
pub use block::{LoraBlock, LoraBlockAdapters, LoraBlockConfig, LoraKind, Projection};
pub use config::LoraConfig;
pub use lora_linear::LoraLinear;
pub use qlora_linear::{QLoraLinear, QuantConfig};
