//! The repository documents itself: no file points outside it, and every relative link in
//! its Markdown (the README, the book, the crates' notes) and every `book/src/…` page named in
//! code resolves to a file inside it.

use std::path::{Path, PathBuf};

/// Where a reader can never follow: places outside this repository. Spelt in pieces so that
/// this file, which must name them, does not itself read as such a pointer.
const FORBIDDEN: [&str; 4] = [
    concat!("..", "/shared"),
    concat!("steering", " repo"),
    concat!("DESIGN", ".md"),
    concat!("STYLE", ".md"),
];

/// Folders that hold build outputs, run outputs or third-party code (`vendor/`, whose own
/// notes link to its project), not Kiln's sources; every hidden folder but `.ci` is skipped too.
const SKIPPED: [&str; 3] = ["target", "runs", "vendor"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every text source of the repository: Rust, Markdown, TOML, shell scripts and CI files.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .expect("readable directory")
        .flatten()
    {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        // Links are not followed: what they point to may be outside the repository.
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            let hidden = name.starts_with('.') && name != ".ci";
            if !hidden && !SKIPPED.contains(&name.as_str()) {
                sources(&path, out);
            }
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("rs" | "md" | "toml" | "sh")
        ) || path.parent().and_then(Path::file_name) == Some(".ci".as_ref())
        {
            out.push(path);
        }
    }
}

fn all_sources() -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    sources(&root(), &mut files);
    assert!(files.len() > 50, "found only {} files", files.len());
    files
        .into_iter()
        .filter_map(|path| Some((path.clone(), std::fs::read_to_string(&path).ok()?)))
        .collect()
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn no_file_points_outside_the_repository() {
    let mut found = Vec::new();
    for (path, text) in all_sources() {
        for (n, line) in text.lines().enumerate() {
            for pattern in FORBIDDEN {
                if line.contains(pattern) {
                    found.push(format!("{}:{}: {pattern}", relative(&path), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "pointers outside the repository:\n{}",
        found.join("\n")
    );
}

/// The targets of `[text](target)` links and `{{#include target}}` in Markdown.
fn markdown_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for (open, close) in [("](", ')'), ("{{#include ", '}')] {
        let mut rest = text;
        while let Some(at) = rest.find(open) {
            rest = &rest[at + open.len()..];
            if let Some(end) = rest.find(close) {
                targets.push(rest[..end].trim().to_string());
            }
        }
    }
    targets
}

#[test]
fn every_relative_link_and_named_book_page_exists() {
    let mut broken = Vec::new();
    for (path, text) in all_sources() {
        let dir = path.parent().expect("a file has a folder");
        if path.extension().is_some_and(|e| e == "md") {
            for target in markdown_targets(&text) {
                // External links and in-page anchors are not files; `:anchor` selects a part
                // of an included file.
                if target.contains("://")
                    || target.starts_with('#')
                    || target.starts_with("mailto:")
                {
                    continue;
                }
                let file = target.split(['#', ':', ' ']).next().unwrap_or_default();
                if !file.is_empty() && !dir.join(file).exists() {
                    broken.push(format!("{}: {target}", relative(&path)));
                }
            }
        }
        // Code and notes name book pages by their path from the repository root.
        let mut rest = text.as_str();
        while let Some(at) = rest.find("book/src/") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || "/._-".contains(c)))
                .unwrap_or(tail.len());
            let page = tail[..end].trim_end_matches('.');
            if page.ends_with(".md") && !root().join(page).exists() {
                broken.push(format!("{}: {page}", relative(&path)));
            }
            rest = &tail[end..];
        }
    }
    assert!(
        broken.is_empty(),
        "links to missing files:\n{}",
        broken.join("\n")
    );
}
