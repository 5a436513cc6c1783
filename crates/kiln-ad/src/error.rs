//! Errors of the Algorithm Distillation pipeline.

/// A bad setting or a failure of the AD pipeline.
#[derive(Debug, thiserror::Error)]
pub enum AdError {
    /// A goal split with nothing on one side.
    #[error(
        "goals.held_out must be between 1 and {} (the room has {goals} goals), got {held_out}",
        goals - 1
    )]
    HeldOut {
        /// Goals asked to be held out.
        held_out: usize,
        /// Goals in the room.
        goals: usize,
    },
    /// A number outside its range.
    #[error("{field} must be in {range}, got {value}")]
    OutOfRange {
        /// The config field.
        field: &'static str,
        /// Its value.
        value: f64,
        /// The allowed range.
        range: &'static str,
    },
    /// A size beyond what a run can hold.
    #[error(
        "{field} is {value}, beyond {max}: a run of that size would not fit in memory (or \
         overflow its counts); give at most {max}"
    )]
    TooLarge {
        /// The setting, by its TOML name.
        field: &'static str,
        /// The value given.
        value: usize,
        /// The largest taken.
        max: usize,
    },
    /// A count that must be positive is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// Heads that do not divide the width.
    #[error("model.heads ({heads}) must divide model.d_model ({d_model})")]
    Heads {
        /// Width.
        d_model: usize,
        /// Heads.
        heads: usize,
    },
    /// Histories without steps.
    #[error("source.histories_per_goal and source.episodes must be at least 1")]
    EmptyHistories,
    /// A context longer than the histories it is cut from.
    #[error(
        "model.context must be between 1 and a learning history's length ({steps} steps), got {context}; \
         shorten the context or raise source.episodes"
    )]
    ContextTooLong {
        /// Tokens of context.
        context: usize,
        /// Steps per history.
        steps: usize,
    },
    /// The room's geometry cannot be played.
    #[error(
        "env.size must be odd and between 3 and 63 and env.horizon at least 1, got {size} and {horizon}"
    )]
    Room {
        /// Cells per side.
        size: u8,
        /// Steps per episode.
        horizon: usize,
    },
    /// Training failed.
    #[error(transparent)]
    Strategy(#[from] kiln_core::StrategyError),
    /// `auto` could not measure this machine with the model.
    #[error("auto measures the model before it plans: {0}; name a strategy to skip it")]
    Measure(#[from] kiln_planner::measure::MeasureError),
    /// The processes of a launched run could not plan together (their link, or the first
    /// process's measurement).
    #[error("auto could not plan the run: {0}; name a strategy to skip planning")]
    Planning(String),
    /// The `[optimizer]` settings cannot work.
    #[error(transparent)]
    Optimizer(#[from] kiln_core::optim::GuardConfigError),
    /// The data could not be sampled.
    #[error(transparent)]
    Data(#[from] kiln_core::data::DataError),
    /// The plot could not be written.
    #[error("cannot write plot {path}: {reason}")]
    Plot {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A checkpoint could not be written, read or trusted.
    #[error(transparent)]
    Checkpoint(#[from] kiln_core::checkpoint::CheckpointError),
    /// A checkpoint's config.toml that is not this run's config.
    #[error(
        "the checkpoint {path} was trained with another config ({fields} differ); resume with \
         the config that saved it (only train.steps, where it trains, checkpoint and eval may change)"
    )]
    OtherConfig {
        /// The checkpoint's config.toml.
        path: String,
        /// The settings that differ, dotted (`model.d_model`).
        fields: String,
    },
    /// A checkpoint's config.toml that does not parse.
    #[error("the checkpoint's {path} is not an AD config: {reason}")]
    BadConfig {
        /// The file.
        path: String,
        /// The parser's message.
        reason: String,
    },
}

impl From<kiln_core::fit::FitError> for AdError {
    /// The loop's error as the variant of what failed: the strategy, or a checkpoint.
    fn from(e: kiln_core::fit::FitError) -> Self {
        match e {
            kiln_core::fit::FitError::Strategy(e) => Self::Strategy(e),
            kiln_core::fit::FitError::Checkpoint(e) => Self::Checkpoint(*e),
        }
    }
}
