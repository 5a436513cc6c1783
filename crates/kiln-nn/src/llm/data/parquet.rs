//! The rows of a Parquet file as JSON objects, through Apache Arrow's `parquet` crate: a
//! `messages` column (a list of structs) becomes a list of objects, as `datasets` reads it.

use std::fs::File;
use std::path::Path;

use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::Value;

use super::read::Place;
use crate::llm::LlmError;

/// Every row of the Parquet file `path`, in order.
///
/// # Errors
/// [`LlmError::Io`] for a file that cannot be opened; [`LlmError::Data`] for one that is not
/// Parquet or is compressed with a codec Kiln does not read; [`LlmError::DataRow`] for a row
/// that cannot be decoded.
pub(super) fn rows(path: &Path) -> Result<Vec<(Place, Value)>, LlmError> {
    let file = File::open(path).map_err(|e| LlmError::io(path, e))?;
    let not_parquet = |e: parquet::errors::ParquetError| LlmError::Data {
        path: path.display().to_string(),
        line: 1,
        reason: format!("cannot be read as Parquet: {e}"),
    };
    let reader = SerializedFileReader::new(file).map_err(not_parquet)?;
    let mut rows = Vec::new();
    for (i, row) in reader.get_row_iter(None).map_err(not_parquet)?.enumerate() {
        let row = row.map_err(|e| LlmError::DataRow {
            path: path.display().to_string(),
            row: i + 1,
            reason: format!(
                "cannot be decoded: {e} (Kiln reads Parquet uncompressed or compressed with \
                 snappy, pyarrow's default)"
            ),
        })?;
        rows.push((Place::Row(i + 1), row.to_json_value()));
    }
    Ok(rows)
}
