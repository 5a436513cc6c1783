//! The run configuration every subcommand shares: `TrainConfig` (a config file's fields and
//! the flags over them), the built-in models and their data (`ModelKind`), and the flags of a
//! run (`RunArgs`). Below the subcommands and the planning service.

mod builtin;
mod config;
mod run_args;

pub(crate) use builtin::{ModelJob, adamw, with_builtin, workload as builtin_workload};
pub use config::{AutoPlan, CONFIG_FILE, ConfigError, ModelKind, TrainConfig};
pub use run_args::RunArgs;
