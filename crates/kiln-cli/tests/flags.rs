//! Every value a user can type into a numeric flag of `kiln train` gets a run or a one-line
//! error: never a panic, never a wrapped-around number, never a hang before training.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::assert_one_line_error;

/// Values at every edge a number has: zero, one, signs, the limits of u32, u64 and f64, and
/// things that are not numbers.
const EDGES: [&str; 12] = [
    "0",
    "1",
    "3",
    "-1",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "nan",
    "-inf",
    "0.5",
    "x",
];

/// Each numeric flag of `kiln train`, with the flags that make it apply.
const FLAGS: [(&str, &[&str]); 15] = [
    ("--world", &["--strategy", "ddp"]),
    ("--dp", &["--strategy", "ddp"]),
    ("--stages", &["--strategy", "pipeline"]),
    ("--tp", &["--strategy", "tensor", "--model", "transformer"]),
    ("--micro-batches", &["--strategy", "pipeline"]),
    ("--steps", &[]),
    ("--batch", &[]),
    ("--samples", &[]),
    ("--grad-accum", &["--strategy", "ddp"]),
    ("--threads-per-rank", &[]),
    ("--seed", &[]),
    ("--lr", &[]),
    ("--bucket-cap-mb", &["--strategy", "ddp"]),
    ("--clip-norm", &[]),
    ("--layers", &["--model", "transformer"]),
];

/// What one `kiln train` did: its exit code (`None`: still training when stopped), and its
/// stderr.
fn run(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    // A valid run may train for long (`--steps 4294967296`): past its first seconds it has
    // passed every check, which is all this test asks.
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            // Ended by a signal of its own (an abort, the OOM killer): a crash.
            assert!(
                std::os::unix::process::ExitStatusExt::signal(&status).is_none(),
                "{args:?} died of {status}"
            );
            break status.code();
        }
        if start.elapsed() > Duration::from_secs(15) {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (code, stderr)
}

#[test]
fn every_numeric_flag_takes_any_value_without_a_panic() {
    // A fixed xorshift adds values between the edges, the same on every run.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut random = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 100_000).to_string()
    };
    for (flag, context) in FLAGS {
        let mut values: Vec<String> = EDGES.iter().map(ToString::to_string).collect();
        values.push(random());
        for value in &values {
            let mut args = vec!["train", "--samples", "256", "--batch", "64", "--steps", "2"];
            args.extend_from_slice(context);
            // The flag comes last and so wins over the defaults above.
            args.extend([flag, value.as_str()]);
            let (code, stderr) = run(&args);
            assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
            match code {
                Some(0) | None => {}
                Some(1 | 2) => {
                    let lines: Vec<&str> =
                        stderr.lines().filter(|l| !l.trim().is_empty()).collect();
                    assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
                }
                Some(other) => panic!("{args:?} exited with {other}: {stderr}"),
            }
        }
    }
}

#[test]
fn zero_huge_and_negative_numbers_get_their_own_errors() {
    for (args, needle) in [
        (vec!["train", "--dp", "0"], "dp must be at least 1"),
        (
            vec!["train", "--strategy", "pipeline", "--stages", "0"],
            "stages must be at least 1",
        ),
        (
            vec!["train", "--strategy", "ddp", "--dp", "18446744073709551615"],
            "is more than the 1024 ranks one process drives",
        ),
        (
            vec![
                "train",
                "--strategy",
                "tensor",
                "--tp",
                "4294967296",
                "--stages",
                "4294967296",
            ],
            "pp 4294967296 × tp 4294967296, which overflows",
        ),
        (vec!["train", "--world", "5000"], "more than the 1024 ranks"),
        (
            vec!["train", "--samples", "18446744073709551615"],
            "--samples must be between 1 and",
        ),
        (
            vec!["train", "--steps", "0"],
            "--steps must be between 1 and",
        ),
        (
            vec!["train", "--batch", "0"],
            "--batch must be between 1 and",
        ),
        (
            vec!["train", "--layers", "0"],
            "--layers must be between 1 and 256, got 0",
        ),
        (
            vec!["train", "--lr", "-1"],
            "--lr must be a positive finite number, got -1",
        ),
        (
            vec!["train", "--precision", "bf16", "--backend", "ndarray"],
            "precision bf16 does not run on the ndarray backend",
        ),
        (
            vec![
                "train",
                "--world",
                "2",
                "--dp",
                "2",
                "--strategy",
                "pipeline",
                "--stages",
                "2",
            ],
            "the world has 2 ranks",
        ),
    ] {
        assert_one_line_error(&args, needle);
    }
}

#[test]
fn colour_is_only_for_a_terminal() {
    // stderr is a pipe here: no escape codes, even at info level.
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["train", "--steps", "1", "--samples", "256"])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("plan:"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr}");
}

#[test]
fn a_skipped_step_is_reported_once_not_once_per_rank() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "train",
            "--lr",
            "1e30",
            "--nan-policy",
            "skip",
            "--steps",
            "6",
        ])
        .args(["--strategy", "ddp", "--world", "2", "--samples", "256"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("skipped the step"))
        .collect();
    assert!(!warnings.is_empty(), "{stderr}");
    for step in 1..=6 {
        let at = format!("at step {step} ");
        let n = warnings.iter().filter(|w| w.contains(&at)).count();
        assert!(n <= 1, "step {step} reported {n} times: {stderr}");
    }
}

#[test]
fn a_bad_matmul_tuner_setting_stops_the_run_in_one_line() {
    for (var, value, needle) in [
        (
            "KILN_MATMUL_TUNE",
            "yes",
            "KILN_MATMUL_TUNE=\"yes\" is not a mode",
        ),
        (
            "KILN_MATMUL_TUNE_SECONDS",
            "-1",
            "is not a number of seconds",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["train", "--steps", "1", "--samples", "256"])
            .env("RUST_LOG", "warn")
            .env(var, value)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{var}={value} trained");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{var}={value}: {stderr}");
        assert!(lines[0].contains(needle), "{var}={value}: {stderr}");
    }
}
