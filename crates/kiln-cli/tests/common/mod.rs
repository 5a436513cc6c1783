//! Running the `kiln` binary and checking its one-line errors, shared by the CLI tests.

#![allow(dead_code)] // each test binary uses a different part

use std::process::{Command, Output};

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
