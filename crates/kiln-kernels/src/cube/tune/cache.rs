//! The tuner's choices between runs: one JSON line per product in
//! `<cache>/matmul/<device>.jsonl`, appended as each product is timed.
//!
//! Lines rather than one document, so that a run stopped mid-way loses nothing it timed and
//! the ranks of an MPI job on one machine can append to the same file at once (each line is one
//! `write` to a file opened for appending). A line this version cannot read (a torn write, an
//! older format, a strategy it no longer has) is skipped and that product timed again; the
//! last line for a product wins. A torn line also takes the next record with it: that
//! product too is timed again.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Product;

/// One product's timing: what won and what each candidate took.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The product's bucket (dimensions rounded up to powers of two).
    pub product: Product,
    /// cubek's name of the strategy chosen (Burn's default when nothing beat it).
    pub chosen: String,
    /// Each candidate's name and microseconds per product; `None` where it could not run.
    pub micros: Vec<(String, Option<f64>)>,
}

/// The file of one device's choices.
#[derive(Clone, Debug)]
pub struct CacheFile {
    path: PathBuf,
}

impl CacheFile {
    /// The file for `device` under the cache folder `dir`.
    pub fn new(dir: &Path, device: &str) -> Self {
        let name: String = device
            .chars()
            .map(
                |c| match c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    true => c,
                    false => '_',
                },
            )
            .collect();
        Self {
            path: dir.join("matmul").join(format!("{name}.jsonl")),
        }
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every record the file holds, and how many of its lines could not be read. No file is
    /// no records.
    pub fn load(&self) -> io::Result<(Vec<Record>, usize)> {
        let text = match fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
            Err(e) => return Err(e),
        };
        let mut unreadable = 0;
        let records = text
            .lines()
            .filter(|line| !line.trim().is_empty())
            .filter_map(|line| {
                let record = serde_json::from_str(line).ok();
                unreadable += usize::from(record.is_none());
                record
            })
            .collect();
        Ok((records, unreadable))
    }

    /// `record` appended as one line, the folder created if needed.
    pub fn append(&self, record: &Record) -> io::Result<()> {
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir)?;
        }
        let mut line = serde_json::to_string(record).map_err(io::Error::other)?;
        line.push('\n');
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        file.write_all(line.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::DType;

    use super::*;
    use crate::Transpose;

    fn record(m: usize, chosen: &str) -> Record {
        Record {
            product: Product {
                m,
                k: 1024,
                n: 1024,
                transpose: Transpose::Lhs,
                dtype: DType::BF16,
            },
            chosen: chosen.into(),
            micros: vec![(chosen.into(), Some(12.5)), ("other".into(), None)],
        }
    }

    #[test]
    fn records_round_trip_and_torn_lines_are_skipped() {
        let dir = std::env::temp_dir().join(format!("kiln-tune-cache-{}", std::process::id()));
        let file = CacheFile::new(&dir, "cuda/H200 (132 SMs)");
        assert!(file.path().ends_with("matmul/cuda_H200__132_SMs_.jsonl"));
        assert_eq!(file.load().unwrap(), (Vec::new(), 0));
        file.append(&record(2048, "a")).unwrap();
        // A run killed mid-write leaves part of a line; the next record is glued to it, and
        // both are timed again by a later run, whose record reads.
        let mut torn = OpenOptions::new().append(true).open(file.path()).unwrap();
        torn.write_all(b"{\"product\":{\"m\":4").unwrap();
        file.append(&record(16, "b")).unwrap();
        assert_eq!(file.load().unwrap(), (vec![record(2048, "a")], 1));
        file.append(&record(16, "c")).unwrap();
        let (records, unreadable) = file.load().unwrap();
        assert_eq!(records, vec![record(2048, "a"), record(16, "c")]);
        assert_eq!(unreadable, 1);
        fs::remove_dir_all(&dir).unwrap();
    }
}
