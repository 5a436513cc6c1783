//! Runs that lose nothing: saves that survive SIGKILL at any moment, SIGINT that saves and
//! resumes bit for bit, and damaged or foreign checkpoints refused in one line naming the file.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{assert_one_line_error, kiln};

/// A fresh temporary folder for `name`.
fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-ckpt-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The DDP run every test here trains: two ranks, so the optimizer state is a strategy's.
const RUN: [&str; 10] = [
    "train",
    "--strategy",
    "ddp",
    "--world",
    "2",
    "--samples",
    "2048",
    "--batch",
    "64",
    "--threads-per-rank",
];

fn run_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args: Vec<&str> = RUN.to_vec();
    args.push("1");
    args.extend_from_slice(extra);
    args
}

/// `kiln train` with `extra`, which must succeed; its `--json` report.
fn train(json: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = run_args(extra);
    args.extend(["--json", json.to_str().unwrap()]);
    let out = kiln(&args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

fn params(report: &serde_json::Value) -> (f64, f64) {
    (
        report["param_sum"].as_f64().unwrap(),
        report["param_sq_sum"].as_f64().unwrap(),
    )
}

/// The `step-<N>` folders of `dir`, oldest first, and anything else in it.
fn listing(dir: &Path) -> (Vec<usize>, Vec<String>) {
    let (mut steps, mut other) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().into_string().unwrap();
        match name.strip_prefix("step-").and_then(|n| n.parse().ok()) {
            Some(step) => steps.push(step),
            // The lock a saving run holds; the file stays, unlocked, after it.
            None if name == ".lock" => {}
            None => other.push(name),
        }
    }
    steps.sort_unstable();
    (steps, other)
}

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the kiln binary runs")
}

/// A run resumed from the newest step of `dir` for one more step ends exactly where a run
/// that never stopped does.
fn assert_resumes_exactly(dir: &Path, step: usize, scratch: &Path) {
    let target = (step + 1).to_string();
    let resumed = train(
        &scratch.join("resumed.json"),
        &["--steps", &target, "--resume", dir.to_str().unwrap()],
    );
    let straight = train(&scratch.join("straight.json"), &["--steps", &target]);
    assert_eq!(resumed["resumed_from"], step);
    assert_eq!(
        params(&resumed),
        params(&straight),
        "resumed from step {step}"
    );
}

#[test]
fn sigkill_at_any_moment_leaves_the_newest_complete_checkpoint_loadable() {
    let scratch = temp("kill");
    let dir = scratch.join("run");
    let dir_s = dir.to_str().unwrap();
    // A fixed xorshift: the moments differ from kill to kill but not from run to run.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut newest = 0;
    for kill in 0..16 {
        // Each child continues the folder the previous one was killed in, as a user
        // restarting a crashed job does.
        let mut extra = vec!["--steps", "1000000", "--save", dir_s, "--save-every", "1"];
        if newest > 0 {
            extra.extend(["--resume", dir_s]);
        }
        let mut child = spawn(&run_args(&extra));
        // Once the child has saved a step of its own, a kill at any moment of the next saves:
        // waiting for that first (instead of a fixed delay) keeps a loaded machine's slow
        // start-up from turning kills into no-ops.
        let start = std::time::Instant::now();
        while listing(&dir).0.last().is_none_or(|&s| s <= newest) {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "kill {kill}: no save"
            );
            assert!(
                child.try_wait().unwrap().is_none(),
                "kill {kill}: the child ended"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(next() % 300));
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        assert!(!status.success(), "kill {kill}: the child ended by itself");
        let (steps, _) = listing(&dir);
        // --keep 2, plus the one a kill between a step's rename and the pruning leaves
        // (the next run prunes it before it saves).
        assert!(steps.len() <= 3, "kill {kill}: --keep 2 left {steps:?}");
        let now = *steps.last().expect("the step waited for is still there");
        assert!(now > newest, "kill {kill}: step {now} after step {newest}");
        newest = now;
        assert_resumes_exactly(&dir, newest, &scratch);
    }
    std::fs::remove_dir_all(&scratch).ok();
}

#[test]
fn sigint_finishes_the_step_saves_and_resumes_bit_for_bit() {
    let scratch = temp("sigint");
    let dir = scratch.join("run");
    let child = spawn(&run_args(&[
        "--steps",
        "1000000",
        "--save",
        dir.to_str().unwrap(),
    ]));
    // The save folder exists once the handlers are installed: from then on SIGINT stops the
    // run after a step.
    let start = std::time::Instant::now();
    while !dir.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the child never got ready"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("stopped by SIGINT after step"), "{stderr}");
    assert!(stderr.contains("resume with --resume"), "{stderr}");
    let (steps, other) = listing(&dir);
    assert_eq!(steps.len(), 1, "{steps:?} {other:?}");
    assert!(other.is_empty(), "left behind: {other:?}");
    assert!(
        stderr.contains(&format!("after step {}", steps[0])),
        "{stderr}"
    );
    assert_resumes_exactly(&dir, steps[0], &scratch);
    std::fs::remove_dir_all(&scratch).ok();
}

/// Flips one byte of `path` at `at`.
fn flip(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 1;
    std::fs::write(path, bytes).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[test]
fn damaged_and_foreign_checkpoints_are_refused_in_one_line_naming_the_file() {
    let scratch = temp("damaged");
    let good = scratch.join("good");
    train(
        &scratch.join("saved.json"),
        &["--steps", "4", "--save", good.to_str().unwrap()],
    );
    let step = good.join("step-00000004");
    let resume = |dir: &Path, needle: &str| {
        let dir = dir.to_str().unwrap();
        assert_one_line_error(&run_args(&["--steps", "8", "--resume", dir]), needle);
    };
    let case = |name: &str, damage: &dyn Fn(&Path), needle: &str| {
        let copy = scratch.join(name);
        copy_dir(&good, &copy);
        damage(&copy.join("step-00000004"));
        let file = copy.join("step-00000004").join(needle);
        resume(&copy, file.to_str().unwrap());
    };
    let model_bytes = std::fs::metadata(step.join("model.mpk")).unwrap().len() as usize;
    // One flipped bit in the tensor data, far from the MessagePack framing.
    case(
        "flipped",
        &|s| flip(&s.join("model.mpk"), model_bytes - 100),
        "model.mpk",
    );
    // Under `auto` at the default log level: the damage is the one line said, before the
    // machine is measured (which took seconds and logged a line per strategy it timed).
    let flipped = scratch.join("flipped");
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "train",
            "--strategy",
            "auto",
            "--world",
            "2",
            "--samples",
            "2048",
        ])
        .args([
            "--batch",
            "64",
            "--steps",
            "8",
            "--resume",
            flipped.to_str().unwrap(),
        ])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!out.status.success() && lines.len() == 1, "{stderr}");
    assert!(lines[0].contains("model.mpk"), "{stderr}");
    case(
        "truncated",
        &|s| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(s.join("optimizer.mpk"));
            f.unwrap().set_len(1000).unwrap();
        },
        "optimizer.mpk",
    );
    case(
        "missing",
        &|s| std::fs::remove_file(s.join("optimizer.mpk")).unwrap(),
        "optimizer.mpk",
    );
    case(
        "no-manifest-entry",
        &|s| std::fs::write(s.join("manifest.toml"), "format = 1\n").unwrap(),
        "manifest.toml",
    );
    // Another model, another strategy: the manifest says so before anything decodes.
    assert_one_line_error(
        &run_args(&[
            "--steps",
            "8",
            "--model",
            "transformer",
            "--resume",
            good.to_str().unwrap(),
        ]),
        "another config (model differ)",
    );
    let mut pipeline = run_args(&["--steps", "8", "--resume", step.to_str().unwrap()]);
    pipeline[2] = "pipeline";
    assert_one_line_error(&pipeline, "was saved by ddp (mesh dp=2)");
    // Nothing to train, and a save folder holding another run's later steps.
    assert_one_line_error(
        &run_args(&["--steps", "4", "--resume", good.to_str().unwrap()]),
        "nothing to train",
    );
    assert_one_line_error(
        &run_args(&["--steps", "2", "--save", good.to_str().unwrap()]),
        "already holds checkpoints up to step 4",
    );
    // --overwrite replaces them, and only then.
    train(
        &scratch.join("over.json"),
        &[
            "--steps",
            "2",
            "--save",
            good.to_str().unwrap(),
            "--overwrite",
        ],
    );
    assert_eq!(listing(&good).0, vec![2]);
    std::fs::remove_dir_all(&scratch).ok();
}

#[test]
fn outputs_are_checked_before_the_first_step() {
    let scratch = temp("outputs");
    let file = scratch.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let file_s = file.to_str().unwrap();
    let folder_s = scratch.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["train", "--json", "/proc/kiln/x.json"],
            "--json /proc/kiln/x.json",
        ),
        (vec!["train", "--json", folder_s], "is a folder"),
        (vec!["train", "--save", file_s], "--save"),
        (vec!["train", "--save", "/proc/kiln"], "--save /proc/kiln"),
        (
            vec!["ad", "train", "--out", "/proc/kiln"],
            "--out /proc/kiln",
        ),
        (vec!["ad", "train", "--out", file_s], "--out"),
        (
            vec![
                "ad",
                "train",
                "--out",
                folder_s,
                "--svg",
                "/proc/kiln/r.svg",
            ],
            "--svg",
        ),
        (
            vec!["ad", "train", "--out", folder_s, "--json", folder_s],
            "--json",
        ),
    ] {
        let start = std::time::Instant::now();
        assert_one_line_error(&args, needle);
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{args:?} trained before failing"
        );
    }
    std::fs::remove_dir_all(&scratch).ok();
}

#[test]
fn checkpoint_flags_without_a_folder_or_out_of_range_are_refused() {
    for (args, needle) in [
        (
            vec!["train", "--save-every", "5"],
            "--save-every needs a checkpoint folder",
        ),
        (
            vec!["train", "--overwrite"],
            "--overwrite needs a checkpoint folder",
        ),
        (
            vec!["train", "--save", "/tmp/k", "--keep", "0"],
            "keep (--keep) must be at least 1",
        ),
        (
            vec!["train", "--save", "/tmp/k", "--save-every", "0"],
            "must be at least 1 step",
        ),
    ] {
        assert_one_line_error(&args, needle);
    }
}

#[test]
fn a_resumed_run_says_so() {
    let scratch = temp("says");
    let dir = scratch.join("run");
    let dir_s = dir.to_str().unwrap();
    train(&scratch.join("a.json"), &["--steps", "3", "--save", dir_s]);
    let out = kiln(&run_args(&[
        "--steps", "5", "--resume", dir_s, "--save", dir_s,
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains("2 steps of 64 samples (resumed at step 3)"),
        "{stdout}"
    );
    assert!(stdout.contains("step-00000005"), "{stdout}");
    std::fs::remove_dir_all(&scratch).ok();
}

/// A pipeline of `stages` on `world` ranks saves one step, then `auto` resumes it: the
/// strategy `auto` ran, and why.
fn auto_resumed_after(name: &str, world: &str, stages: &str) -> (String, String) {
    let scratch = temp(name);
    let dir = scratch.join("run");
    let dir_s = dir.to_str().unwrap();
    let common = [
        "train",
        "--world",
        world,
        "--samples",
        "256",
        "--batch",
        "16",
    ];
    let staged = ["--strategy", "pipeline", "--stages", stages, "--steps", "1"];
    let out = kiln(&[&common[..], &staged, &["--save", dir_s]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = scratch.join("resumed.json");
    let json_s = json.to_str().unwrap();
    let resumed = ["--steps", "2", "--resume", dir_s, "--json", json_s];
    let out = kiln(&[&common[..], &resumed].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_dir_all(&scratch).ok();
    let reason = report["strategy_reason"].as_str().unwrap().to_string();
    (report["strategy"].as_str().unwrap().to_string(), reason)
}

#[test]
fn auto_resumes_on_the_layout_its_checkpoint_saved() {
    // Saved by a pipeline of two stages; `auto` alone would lay two ranks out as replicas,
    // whose optimizer state is cut otherwise, and the checkpoint would be refused.
    let (strategy, reason) = auto_resumed_after("auto-layout", "2", "2");
    assert_eq!(strategy, "pipeline", "{reason}");
    assert!(
        reason.contains("pp=2 tp=1 (the checkpoint's layout)"),
        "{reason}"
    );
}

#[test]
fn auto_resumes_a_one_stage_pipeline_on_the_pipeline_s_engine() {
    // One stage holds its optimizer state per stage, as every pipeline does, which Single
    // (what `auto` runs on one rank) does not load.
    let (strategy, reason) = auto_resumed_after("auto-one-stage", "1", "1");
    assert_eq!(strategy, "pipeline", "{reason}");
    assert!(
        reason.contains("pp=1 tp=1 on the pipeline's engine (the checkpoint's layout)"),
        "{reason}"
    );
}

#[test]
fn the_checkpoint_table_of_a_config_sets_every_and_keep() {
    let scratch = temp("toml");
    let config = scratch.join("run.toml");
    std::fs::write(&config, "steps = 7\n[checkpoint]\nevery = 2\nkeep = 3\n").unwrap();
    let dir = scratch.join("run");
    let config_s = config.to_str().unwrap();
    train(
        &scratch.join("a.json"),
        &["--config", config_s, "--save", dir.to_str().unwrap()],
    );
    assert_eq!(listing(&dir), (vec![4, 6, 7], vec![]));
    std::fs::write(&config, "[checkpoint]\nkeep = 0\n").unwrap();
    assert_one_line_error(
        &["train", "--config", config_s],
        "keep (--keep) must be at least 1",
    );
    std::fs::remove_dir_all(&scratch).ok();
}

#[test]
fn an_f16_run_resumes_bit_for_bit_with_its_loss_scale() {
    let scratch = temp("f16");
    let dir = scratch.join("run");
    let dir_s = dir.to_str().unwrap();
    // A scale that grows every clean step overflows f16 every few steps and backs off: the
    // resumed run matches only if its scale goes on deciding from where it was saved.
    let config = scratch.join("f16.toml");
    std::fs::write(
        &config,
        "[optimizer]\nprecision = \"f16\"\nnan_policy = \"skip\"\n\
         [optimizer.loss_scale]\ninitial = 1e4\ngrowth_factor = 16.0\ngrowth_interval = 1\n",
    )
    .unwrap();
    let config_s = config.to_str().unwrap();
    train(
        &scratch.join("a.json"),
        &["--config", config_s, "--steps", "6", "--save", dir_s],
    );
    let resumed = train(
        &scratch.join("b.json"),
        &["--config", config_s, "--steps", "16", "--resume", dir_s],
    );
    let straight = train(
        &scratch.join("c.json"),
        &["--config", config_s, "--steps", "16"],
    );
    assert!(
        straight["skipped_steps"].as_u64().unwrap() > 0,
        "no overflow: {straight}"
    );
    assert_eq!(params(&resumed), params(&straight));
    std::fs::remove_dir_all(&scratch).ok();
}

#[test]
fn a_resume_with_another_config_is_refused_and_overwrite_removes_nothing_until_a_save() {
    let scratch = temp("config");
    let dir = scratch.join("run");
    let dir_s = dir.to_str().unwrap();
    train(
        &scratch.join("a.json"),
        &["--steps", "4", "--save", dir_s, "--save-every", "2"],
    );
    let step_2 = dir.join("step-00000002");
    let step_2 = step_2.to_str().unwrap();
    assert_one_line_error(
        &run_args(&["--steps", "8", "--resume", dir_s, "--lr", "0.01"]),
        "another config (lr differ)",
    );
    // Refused after --overwrite accepted the folder: step 4 is still there.
    assert_one_line_error(
        &run_args(&[
            "--steps",
            "8",
            "--resume",
            step_2,
            "--save",
            dir_s,
            "--overwrite",
            "--seed",
            "7",
        ]),
        "seed differ",
    );
    assert_eq!(listing(&dir).0, vec![2, 4]);
    // Accepted: the first save replaces the later step.
    train(
        &scratch.join("b.json"),
        &[
            "--steps",
            "3",
            "--resume",
            step_2,
            "--save",
            dir_s,
            "--overwrite",
        ],
    );
    assert_eq!(listing(&dir).0, vec![2, 3]);
    std::fs::remove_dir_all(&scratch).ok();
}
