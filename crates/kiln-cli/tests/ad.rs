//! `kiln ad train` and `kiln ad eval` end to end on a tiny config: the files they write, the
//! metrics they report, and one-line errors.

mod common;

use common::{assert_one_line_error, scratch, succeed};
use std::path::Path;

const TINY: &str = r#"
seed = 3
[env]
size = 5
horizon = 8
[goals]
held_out = 2
[source]
histories_per_goal = 2
episodes = 6
[model]
context = 16
d_model = 16
d_ff = 32
[train]
steps = 4
warmup_steps = 1
batch = 6
[eval]
episodes = 3
seeds = 2
"#;

fn metrics(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("metrics.json")).unwrap()).unwrap()
}

#[test]
fn train_then_eval_write_metrics_plot_and_checkpoint() {
    let dir = scratch("run");
    let config = dir.join("tiny.toml");
    std::fs::write(&config, TINY).unwrap();
    let out = dir.join("out");
    let (config, out_s) = (config.to_str().unwrap(), out.to_str().unwrap());
    let extra_json = dir.join("extra.json");
    let stdout = succeed(&[
        "ad",
        "train",
        "--config",
        config,
        "--out",
        out_s,
        "--world",
        "2",
        "--strategy",
        "ddp",
        "--threads-per-rank",
        "1",
        "--json",
        extra_json.to_str().unwrap(),
    ]);
    assert!(stdout.contains("trained with ddp on 2 rank(s)"), "{stdout}");
    for file in ["config.toml", "checkpoints", "metrics.json", "returns.svg"] {
        assert!(out.join(file).exists(), "{file} missing");
    }
    let m = metrics(&out);
    assert_eq!(
        m,
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&extra_json).unwrap())
            .unwrap()
    );
    assert_eq!(m["train"]["strategy"], "ddp");
    assert_eq!(m["train"]["steps"], 4);
    assert_eq!(m["data"]["train_goals"], 23);
    assert_eq!(m["data"]["histories"], 46);
    for curve in ["ad", "control", "source", "random"] {
        let c = &m["eval"][curve];
        assert_eq!(c["returns"].as_array().unwrap().len(), 3, "{curve}");
        assert!(c["first"].is_number() && c["last10"].is_number(), "{curve}");
    }
    assert_eq!(m["eval"]["goals"].as_array().unwrap().len(), 2);
    assert!(m["eval"]["acceptance"]["passed"].is_boolean());

    // Evaluating the saved run again reproduces the same AD curve.
    let stdout = succeed(&["ad", "eval", "--run", out_s]);
    assert!(stdout.contains("AD "), "{stdout}");
    let again = metrics(&out);
    assert_eq!(again["eval"]["ad"], m["eval"]["ad"]);
    assert!(again["train"].is_null());
    succeed(&[
        "ad",
        "eval",
        "--run",
        out_s,
        "--episodes",
        "5",
        "--seeds",
        "1",
    ]);
    assert_eq!(
        metrics(&out)["eval"]["ad"]["returns"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn auto_plans_the_ad_run_with_its_model_measured() {
    let dir = scratch("auto");
    let config = dir.join("tiny.toml");
    std::fs::write(&config, TINY).unwrap();
    let out = dir.join("out");
    let (config, out_s) = (config.to_str().unwrap(), out.to_str().unwrap());
    succeed(&[
        "ad",
        "train",
        "--config",
        config,
        "--out",
        out_s,
        "--world",
        "2",
        "--no-eval",
    ]);
    let train = &metrics(&out)["train"];
    let reason = train["strategy_reason"].as_str().unwrap();
    // The planner's reason, with its prediction, not the replica-per-rank rule's, for the
    // strategy that trained.
    let strategy = train["strategy"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("{strategy}: the ")) && reason.contains("ms a step predicted"),
        "{reason}"
    );
    assert_eq!(
        (train["world"].as_u64(), train["steps"].as_u64()),
        (Some(2), Some(4))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_ad_model_trains_through_tensor_parallelism() {
    let dir = scratch("tensor");
    let config = dir.join("tiny.toml");
    std::fs::write(&config, TINY).unwrap();
    let out = dir.join("out");
    let stdout = succeed(&[
        "ad",
        "train",
        "--config",
        config.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--strategy",
        "tensor",
        "--tp",
        "2",
        "--threads-per-rank",
        "1",
        "--no-eval",
    ]);
    assert!(
        stdout.contains("trained with tensor on 2 rank(s)"),
        "{stdout}"
    );
    let m = metrics(&out);
    assert_eq!(m["train"]["mesh"], "dp=1 × tp=2");
    for rank in m["train"]["ranks"].as_array().unwrap() {
        assert!(rank["param_bytes"].as_u64().unwrap() > 0, "{rank}");
        assert!(rank["tp_calls"].as_u64().unwrap() > 0, "{rank}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_ad_model_trains_through_the_pipeline() {
    let dir = scratch("pipeline");
    let config = dir.join("tiny.toml");
    std::fs::write(&config, TINY).unwrap();
    let out = dir.join("out");
    let stdout = succeed(&[
        "ad",
        "train",
        "--config",
        config.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--strategy",
        "pipeline",
        "--micro-batches",
        "2",
        "--schedule",
        "gpipe",
        "--threads-per-rank",
        "1",
        "--no-eval",
    ]);
    assert!(
        stdout.contains("trained with pipeline on 2 rank(s)"),
        "{stdout}"
    );
    let m = metrics(&out);
    let ranks = m["train"]["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    for rank in ranks {
        assert_eq!(rank["peak_live_micro_batches"], 2, "{rank}");
        assert!(
            rank["peak_activation_bytes"].as_u64().unwrap() > 0,
            "{rank}"
        );
    }
}

#[test]
fn bad_settings_fail_with_one_line() {
    let dir = scratch("bad");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[model]\ncontext = 60\nwidth = 3\n").unwrap();
    assert_one_line_error(
        &["ad", "train", "--config", bad.to_str().unwrap()],
        "line 3",
    );
    assert_one_line_error(
        &["ad", "train", "--world", "0"],
        "train.world must be at least 1",
    );
    assert_one_line_error(
        &["ad", "train", "--strategy", "single", "--world", "2"],
        "single",
    );
    assert_one_line_error(
        &["ad", "train", "--batch", "1", "--world", "2"],
        "the global batch of 1 is smaller than the 2 data-parallel replicas",
    );
    assert_one_line_error(
        &["ad", "eval", "--run", dir.join("none").to_str().unwrap()],
        "none: no such file or folder",
    );
    // Sizes that once overflowed `episodes · horizon` or allocated by the value.
    for (toml, needle) in [
        (
            "[eval]\nepisodes = 9223372036854775807\n",
            "eval.episodes is 9223372036854775807, beyond 65536",
        ),
        (
            "[eval]\nseeds = 4294967296\n",
            "eval.seeds is 4294967296, beyond 1024",
        ),
        (
            "[source]\nepisodes = 9223372036854775807\n",
            "source.episodes is 9223372036854775807, beyond",
        ),
        (
            "[model]\nlayers = 1000000\n",
            "model.layers is 1000000, beyond 1024",
        ),
    ] {
        std::fs::write(&bad, toml).unwrap();
        assert_one_line_error(&["ad", "train", "--config", bad.to_str().unwrap()], needle);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ad_runs_save_periodically_resume_and_refuse_another_config() {
    fn joined<'a>(common: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [common, extra].concat()
    }
    let dir = scratch("resume");
    let config = dir.join("tiny.toml");
    std::fs::write(&config, TINY).unwrap();
    let config = config.to_str().unwrap();
    let (full, resumed, straight) = (dir.join("full"), dir.join("resumed"), dir.join("straight"));
    let common = [
        "ad",
        "train",
        "--config",
        config,
        "--world",
        "1",
        "--no-eval",
    ];
    let full_s = full.to_str().unwrap();
    succeed(&joined(&common, &["--save-every", "2", "--out", full_s]));
    let mut saved: Vec<String> = std::fs::read_dir(full.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("step-"))
        .collect();
    saved.sort();
    assert_eq!(saved, ["step-00000002", "step-00000004"]);

    // Step 2's checkpoint, resumed into another folder, trains steps 3 and 4 again.
    let step_2 = full.join("checkpoints").join("step-00000002");
    let step_2 = step_2.to_str().unwrap();
    let out = resumed.to_str().unwrap();
    let stdout = succeed(&joined(&common, &["--out", out, "--resume", step_2]));
    assert!(stdout.contains("(resumed at step 2)"), "{stdout}");
    succeed(&joined(&common, &["--out", straight.to_str().unwrap()]));
    let train = |d: &Path| metrics(d)["train"].clone();
    assert_eq!(train(&resumed)["resumed_from"], 2);
    assert_eq!(train(&resumed)["last_step"], 4);
    // The resumed run's steps 3 and 4 are the straight run's, loss for loss.
    let curve = |d: &Path| train(d)["loss_curve"].as_array().unwrap().clone();
    assert_eq!(curve(&resumed)[..], curve(&straight)[2..]);

    // Another learning rate is refused before any data is generated, naming the setting.
    let other = dir.join("other");
    let other = other.to_str().unwrap();
    assert_one_line_error(
        &joined(
            &common,
            &["--out", other, "--resume", step_2, "--lr", "0.5"],
        ),
        "train.lr differ",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn auto_resumes_an_ad_run_on_the_layout_its_checkpoint_saved() {
    // Saved by a pipeline of two stages; `auto` alone would lay two ranks out as replicas.
    let dir = scratch("auto-resume");
    let config = dir.join("tiny.toml");
    std::fs::write(&config, TINY).unwrap();
    let config = config.to_str().unwrap();
    let (staged, resumed) = (dir.join("staged"), dir.join("resumed"));
    let common = [
        "ad",
        "train",
        "--config",
        config,
        "--world",
        "2",
        "--no-eval",
    ];
    let staged_s = staged.to_str().unwrap();
    let pipeline = ["--strategy", "pipeline", "--stages", "2", "--steps", "2"];
    succeed(&[&common[..], &pipeline, &["--out", staged_s]].concat());
    let resume = ["--resume", staged_s, "--out", resumed.to_str().unwrap()];
    let stdout = succeed(&[&common[..], &resume].concat());
    assert!(stdout.contains("(resumed at step 2)"), "{stdout}");
    let train = &metrics(&resumed)["train"];
    assert_eq!(train["strategy"], "pipeline", "{train}");
    let reason = train["strategy_reason"].as_str().unwrap();
    assert!(
        reason.contains("pp=2 tp=1 (the checkpoint's layout)"),
        "{reason}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
