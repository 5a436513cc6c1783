//! Pretrained causal language models of the LLaMA family, loaded from a Hugging Face model
//! folder: `config.json` ([`LlmConfig`]), `model.safetensors` or its sharded index
//! ([`load`]), into [`CausalLm`].
//!
//! The architecture is LLaMA's: token embedding → pre-norm blocks (RMSNorm, grouped-query
//! attention with rotary position embeddings, SwiGLU) → final RMSNorm → LM head, tied to the
//! embedding or not. `model_type` `llama`, `mistral`, `qwen2` (biases on q, k, v) and `qwen3`
//! (per-head q/k norms) load; others are refused in one line ([`LlmError`]).
//!
//! LoRA adapters attach to any of the seven projections of every layer
//! ([`CausalLm::with_lora`], the base frozen, in f32 or 4 bits: [`load_4bit`]), and are saved
//! and loaded in PEFT's layout ([`CausalLm::save_peft`], [`CausalLm::load_peft`]).
//!
//! The model trains on [`LmBatch`]es of tokenised data ([`DataSet`], through the folder's chat
//! template for conversations: [`ChatTemplate`]) through every strategy: whole,
//! in pipeline stages ([`CausalLmStage`]) or in tensor-parallel shards ([`ShardedCausalLm`]),
//! in f32 or mixed precision. [`CausalLm::generate`] continues a prompt with a key/value
//! cache.

mod adapters;
mod batch;
mod chat_template;
mod checkpointing;
mod config;
mod data;
mod dtype;
mod error;
mod eval;
mod folder;
mod generate;
mod gguf;
mod hub;
mod load;
mod model;
mod peft;
mod proj;
mod rope;
mod save;
mod stages;
mod strftime;
mod tensor_parallel;
mod tokenizer;
mod train;

pub use adapters::LoraAdapters;
pub use batch::{LmBatch, LmBatcher, LmItem, PackedRows};
pub use chat_template::{ChatTemplate, Message, Role, SpecialTokens};
pub use config::{LlmConfig, ModelType, RopeScaling};
pub use data::{
    DataFormat, DataSet, Example, Packing, TokenizeOptions, Tokenized, TrainOn, tokenize,
};
pub use dtype::stored_dtype;
pub use error::LlmError;
pub use eval::EvalLoss;
pub use folder::model_files;
pub use generate::{KvCache, Sampling};
pub use gguf::{GgufReport, GgufType, export_gguf};
pub use hub::{Fetch, resolve_model};
pub use load::{load, load_4bit, load_config};
pub use model::{Attention, CausalLm, Decoder, DecoderLayer, Mlp, ProjBuilder};
pub use peft::{ALL_LINEAR, LoraSpec, TARGET_MODULES, check_peft_base, expand_target_modules};
pub use proj::{Proj, QuantizedBase};
pub use rope::{Positions, Rope};
pub use save::COMPANIONS;
pub use stages::CausalLmStage;
pub use tensor_parallel::ShardedCausalLm;
pub use tokenizer::LlmTokenizer;
