//! The digests of what a fine-tuning run reads (its data file and every file of its base
//! model), recorded in each checkpoint and checked on resume: a resume on edited data or on
//! another base would silently train something else.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use kiln_core::checkpoint::FileDigest;

/// Input digests by name: `data`, `chat_template` (one given apart from the model), `model/<file>`.
pub type Digests = BTreeMap<String, FileDigest>;

/// The digests, computed on a thread of their own (a 7B base is 14 GB to read, which overlaps
/// with loading it), and kept once taken.
pub enum Inputs {
    /// Still being computed.
    Pending(JoinHandle<Result<Digests, String>>),
    /// Done.
    Done(Digests),
}

impl Inputs {
    /// Starts digesting the data file `data`, the model folder `model` and the chat template
    /// given in place of the folder's.
    pub fn digest(
        data: &Path,
        model: &Path,
        template: Option<&Path>,
    ) -> Result<Self, kiln_nn::llm::LlmError> {
        let mut files: Vec<(String, PathBuf)> = vec![("data".into(), data.to_path_buf())];
        if let Some(template) = template {
            files.push(("chat_template".into(), template.to_path_buf()));
        }
        for (name, path) in kiln_nn::llm::model_files(model)? {
            files.push((format!("model/{name}"), path));
        }
        let handle = std::thread::spawn(move || {
            files
                .into_iter()
                .map(|(name, path)| {
                    FileDigest::of_file(&path)
                        .map(|digest| (name, digest))
                        .map_err(|e| format!("cannot read {}: {e}", path.display()))
                })
                .collect()
        });
        Ok(Self::Pending(handle))
    }

    /// The digests, waiting for them if they are not done.
    ///
    /// # Errors
    /// A file that could not be read.
    pub fn get(&mut self) -> Result<Digests, String> {
        let state = std::mem::replace(self, Self::Done(Digests::new()));
        let digests = match state {
            Self::Pending(handle) => handle
                .join()
                .map_err(|_| "digesting the inputs failed".to_string())??,
            Self::Done(digests) => digests,
        };
        *self = Self::Done(digests.clone());
        Ok(digests)
    }
}
