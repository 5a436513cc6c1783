//! The strategies' settings: each strategy's `*Config` as `[parallel.*]` sections and flags
//! give them, all of them together ([`StrategyConfigs`]), and what refuses a setting
//! ([`ConfigError`]). Plain data, checked here; the strategies that run them stand above.

mod auto;
mod configs;
mod data_parallel;
mod ddp;
mod error;
mod pipeline;
mod single;
mod tensor;

pub use auto::AutoConfig;
pub use configs::StrategyConfigs;
pub use data_parallel::DataParallelConfig;
pub use ddp::DdpConfig;
pub use error::ConfigError;
pub(crate) use error::check_threads;
pub use pipeline::{PipelineConfig, Schedule};
pub use single::SingleConfig;
pub use tensor::TensorConfig;
