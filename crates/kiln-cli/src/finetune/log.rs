//! `--log-file`: a JSON Lines record of a fine-tuning run, a line per logging step and per
//! evaluation, written as they happen and flushed, for a user to watch (`tail -f`) or a tool
//! to read while the run goes.
//!
//! The file is appended to, never truncated: a resumed run continues its log, and a run given
//! another run's log adds to it instead of destroying it. Each run starts with a line of its
//! own (`{"run": {...}}`). The file is opened without following a link, and only a regular
//! file is written.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::eval::EvalPoint;

/// What one logging step writes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRecord {
    /// Steps trained.
    pub step: usize,
    /// The step's loss.
    pub loss: f64,
    /// The learning rate the step trained with.
    pub lr: f64,
    /// The global gradient norm before clipping, where the run's guard measures it.
    pub grad_norm: Option<f64>,
    /// Input tokens a second since the run started, pads not counted.
    pub tokens_per_s: f64,
}

/// An open log.
pub struct RunLog {
    path: PathBuf,
    file: File,
    /// A line every this many steps, its loss the mean since the last line.
    every: usize,
    /// Loss summed and steps counted since the last line.
    pending: (f64, usize),
    started: Instant,
}

impl RunLog {
    /// Opens `path` for appending (created if missing) and writes the run's first line:
    /// the time, the step it starts from and `every`.
    ///
    /// # Errors
    /// A path that is a link or not a regular file, or that cannot be opened or written.
    pub fn open(path: &Path, every: usize, first_step: usize) -> Result<Self, String> {
        if let Ok(meta) = std::fs::symlink_metadata(path)
            && !meta.file_type().is_file()
        {
            return Err(match meta.file_type().is_symlink() {
                true => "is a link; give the log's own path".into(),
                false => "is not a regular file".into(),
            });
        }
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            // Checked above; the flag closes the window between the check and the open.
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| format!("cannot open: {e}"))?;
        let mut log = Self {
            path: path.to_path_buf(),
            file,
            every: every.max(1),
            pending: (0.0, 0),
            started: Instant::now(),
        };
        let unix_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        log.line(
            &json!({"run": {"started_unix_s": unix_s, "first_step": first_step,
                                 "log_every": log.every}}),
        )?;
        Ok(log)
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Counts step `record.step`; writes a line when it is a logging step (every `every`
    /// steps) or `last`.
    ///
    /// # Errors
    /// A line that cannot be written.
    pub fn step(&mut self, record: StepRecord, last: bool) -> Result<(), String> {
        self.pending.0 += record.loss;
        self.pending.1 += 1;
        if !(last || record.step.is_multiple_of(self.every)) {
            return Ok(());
        }
        let (sum, count) = std::mem::take(&mut self.pending);
        self.line(&json!({
            "step": record.step,
            "loss": sum / count as f64,
            "lr": record.lr,
            "grad_norm": record.grad_norm,
            "tokens_per_s": record.tokens_per_s,
            "elapsed_s": self.started.elapsed().as_secs_f64(),
        }))
    }

    /// Writes an evaluation's line.
    ///
    /// # Errors
    /// A line that cannot be written.
    pub fn eval(&mut self, point: &EvalPoint) -> Result<(), String> {
        self.line(&json!({
            "step": point.step,
            "eval_loss": point.loss,
            "eval_perplexity": point.perplexity,
            "elapsed_s": self.started.elapsed().as_secs_f64(),
        }))
    }

    /// One line, written whole and flushed.
    fn line(&mut self, value: &serde_json::Value) -> Result<(), String> {
        let mut text = value.to_string();
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|e| format!("cannot write: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn a_line_per_logging_step_and_per_evaluation_appended_run_after_run() {
        let dir = std::env::temp_dir().join(format!("kiln-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log.jsonl");
        let record = |step, loss| StepRecord {
            step,
            loss,
            lr: 0.1,
            grad_norm: None,
            tokens_per_s: 5.0,
        };
        let mut log = RunLog::open(&path, 2, 0).unwrap();
        for (step, loss) in [(1, 4.0), (2, 2.0), (3, 1.0)] {
            log.step(record(step, loss), step == 3).unwrap();
        }
        log.eval(&EvalPoint {
            step: 3,
            loss: 1.5,
            perplexity: 1.5f64.exp(),
        })
        .unwrap();
        let written = lines(&path);
        assert_eq!(written.len(), 4, "{written:?}");
        assert_eq!(written[0]["run"]["first_step"], 0);
        // Steps 1 and 2 in one line, their mean loss; the last step in its own.
        assert_eq!(
            (written[1]["step"].clone(), written[1]["loss"].clone()),
            (2.into(), 3.0.into())
        );
        assert_eq!(written[2]["step"], 3);
        assert!(written[2]["grad_norm"].is_null());
        assert_eq!(written[3]["eval_loss"], 1.5);
        // A resumed run appends its own lines after the first run's.
        let mut log = RunLog::open(&path, 2, 3).unwrap();
        log.step(record(4, 0.5), true).unwrap();
        let written = lines(&path);
        assert_eq!(written.len(), 6);
        assert_eq!(written[4]["run"]["first_step"], 3);
        // Never through a link, never into a FIFO.
        let link = dir.join("link.jsonl");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(RunLog::open(&link, 1, 0).err().unwrap().contains("link"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
