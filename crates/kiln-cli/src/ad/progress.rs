//! Progress bars on the main thread.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps labelled `what`.
pub fn bar(len: usize, what: &str) -> ProgressBar {
    ProgressBar::new(len as u64).with_style(
        ProgressStyle::with_template(&format!(
            "{what:>5} {{bar:40}} {{pos}}/{{len}}  {{msg}}  [{{elapsed}}<{{eta}}]"
        ))
        .expect("valid template"),
    )
}
