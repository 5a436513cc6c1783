//! Fine-tuning data: a file of examples ([`DataSet`]: JSON Lines, a JSON array or Parquet; text,
//! prompt-completion, conversations or Alpaca rows) tokenised into sequences whose loss covers
//! what the example trains ([`tokenize`]).

mod format;
mod parquet;
mod read;
mod split;
mod tokenize;

pub use format::{DataFormat, Example};
pub use read::DataSet;
pub use tokenize::{Packing, TokenizeOptions, Tokenized, TrainOn, tokenize};
