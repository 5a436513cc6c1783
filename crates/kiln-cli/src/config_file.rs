//! Reading TOML configs with errors that name the file and the line.

use std::path::Path;

use serde::de::DeserializeOwned;

/// A config file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is malformed or names an unknown field.
    #[error("config {path}, line {line}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The line of the problem (1-based).
        line: usize,
        /// The parser's message.
        message: String,
    },
}

/// Reads a TOML config; missing fields take their defaults where the type says so.
///
/// # Errors
/// When the file cannot be read or parsed (unknown fields included).
pub fn load<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigFileError> {
    let display = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: display.clone(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigFileError::Parse {
        path: display,
        line: e
            .span()
            .map_or(1, |span| text[..span.start].matches('\n').count() + 1),
        message: e.message().trim().to_string(),
    })
}
