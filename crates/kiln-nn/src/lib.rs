//! Kiln's layers and built-in models.
//!
//! Layers shaped for training speed ([`layers`]), LoRA and QLoRA adapters ([`lora`]), the
//! reference models every strategy is tested and benchmarked with ([`models::Mlp`],
//! [`models::Transformer`], [`models::LoraTransformer`]) and the synthetic tasks they learn
//! ([`tasks`]), all plain Burn modules and data sets.

pub mod layers;
pub mod llm;
pub mod lora;
pub mod models;
pub mod tasks;
pub mod tensor_parallel;
