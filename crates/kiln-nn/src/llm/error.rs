//! Why a model folder could not be loaded: one line each, naming the file or tensor.

/// What the first value of `values` that is not finite is (`NaN` or `infinite`), for
/// [`LlmError::NonFinite`]; `None` when every one is finite.
pub(crate) fn non_finite(values: &[f32]) -> Option<&'static str> {
    let bad = values.iter().find(|v| !v.is_finite())?;
    Some(if bad.is_nan() { "NaN" } else { "infinite" })
}

/// A model folder, config or weight file that cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The folder has no `config.json`.
    #[error(
        "{dir} has no config.json; give a Hugging Face model folder (config.json and model.safetensors)"
    )]
    NoConfig {
        /// The folder.
        dir: String,
    },
    /// A file that cannot be read.
    #[error("cannot read {path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// The system's message.
        reason: String,
    },
    /// An output that could not be written (nothing of it is in place; the previous one is
    /// whole).
    #[error(transparent)]
    Output(#[from] kiln_core::output::OutputError),
    /// A path inside a model folder that is not a regular file of that folder.
    #[error("{path}: {reason}")]
    Path {
        /// The path.
        path: String,
        /// What it is, and what is wanted instead.
        reason: String,
    },
    /// A weight that is not a finite number.
    #[error(
        "{tensor} in {file} holds {what} values; the weights are damaged (download them again) \
         or were saved from a diverged run"
    )]
    NonFinite {
        /// The tensor, by its Hugging Face name.
        tensor: String,
        /// The weight file or folder.
        file: String,
        /// `NaN` or `infinite`.
        what: &'static str,
    },
    /// A `config.json` that does not parse, or lacks a field.
    #[error("{path}: {reason}")]
    Config {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// An architecture Kiln does not build.
    #[error(
        "model_type '{0}' is not supported; Kiln loads llama, mistral, qwen2 and qwen3 \
         (LLaMA-family decoders)"
    )]
    Architecture(String),
    /// A rotary scaling Kiln does not implement.
    #[error(
        "rope scaling '{0}' is not supported; Kiln implements the plain rotary embedding and \
         LLaMA 3's ('llama3')"
    )]
    RopeScaling(String),
    /// A sliding attention window shorter than the positions the model may see.
    #[error(
        "this {model_type} attends within a sliding window of {window} tokens from layer \
         max_window_layers on, which Kiln does not implement (Mistral's, in every layer, it \
         does); it loads only when the window covers max_position_embeddings ({positions})"
    )]
    SlidingWindow {
        /// The architecture.
        model_type: String,
        /// The window.
        window: usize,
        /// The positions the model may see.
        positions: usize,
    },
    /// The folder has no weights.
    #[error(
        "{dir} has no weights: expected model.safetensors or model.safetensors.index.json \
         (PyTorch .bin files are not read; convert them to safetensors)"
    )]
    NoWeights {
        /// The folder.
        dir: String,
    },
    /// A tensor the model needs is in no weight file.
    #[error("{tensor} is missing from the weights in {dir} ({count} tensor(s) missing in all)")]
    MissingTensor {
        /// The first missing tensor, by its Hugging Face name.
        tensor: String,
        /// The folder.
        dir: String,
        /// How many are missing.
        count: usize,
    },
    /// LoRA settings or an adapter that cannot be applied.
    #[error("{0}")]
    Adapter(String),
    /// A model that an export's format cannot hold.
    #[error("cannot export {what} as {format}: {reason}")]
    Export {
        /// The target format.
        format: &'static str,
        /// What could not be exported.
        what: String,
        /// Why, and what to do.
        reason: String,
    },
    /// A tensor of another shape than the config says.
    #[error("{file}: {reason}")]
    Tensor {
        /// The weight file.
        file: String,
        /// The store's message, naming the tensor and its shapes.
        reason: String,
    },
    /// A tokenizer that cannot be read or does not fit the model.
    #[error("{path}: {reason}")]
    Tokenizer {
        /// The tokenizer file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A chat template that does not compile or render.
    #[error("{path}: {reason}")]
    ChatTemplate {
        /// The file the template came from.
        path: String,
        /// What failed, and where in the template.
        reason: String,
    },
    /// A row of a Parquet data file that cannot be used.
    #[error("{path}, row {row}: {reason}")]
    DataRow {
        /// The data file.
        path: String,
        /// The row, from 1.
        row: usize,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A line of a data file that cannot be used.
    #[error("{path}:{line}: {reason}")]
    Data {
        /// The data file.
        path: String,
        /// The line, from 1.
        line: usize,
        /// What is wrong and what to do.
        reason: String,
    },
}

impl LlmError {
    /// [`LlmError::Io`] for `path`, with the system's message `e`.
    pub(crate) fn io(path: &std::path::Path, e: impl std::fmt::Display) -> Self {
        Self::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        }
    }
}
