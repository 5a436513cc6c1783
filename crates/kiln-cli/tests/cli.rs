//! `kiln train` end to end: the JSON report, and one-line errors for bad settings.

mod common;

use common::{assert_one_line_error, kiln};
use std::path::PathBuf;

fn json_path(name: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kiln-cli-{name}.json"))
}

fn train_json(name: &str, extra: &[&str]) -> serde_json::Value {
    train_json_steps(name, "4", extra)
}

fn train_json_steps(name: &str, steps: &str, extra: &[&str]) -> serde_json::Value {
    let path = json_path(name);
    let mut args = vec![
        "train",
        "--steps",
        steps,
        "--batch",
        "10",
        "--samples",
        "64",
        "--threads-per-rank",
        "1",
        "--json",
    ];
    let path_str = path.to_str().unwrap().to_string();
    args.push(&path_str);
    args.extend_from_slice(extra);
    let out = kiln(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(path).ok();
    json
}

#[test]
fn json_report_has_the_promised_keys() {
    let report = train_json("keys", &["--strategy", "ddp", "--world", "2"]);
    for key in [
        "strategy",
        "world",
        "steps",
        "global_batch",
        "final_loss",
        "param_sum",
        "param_sq_sum",
        "wall_s",
    ] {
        assert!(report.get(key).is_some(), "missing {key}: {report}");
    }
    assert_eq!(report["strategy"], "ddp");
    assert_eq!(report["world"], 2);
    assert_eq!(report["steps"], 4);
    assert_eq!(report["global_batch"], 10);
    assert!(report["final_loss"].as_f64().unwrap().is_finite());
}

#[test]
fn ddp_and_single_agree_through_the_cli() {
    let single = train_json(
        "single",
        &["--strategy", "single", "--model", "transformer"],
    );
    let ddp = train_json(
        "ddp",
        &[
            "--strategy",
            "ddp",
            "--world",
            "3",
            "--model",
            "transformer",
        ],
    );
    let (a, b) = (
        single["param_sq_sum"].as_f64().unwrap(),
        ddp["param_sq_sum"].as_f64().unwrap(),
    );
    assert!((a - b).abs() <= 1e-5 * a.abs(), "sum of squares {a} vs {b}");
    assert_ne!(
        single["first_loss"], single["final_loss"],
        "training moved the loss"
    );
}

/// The strategy `auto` ran, checked to be the one its planner chose and names in its reason.
/// Which layout that is over several ranks is measured: Ddp in a release build (predicted the
/// fastest outright), but in a debug build, in a busy test run, the MLP's step is dispatch and
/// Ddp and two stages come within the timings' precision, so either may be chosen.
fn planned_strategy(report: &serde_json::Value) -> String {
    let strategy = report["strategy"].as_str().unwrap().to_string();
    // After what chose the world (`the CPU's cores as 2 single-threaded ranks; `), if it was
    // chosen.
    let reason = report["strategy_reason"].as_str().unwrap();
    let planned = reason.rsplit("; ").next().unwrap();
    assert!(planned.starts_with(&format!("{strategy}: ")), "{report}");
    strategy
}

#[test]
fn auto_uses_the_cpu_cores_as_ranks_unless_a_world_is_named() {
    // No world named: every core a single-threaded rank, as many as the batch of 10 feeds.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let ranks = cores.min(10);
    let auto = train_json("auto", &[]);
    assert_eq!(auto["world"], ranks);
    match ranks {
        1 => assert_eq!(auto["strategy"], "single"),
        _ => assert_ne!(planned_strategy(&auto), "single", "{auto}"),
    }
    // A world named on the command line or in the config file is the user's.
    assert_eq!(train_json("auto1", &["--world", "1"])["strategy"], "single");
    let two = train_json("auto2", &["--world", "2"]);
    assert_eq!(two["world"], 2);
    assert_ne!(planned_strategy(&two), "single", "{two}");
    let config = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-cli-auto.toml");
    std::fs::write(&config, "world = 1\n").unwrap();
    let named = train_json("auto-toml", &["--config", config.to_str().unwrap()]);
    std::fs::remove_file(config).ok();
    assert_eq!(
        (named["strategy"].as_str(), named["world"].as_u64()),
        (Some("single"), Some(1))
    );
}

#[test]
fn devices_name_the_ranks() {
    // Two ranks sharing device 0: the same training as --world 2.
    let listed = train_json("devices", &["--strategy", "ddp", "--devices", "0,0"]);
    let world = train_json("world2", &["--strategy", "ddp", "--world", "2"]);
    assert_eq!(listed["world"], 2);
    assert_eq!(listed["param_sq_sum"], world["param_sq_sum"]);
    assert_one_line_error(
        &["train", "--devices", "0,1"],
        "device 1 does not exist: the flex backend has 1 device(s)",
    );
    assert_one_line_error(
        &["train", "--devices", "0,0", "--world", "3"],
        "--world 3 disagrees with --devices 0,0",
    );
    assert_one_line_error(&["train", "--devices", "0,x"], "device numbers");
    // The flags clap lists under its message stay on the line.
    assert_one_line_error(
        &["launch"],
        "required arguments were not provided: --nproc-per-node",
    );
    assert_one_line_error(
        &[
            "ad",
            "train",
            "--devices",
            "0,0",
            "--world",
            "3",
            "--steps",
            "1",
        ],
        "--world 3 disagrees with --devices 0,0",
    );
}

#[test]
fn pipeline_trains_like_single_and_reports_its_stages() {
    let single = train_json(
        "p-single",
        &["--strategy", "single", "--model", "transformer"],
    );
    for (name, extra) in [
        (
            "p-gpipe",
            vec!["--schedule", "gpipe", "--micro-batches", "4"],
        ),
        ("p-1f1b", vec!["--schedule", "1f1b", "--micro-batches", "3"]),
        ("p-recompute", vec!["--recompute", "--micro-batches", "3"]),
        ("p-dp", vec!["--dp", "2", "--micro-batches", "2"]),
    ] {
        let mut args = vec![
            "--strategy",
            "pipeline",
            "--stages",
            "2",
            "--model",
            "transformer",
        ];
        args.extend(extra);
        let report = train_json(name, &args);
        assert_eq!(report["strategy"], "pipeline", "{name}");
        let (a, b) = (
            single["param_sq_sum"].as_f64().unwrap(),
            report["param_sq_sum"].as_f64().unwrap(),
        );
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{name}: {a} vs {b}");
        let ranks = report["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), if name == "p-dp" { 4 } else { 2 }, "{name}");
        for rank in ranks {
            assert!(
                rank["peak_live_micro_batches"].as_u64().unwrap() >= 1,
                "{rank}"
            );
            assert!(rank["idle_s"].as_f64().is_some(), "{rank}");
        }
    }
}

#[test]
fn pipeline_settings_come_from_toml_too() {
    let config = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-cli-pipeline.toml");
    std::fs::write(
        &config,
        "strategy = \"pipeline\"\nworld = 2\n[parallel.pipeline]\nstages = 2\nmicro_batches = 3\nschedule = \"gpipe\"\n",
    )
    .unwrap();
    let report = train_json("p-toml", &["--config", config.to_str().unwrap()]);
    std::fs::remove_file(config).ok();
    assert_eq!(report["strategy"], "pipeline");
    let peaks: Vec<u64> = report["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["peak_live_micro_batches"].as_u64().unwrap())
        .collect();
    assert_eq!(peaks, vec![3, 3], "GPipe holds every micro-batch");
}

#[test]
fn impossible_pipelines_fail_with_one_line() {
    let pipeline = |extra: &[&str], needle: &str| {
        let args = [&["train", "--strategy", "pipeline"][..], extra].concat();
        assert_one_line_error(&args, needle);
    };
    pipeline(
        &["--stages", "3", "--world", "3"],
        "the pipeline has 3 stages but the model has 2 blocks",
    );
    pipeline(
        &["--stages", "2", "--world", "3"],
        "the world has 3 ranks, which is not dp × (stages × shards) = ? × 2",
    );
    pipeline(
        &[
            "--stages",
            "2",
            "--world",
            "2",
            "--batch",
            "4",
            "--micro-batches",
            "5",
        ],
        "5 micro-batches but a replica's shard",
    );
    assert_one_line_error(&["train", "--schedule", "zb"], "--schedule");
}

#[test]
fn impossible_settings_fail_with_one_line() {
    assert_one_line_error(&["train", "--world", "0"], "--world must be at least 1");
    assert_one_line_error(
        &["train", "--world", "4", "--batch", "3"],
        "smaller than the 4 data-parallel replicas",
    );
    assert_one_line_error(&["train", "--strategy", "single", "--world", "2"], "single");
    assert_one_line_error(&["train", "--strategy", "bogus"], "unknown strategy");
    assert_one_line_error(&["train", "--no-such-flag"], "--no-such-flag");
    assert_one_line_error(
        &["train", "--grad-accum", "0", "--steps", "1"],
        "grad_accumulation",
    );
}

#[test]
fn clipping_trains_differently_and_comes_from_flags_or_toml() {
    let plain = train_json("unclipped", &["--strategy", "ddp", "--world", "2"]);
    let clipped = train_json(
        "clipped",
        &[
            "--strategy",
            "ddp",
            "--world",
            "2",
            "--clip-norm",
            "0.01",
            "--nan-policy",
            "skip",
        ],
    );
    assert_eq!(clipped["skipped_steps"], 0, "{clipped}");
    assert_ne!(
        plain["param_sq_sum"], clipped["param_sq_sum"],
        "a tiny clip_norm changes the training"
    );

    let config = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-cli-optimizer.toml");
    std::fs::write(
        &config,
        "strategy = \"ddp\"\nworld = 2\n[optimizer]\nclip_norm = 0.01\nnan_policy = \"skip\"\n",
    )
    .unwrap();
    let from_toml = train_json("clipped-toml", &["--config", config.to_str().unwrap()]);
    std::fs::remove_file(config).ok();
    assert_eq!(from_toml["param_sq_sum"], clipped["param_sq_sum"]);
}

#[test]
fn bad_guard_settings_fail_with_one_line() {
    assert_one_line_error(&["train", "--clip-norm", "0", "--steps", "1"], "clip_norm");
    assert_one_line_error(&["train", "--clip-norm", "-1", "--steps", "1"], "clip_norm");
    assert_one_line_error(&["train", "--nan-policy", "ignore"], "unknown nan_policy");
}

#[test]
fn a_saved_run_resumes_bit_for_bit() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-cli-resume");
    let dir_arg = dir.to_str().unwrap();
    let common = [
        "--strategy",
        "ddp",
        "--world",
        "2",
        "--model",
        "transformer",
    ];
    let straight = train_json_steps("straight", "8", &common);
    let half = train_json_steps("half", "4", &[&common[..], &["--save", dir_arg]].concat());
    assert_eq!(half["steps"], 4);
    let resumed = train_json_steps(
        "resumed",
        "8",
        &[&common[..], &["--resume", dir_arg]].concat(),
    );
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(resumed["steps"], 4, "the resumed run trains steps 5 to 8");
    assert_eq!(resumed["final_loss"], straight["final_loss"]);
    assert_eq!(
        (
            resumed["param_sum"].as_f64(),
            resumed["param_sq_sum"].as_f64()
        ),
        (
            straight["param_sum"].as_f64(),
            straight["param_sq_sum"].as_f64()
        ),
        "the resumed run ends where the uninterrupted one does"
    );
    assert_one_line_error(
        &["train", "--resume", "/nonexistent/kiln-checkpoint"],
        "cannot read /nonexistent/kiln-checkpoint",
    );
}

#[test]
fn half_precision_trains_close_to_f32_and_not_under_the_pipeline() {
    let common = ["--strategy", "ddp", "--world", "2", "--steps", "30"];
    let report = |name: &str, precision: &str| {
        let args = [&common[..], &["--precision", precision]].concat();
        let path = json_path(name);
        let path_str = path.to_str().unwrap().to_string();
        let args = [
            &[
                "train",
                "--batch",
                "16",
                "--threads-per-rank",
                "1",
                "--json",
            ][..],
            &[path_str.as_str()],
            &args,
        ]
        .concat();
        let out = kiln(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        std::fs::remove_file(path).ok();
        json
    };
    let f32_run = report("p-f32", "f32");
    let f32_loss = f32_run["final_loss"].as_f64().unwrap();
    for precision in ["bf16", "f16"] {
        let run = report(&format!("p-{precision}"), precision);
        let loss = run["final_loss"].as_f64().unwrap();
        assert!(
            (loss - f32_loss).abs() <= 0.05 * f32_loss,
            "{precision}: final loss {loss} against f32's {f32_loss}"
        );
        assert_ne!(
            run["param_sq_sum"], f32_run["param_sq_sum"],
            "{precision} ran"
        );
    }
    assert_one_line_error(
        &[
            "train",
            "--precision",
            "bf16",
            "--strategy",
            "pipeline",
            "--world",
            "2",
        ],
        "does not run under pipeline",
    );
    assert_one_line_error(&["train", "--precision", "f8"], "unknown precision");
}

#[test]
fn tensor_trains_like_single_and_reports_each_rank_s_bytes() {
    let transformer = ["--model", "transformer"];
    let single = train_json(
        "t-single",
        &[&["--strategy", "single"][..], &transformer].concat(),
    );
    let whole = single["ranks"][0]["param_bytes"].as_u64().unwrap();
    for (name, extra, world, mesh) in [
        ("t-tp2", vec!["--tp", "2"], 2, "dp=1 × tp=2"),
        (
            "t-dp2-tp2",
            vec!["--tp", "2", "--dp", "2"],
            4,
            "dp=2 × tp=2",
        ),
        (
            "t-pp2-tp2",
            vec!["--tp", "2", "--stages", "2", "--micro-batches", "2"],
            4,
            "dp=1 × pp=2 × tp=2",
        ),
    ] {
        let args = [&["--strategy", "tensor"][..], &transformer, &extra].concat();
        let report = train_json(name, &args);
        assert_eq!(report["strategy"], "tensor", "{name}");
        assert_eq!(report["world"], world, "{name}");
        assert_eq!(report["mesh"], mesh, "{name}");
        let (a, b) = (
            single["param_sq_sum"].as_f64().unwrap(),
            report["param_sq_sum"].as_f64().unwrap(),
        );
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{name}: {a} vs {b}");
        for rank in report["ranks"].as_array().unwrap() {
            let held = rank["param_bytes"].as_u64().unwrap();
            assert!(
                held < whole,
                "{name}: a shard holds {held} of {whole} bytes"
            );
            assert!(
                rank["optimizer_bytes"].as_u64().unwrap() > 0,
                "{name}: {rank}"
            );
            assert!(rank["tp_calls"].as_u64().unwrap() > 0, "{name}: {rank}");
        }
    }
    // Mixed precision shards too: each shard computes in bf16 with f32 master weights.
    let bf16 = train_json(
        "t-tp2-bf16",
        &[
            &["--strategy", "tensor", "--tp", "2", "--precision", "bf16"][..],
            &transformer,
        ]
        .concat(),
    );
    assert_eq!(bf16["mesh"], "dp=1 × tp=2");
    let (first, last) = (
        bf16["first_loss"].as_f64().unwrap(),
        bf16["final_loss"].as_f64().unwrap(),
    );
    assert!(last < first, "bf16 under tensor: loss {first} -> {last}");
}

#[test]
fn impossible_tensor_plans_fail_with_one_line() {
    let tensor = |extra: &[&str], needle: &str| {
        let args = [
            &["train", "--strategy", "tensor", "--model", "transformer"][..],
            extra,
        ]
        .concat();
        assert_one_line_error(&args, needle);
    };
    tensor(
        &["--tp", "3"],
        "attention heads (4) does not divide by tp = 3",
    );
    tensor(
        &["--tp", "8"],
        "tp = 8 is larger than the 4 attention heads",
    );
    tensor(&["--tp", "2", "--world", "3"], "not dp × (stages × shards)");
    tensor(
        &["--tp", "2", "--stages", "2", "--precision", "bf16"],
        "does not run under tensor with pipeline stages",
    );
    assert_one_line_error(
        &["train", "--strategy", "tensor", "--model", "mlp"],
        "TensorParallelModel",
    );
    assert_one_line_error(
        &["train", "--strategy", "ddp", "--tp", "2"],
        "--tp applies to tensor and auto",
    );
    assert_one_line_error(
        &["train", "--strategy", "ddp", "--stages", "2"],
        "--stages applies to pipeline, tensor and auto",
    );
}

/// A flag the run would not read is refused, naming the strategies that read it.
#[test]
fn flags_the_strategy_would_ignore_are_refused() {
    assert_one_line_error(
        &["train", "--strategy", "tensor", "--micro-batches", "4"],
        "--micro-batches applies to pipeline and tensor (with --stages)",
    );
    assert_one_line_error(
        &["train", "--strategy", "single", "--dp", "2"],
        "--dp applies to data_parallel",
    );
    assert_one_line_error(
        &[
            "train",
            "--strategy",
            "data_parallel",
            "--bucket-cap-mb",
            "1",
        ],
        "--bucket-cap-mb applies to ddp, pipeline, tensor",
    );
    assert_one_line_error(
        &["train", "--strategy", "auto", "--shard-state", "optimizer"],
        "--shard-state applies to ddp, but the strategy is auto",
    );
    assert_one_line_error(
        &["train", "--strategy", "ddp", "--shard-state", "everything"],
        "unknown shard_state \"everything\"; use none, optimizer, gradients or parameters",
    );
}

#[test]
fn zero3_replicas_hold_their_part_of_the_parameters_between_steps() {
    // Measured by the counting allocator: ZeRO-3 holds what ZeRO-2 does, less the parameters
    // other replicas own. (The AD model: its parameters are blocks the allocator counts.)
    let held = |stage: &str| -> Vec<(u64, u64)> {
        let path = json_path(&format!("held-{stage}"));
        let out_dir =
            std::env::temp_dir().join(format!("kiln-held-{stage}-{}", std::process::id()));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args([
                "ad",
                "train",
                "--strategy",
                "ddp",
                "--world",
                "2",
                "--steps",
                "3",
            ])
            .args([
                "--no-eval",
                "--threads-per-rank",
                "1",
                "--shard-state",
                stage,
            ])
            .arg("--out")
            .arg(&out_dir)
            .arg("--json")
            .arg(&path)
            .env("RUST_LOG", "warn")
            .env(kiln_core::memory::SWITCH, "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::remove_dir_all(out_dir).ok();
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let ranks = report["train"]["ranks"].as_array().unwrap().clone();
        ranks
            .iter()
            .map(|r| {
                let field = |name: &str| r[name].as_u64().unwrap();
                (field("param_bytes"), field("held_bytes"))
            })
            .collect()
    };
    let (zero2, zero3) = (held("gradients"), held("parameters"));
    let total = |rows: &[(u64, u64)], pick: fn(&(u64, u64)) -> u64| -> f64 {
        rows.iter().map(pick).sum::<u64>() as f64
    };
    let released = total(&zero2, |r| r.0) - total(&zero3, |r| r.0);
    let freed = total(&zero2, |r| r.1) - total(&zero3, |r| r.1);
    // Each replica releases about half of the parameters (a part is within one parameter of
    // its share); the rest of what a rank holds (data, buffers) varies by a few percent of it.
    assert!(
        released > 0.4 * total(&zero2, |r| r.0),
        "released {released} of {} bytes",
        total(&zero2, |r| r.0)
    );
    assert!(
        (freed - released).abs() < 0.3 * released,
        "the allocator saw {freed} bytes fewer held, for {released} bytes of parameters released"
    );
}

#[test]
fn each_rank_s_peak_memory_is_counted_when_asked() {
    let report = |name: &str, batch: &str, count: bool| {
        let path = json_path(name);
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"));
        command.args([
            "train",
            "--model",
            "transformer",
            "--strategy",
            "ddp",
            "--world",
            "2",
        ]);
        command.args([
            "--steps",
            "2",
            "--batch",
            batch,
            "--threads-per-rank",
            "1",
            "--json",
        ]);
        command.arg(&path).env("RUST_LOG", "warn");
        if count {
            command.env(kiln_core::memory::SWITCH, "1");
        }
        let out = command.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let peaks = |report: &serde_json::Value| -> Vec<u64> {
        let ranks = report["ranks"].as_array().unwrap();
        ranks
            .iter()
            .map(|r| r["peak_bytes"].as_u64().unwrap())
            .collect()
    };
    let off = report("mem-off", "16", false);
    assert!(
        off["ranks"][0]["peak_bytes"].is_null(),
        "not asked: not counted"
    );
    let (small, large) = (report("mem-16", "16", true), report("mem-256", "256", true));
    let (small_peaks, large_peaks) = (peaks(&small), peaks(&large));
    for (rank, (s, l)) in small_peaks.iter().zip(&large_peaks).enumerate() {
        // Activations grow with the batch: 128 samples per rank hold more than 8.
        assert!(l > s, "rank {rank}: {l} bytes at batch 256, {s} at 16");
        let held = large["ranks"][rank]["optimizer_bytes"].as_u64().unwrap();
        assert!(
            *l > held,
            "rank {rank}: a peak of {l} below the optimizer state's {held}"
        );
    }
    // What the operating system saw bounds what the ranks counted, together.
    let resident = large["peak_resident_bytes"].as_u64().unwrap();
    let counted: u64 = large_peaks.iter().sum();
    assert!(
        counted < resident,
        "counted {counted}, resident at most {resident}"
    );
}
