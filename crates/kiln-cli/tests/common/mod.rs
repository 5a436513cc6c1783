//! Running the `kiln` binary and checking its one-line errors, shared by the CLI tests.

#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh, empty scratch folder `name` of this test process.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kiln-cli-{name}"));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `kiln` with `args`, which must succeed; its stdout.
pub fn succeed(args: &[&str]) -> String {
    let out = kiln(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `kiln` with `args`, logs at warn.
pub fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the kiln binary runs")
}

/// `kiln args` fails with exactly one non-empty stderr line containing `needle`.
pub fn assert_one_line_error(args: &[&str], needle: &str) {
    let out = kiln(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
    assert!(lines[0].contains(needle), "{args:?}: {stderr}");
}

/// The path of `path` in the LLM fixtures (the committed llama model and chat data).
pub fn fixture(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../kiln-nn/tests/fixtures/llm")
        .join(path)
        .display()
        .to_string()
}

/// The flags of a fine-tuning run of the llama fixture on the chat data for `steps` steps of 8
/// sequences of 24 tokens, writing into `out` (`adapters/`, `run.json`), then `extra`.
pub fn finetune_args(out: &Path, steps: &str, extra: &[&str]) -> Vec<String> {
    let lora = [&["--lora-rank", "4"][..], extra].concat();
    let (adapters, json) = (out.join("adapters"), out.join("run.json"));
    run_args(&fixture("llama"), &adapters, &json, [steps, "0.01"], &lora)
}

/// The flags of a fine-tuning run of `model` on the chat data, `[steps, lr]` steps of 8
/// sequences of 24 tokens on one thread a rank, writing `output` and the report `json`, then
/// `extra` (the adapters' rank, or `--full`).
pub fn run_args(
    model: &str,
    output: &Path,
    json: &Path,
    [steps, lr]: [&str; 2],
    extra: &[&str],
) -> Vec<String> {
    let data = fixture("chat.jsonl");
    let mut args: Vec<String> = [
        "finetune",
        "--model",
        model,
        "--data",
        &data,
        "--steps",
        steps,
        "--batch",
        "8",
        "--seq-len",
        "24",
        "--lr",
        lr,
        "--threads-per-rank",
        "1",
        "--output",
        output.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}
