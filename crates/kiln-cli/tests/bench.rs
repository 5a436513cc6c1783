//! `kiln bench`: the strategy matrix at its quick size writes valid JSON, Markdown and SVG and
//! compares against an earlier run; the kernel benchmarks fail with one line where they cannot
//! run. (Kernel measurements need a wgpu or CUDA build; the kernels' correctness is tested in
//! kiln-kernels.)

mod common;

use std::path::PathBuf;

use common::{assert_one_line_error, kiln};

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-bench-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

/// Runs `kiln bench strategies --quick --out DIR extra…` and returns DIR and stdout.
fn bench_strategies(name: &str, extra: &[&str]) -> (PathBuf, String) {
    let dir = out_dir(name);
    let mut args = vec![
        "bench",
        "strategies",
        "--quick",
        "--out",
        dir.to_str().unwrap(),
    ];
    args.extend(extra);
    let out = kiln(&args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (dir, String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn the_quick_strategy_matrix_writes_json_markdown_and_svg() {
    let (dir, stdout) = bench_strategies("quick", &[]);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("strategies.json")).unwrap())
            .expect("valid JSON");
    let results = json["results"].as_array().unwrap();
    // 4 models × (single at world 1; data_parallel, ddp and pipeline at world 2), and tensor
    // at world 2 for the two models that shard at the benchmark's sizes.
    assert_eq!(results.len(), 18);
    for model in ["transformer", "ad"] {
        let r = results
            .iter()
            .find(|r| r["scenario"]["model"] == model && r["scenario"]["strategy"] == "tensor")
            .unwrap_or_else(|| panic!("{model} tensor missing"));
        for rank in r["ranks"].as_array().unwrap() {
            assert!(rank["tp_calls"].as_f64().unwrap() > 0.0, "{r}");
            assert!(rank["param_bytes"].as_u64().unwrap() > 0, "{r}");
        }
    }
    for model in ["mlp", "transformer", "ad", "qlora"] {
        for strategy in ["single", "data_parallel", "ddp", "pipeline"] {
            let r = results
                .iter()
                .find(|r| r["scenario"]["model"] == model && r["scenario"]["strategy"] == strategy)
                .unwrap_or_else(|| panic!("{model} {strategy} missing"));
            let world = r["scenario"]["world"].as_u64().unwrap();
            assert_eq!(world, if strategy == "single" { 1 } else { 2 });
            assert!(r["samples_per_s"].as_f64().unwrap() > 0.0, "{r}");
            let ms = &r["step_ms"];
            let (min, median, max) = (
                ms["min"].as_f64(),
                ms["median"].as_f64(),
                ms["max"].as_f64(),
            );
            assert!(min <= median && median <= max && min.unwrap() > 0.0, "{ms}");
            let ranks = r["ranks"].as_array().unwrap();
            assert_eq!(ranks.len() as u64, world, "{r}");
            assert!(
                ranks
                    .iter()
                    .all(|k| k["compute_ms"].as_f64().unwrap() > 0.0),
                "{r}"
            );
            if strategy == "pipeline" {
                assert!(
                    ranks.iter().any(|k| k["idle_ms"].as_f64().unwrap() > 0.0),
                    "{r}"
                );
            }
        }
    }
    let table = std::fs::read_to_string(dir.join("strategies.md")).unwrap();
    assert_eq!(
        table.lines().filter(|l| l.starts_with("| ")).count(),
        2 + 18,
        "header, rule and a row per scenario"
    );
    assert!(stdout.contains(&table), "the table is printed too");
    let svg = std::fs::read_to_string(dir.join("strategies.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for label in [
        "mlp: samples/s",
        "qlora: samples/s",
        "ideal: single × world",
        "pipeline",
    ] {
        assert!(svg.contains(label), "the chart lacks {label:?}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn compare_prints_ratios_against_an_earlier_run() {
    let (old, _) = bench_strategies("old", &["--models", "mlp", "--strategies", "single,ddp"]);
    let old_json = old.join("strategies.json");
    let (new, stdout) = bench_strategies(
        "new",
        &[
            "--models",
            "mlp",
            "--strategies",
            "single,ddp,pipeline",
            "--compare",
            old_json.to_str().unwrap(),
        ],
    );
    assert!(
        stdout.contains("| model | strategy | world | samples/s old | samples/s new | new / old |")
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("| mlp |") && l.ends_with("× |"))
        .collect();
    assert_eq!(rows.len(), 2, "single and ddp have ratios: {stdout}");
    assert!(
        stdout.contains("| mlp | pipeline | 2 | – |"),
        "a new scenario has none: {stdout}"
    );
    // A report of another scale measured something else: refused before anything runs.
    let full = std::fs::read_to_string(&old_json)
        .unwrap()
        .replace("\"scale\": \"quick\"", "\"scale\": \"full\"");
    std::fs::write(&old_json, full).unwrap();
    assert_one_line_error(
        &[
            "bench",
            "strategies",
            "--quick",
            "--compare",
            old_json.to_str().unwrap(),
        ],
        "--compare: the earlier report measured flex at Full scale but this run is flex at Quick scale",
    );
    for dir in [old, new] {
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn strategy_benchmarks_fail_with_one_line() {
    assert_one_line_error(
        &[
            "bench",
            "strategies",
            "--quick",
            "--compare",
            "/nonexistent/strategies.json",
        ],
        "cannot read --compare /nonexistent/strategies.json",
    );
    assert_one_line_error(
        &["bench", "strategies", "--quick", "--strategies", "auto"],
        "`auto` only picks one of the other strategies",
    );
    assert_one_line_error(
        &["bench", "strategies", "--quick", "--models", "resnet"],
        "unknown model \"resnet\"",
    );
    assert_one_line_error(
        &[
            "bench",
            "strategies",
            "--quick",
            "--strategies",
            "single",
            "--worlds",
            "2",
        ],
        "the matrix has no scenario",
    );
    assert_one_line_error(
        &[
            "bench",
            "strategies",
            "--quick",
            "--models",
            "transformer",
            "--worlds",
            "1,16",
        ],
        "transformer data_parallel world 16: the global batch of 8 is smaller than the 16 data-parallel replicas",
    );
}

#[test]
fn kernel_benchmarks_refuse_a_cpu_backend() {
    assert_one_line_error(
        &["bench", "kernels", "--backend", "flex"],
        "kernel benchmarks need a CubeCL backend (--backend wgpu or cuda)",
    );
}

#[test]
fn kernel_benchmarks_name_the_missing_feature() {
    // This test binary is built without the `cuda` feature.
    assert_one_line_error(
        &["bench", "kernels", "--backend", "cuda"],
        "backend cuda is not compiled in; rebuild with `--features cuda`",
    );
}

#[test]
fn the_plan_bench_sets_every_candidate_s_prediction_beside_its_measurement() {
    let dir = out_dir("plan");
    let args = [
        "bench",
        "plan",
        "--models",
        "transformer",
        "--worlds",
        "1,2",
        "--global-batch",
        "8",
        "--rounds",
        "2",
        "--seconds",
        "0",
        "--out",
        dir.to_str().unwrap(),
    ];
    let out = kiln(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    // Single at world 1; Ddp (its state whole and at each ZeRO stage), pipeline and tensor
    // at world 2.
    assert_eq!(rows.len(), 7, "{report}");
    let mut split = rows
        .iter()
        .filter(|r| r["layout"]["shard_state"] != "none")
        .map(|r| {
            assert_eq!(r["strategy"], "ddp", "{r}");
            r["layout"]["shard_state"].as_str().unwrap()
        })
        .collect::<Vec<_>>();
    split.sort_unstable();
    assert_eq!(split, ["gradients", "optimizer", "parameters"], "{report}");
    // Each round calibrates afresh, and each row holds every round's prediction and timing,
    // the row's own being one of them.
    let calibrated: Vec<u64> = report["calibrations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["round"].as_u64().unwrap())
        .collect();
    assert_eq!(calibrated, [1, 2], "{report}");
    for row in rows {
        let rounds = row["rounds"].as_array().unwrap();
        assert_eq!(rounds.len(), 2, "{row}");
        let (predicted, measured) = (&row["predicted"]["total"], &row["measured"]);
        assert!(measured.as_f64().unwrap() > 0.0, "{row}");
        assert!(predicted.as_f64().unwrap() > 0.0, "{row}");
        assert!(
            rounds
                .iter()
                .any(|r| &r["predicted"] == predicted && &r["measured"] == measured),
            "{row}"
        );
    }
    assert_eq!(rows.iter().filter(|r| r["chosen"] == true).count(), 2);
    let table = std::fs::read_to_string(dir.join("plan.md")).unwrap();
    assert!(table.contains("rank correlation"), "{table}");
    assert!(table.contains("world 2: auto chooses"), "{table}");
    std::fs::remove_dir_all(dir).ok();
}
