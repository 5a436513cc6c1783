//! A data file read into examples: JSON Lines, a JSON array (Alpaca's own files) or Parquet
//! (how the Hub stores data sets), each row placed by its line or row number for errors.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::format::{DataFormat, Example, example};
use crate::llm::LlmError;

/// Where an example came from in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// A line of a JSON Lines file, from 1.
    Line(usize),
    /// A row of a Parquet file or an element of a JSON array, from 1.
    Row(usize),
}

/// The examples of a data file.
#[derive(Debug, Clone)]
pub struct DataSet {
    path: PathBuf,
    examples: Vec<Example>,
    places: Vec<Place>,
}

impl DataSet {
    /// Reads every example of `path`: Parquet when it ends in `.parquet`, else JSON — one
    /// object per line (blank lines skipped), or one array of objects. Each row's shape is
    /// `format`'s, or told by its keys.
    ///
    /// # Errors
    /// [`LlmError::Io`] when the file cannot be read; [`LlmError::Data`] or
    /// [`LlmError::DataRow`] naming the line or row that is not JSON or not an example, and
    /// what is wrong with it; [`LlmError::Path`] for a file without examples.
    pub fn read(path: &Path, format: DataFormat) -> Result<Self, LlmError> {
        crate::llm::folder::check_regular(path)?;
        let parquet = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
        let rows = match parquet {
            true => super::parquet::rows(path)?,
            false => json_rows(path)?,
        };
        let mut data = Self {
            path: path.to_path_buf(),
            examples: Vec::with_capacity(rows.len()),
            places: Vec::with_capacity(rows.len()),
        };
        for (place, row) in rows {
            let example =
                example(&row, format).map_err(|reason| place_error(path, place, reason))?;
            data.examples.push(example);
            data.places.push(place);
        }
        if data.examples.is_empty() {
            return Err(LlmError::Path {
                path: path.display().to_string(),
                reason: "holds no example; give one JSON object per line, such as \
                         {\"prompt\": \"...\", \"completion\": \"...\"}"
                    .into(),
            });
        }
        Ok(data)
    }

    /// A data set of `examples`, named `path` in errors, each example its own line.
    pub fn from_examples(path: &Path, examples: Vec<Example>) -> Self {
        let places = (1..=examples.len()).map(Place::Line).collect();
        Self {
            path: path.to_path_buf(),
            examples,
            places,
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The examples, in the file's order.
    pub fn examples(&self) -> &[Example] {
        &self.examples
    }

    /// How many examples there are.
    pub fn len(&self) -> usize {
        self.examples.len()
    }

    /// Whether there are none (never, once read).
    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }

    /// The examples `held[i]` marks and the others, as two sets of the same file:
    /// `(others, held)`.
    pub(super) fn partition(self, held: &[bool]) -> (DataSet, DataSet) {
        let empty = || Self {
            path: self.path.clone(),
            examples: Vec::new(),
            places: Vec::new(),
        };
        let (mut kept, mut taken) = (empty(), empty());
        for ((example, place), &held) in self.examples.into_iter().zip(self.places).zip(held) {
            let set = if held { &mut taken } else { &mut kept };
            set.examples.push(example);
            set.places.push(place);
        }
        (kept, taken)
    }

    /// An error about example `i`, naming its line or row.
    pub(super) fn error(&self, i: usize, reason: String) -> LlmError {
        place_error(&self.path, self.places[i], reason)
    }
}

/// The rows of a JSON Lines file or of a JSON array.
fn json_rows(path: &Path) -> Result<Vec<(Place, Value)>, LlmError> {
    let bytes = std::fs::read(path).map_err(|e| LlmError::io(path, e))?;
    // Editors on Windows start UTF-8 files with a byte-order mark; it is not part of the data.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let bad = |place, reason| place_error(path, place, reason);
    let utf8 = |place: Place, bytes| {
        std::str::from_utf8(bytes).map_err(|e| {
            bad(
                place,
                format!(
                    "is not UTF-8 text (an invalid byte at column {}); save the file as UTF-8",
                    e.valid_up_to() + 1
                ),
            )
        })
    };
    if bytes.trim_ascii_start().starts_with(b"[") {
        let text = utf8(Place::Line(1), bytes)?;
        let rows: Vec<Value> = serde_json::from_str(text).map_err(|e| {
            bad(
                Place::Line(e.line()),
                format!("not a valid JSON array of examples: {e}"),
            )
        })?;
        return Ok((1..).map(Place::Row).zip(rows).collect());
    }
    let mut rows = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let place = Place::Line(i + 1);
        let line = utf8(place, line)?;
        if line.trim().is_empty() {
            continue;
        }
        let value =
            serde_json::from_str(line).map_err(|e| bad(place, format!("not valid JSON: {e}")))?;
        rows.push((place, value));
    }
    Ok(rows)
}

/// The error about the example at `place` of the file `path`.
fn place_error(path: &Path, place: Place, reason: String) -> LlmError {
    let path = path.display().to_string();
    match place {
        Place::Line(line) => LlmError::Data { path, line, reason },
        Place::Row(row) => LlmError::DataRow { path, row, reason },
    }
}
