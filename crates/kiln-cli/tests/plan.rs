//! `kiln plan` end to end: described models and clusters, its JSON, and its errors.

mod common;

use common::{assert_one_line_error, fixture, kiln};

const LLAMA_70B: [&str; 16] = [
    "--layers",
    "80",
    "--hidden",
    "8192",
    "--heads",
    "64",
    "--kv-heads",
    "8",
    "--ffn",
    "28672",
    "--seq",
    "4096",
    "--vocab",
    "32000",
    "--gated",
    "--tied",
];

/// A candidate's blocks of each stage, from `kiln plan --json`.
fn stage_blocks(candidate: &serde_json::Value) -> Vec<u64> {
    candidate["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect()
}

fn plan_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["plan", "--json", "-"];
    all.extend_from_slice(args);
    let out = kiln(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_70b_model_on_64_gpus_is_split_and_every_layout_is_listed() {
    let args = [
        &LLAMA_70B[..],
        &["--global-batch", "512", "--devices", "64"],
    ]
    .concat();
    let report = plan_json(&args);
    let candidates = report["candidates"].as_array().unwrap();
    // Every mesh of 64 devices whose tp divides the 8 key-value heads and pp the 80 blocks,
    // and whose dp divides the batch: tp ∈ {1, 2, 4, 8}, pp ∈ divisors of 64 / tp; and the
    // plain replicas (dp 64) three more times, at each ZeRO stage.
    let even: Vec<_> = candidates
        .iter()
        .filter(|c| c["layout"]["split"] == "even")
        .collect();
    assert_eq!(even.len(), 7 + 6 + 5 + 4 + 3, "{report}");
    // Meshes with stages may also be listed balanced (the head's stage lighter), where that
    // cuts other blocks than the even split; every cut adds up to the model's 80 blocks.
    for c in candidates {
        let blocks = stage_blocks(c);
        assert_eq!(blocks.iter().sum::<u64>(), 80, "{c}");
        assert_eq!(
            blocks.len() as u64,
            c["layout"]["pp"].as_u64().unwrap(),
            "{c}"
        );
        if c["layout"]["split"] != "even" {
            assert_eq!(c["layout"]["split"], "balanced", "{c}");
        }
    }
    // Plain replicas also split their state, at each ZeRO stage.
    let mut stages: Vec<_> = candidates
        .iter()
        .filter(|c| c["layout"]["shard_state"] != "none")
        .map(|c| {
            assert_eq!(c["layout"]["dp"], 64, "{c}");
            c["layout"]["shard_state"].as_str().unwrap()
        })
        .collect();
    stages.sort_unstable();
    assert_eq!(stages, ["gradients", "optimizer", "parameters"], "{report}");
    for c in candidates {
        let l = &c["layout"];
        let devices = ["dp", "pp", "tp"].map(|k| l[k].as_u64().unwrap());
        assert_eq!(devices.iter().product::<u64>(), 64, "{c}");
        let samples = l["micro_batches"].as_u64().unwrap() * l["micro_batch"].as_u64().unwrap();
        assert_eq!(samples * devices[0], 512, "{c}");
        for key in [
            "weights",
            "trainable_state",
            "activations",
            "buckets",
            "total",
        ] {
            assert!(c["memory"][key].as_f64().unwrap() >= 0.0, "{c}");
        }
    }
    let chosen = &candidates[0];
    assert!(chosen["rejected"].is_null());
    let split = chosen["layout"]["pp"].as_u64().unwrap() * chosen["layout"]["tp"].as_u64().unwrap();
    assert!(split > 1, "no device holds a replica: {chosen}");
    // The chosen, then the others that fit, fastest first.
    let fits: Vec<f64> = candidates
        .iter()
        .skip(1)
        .take_while(|c| c["rejected"].is_null())
        .map(|c| c["time"]["total"].as_f64().unwrap())
        .collect();
    assert!(fits.windows(2).all(|w| w[0] <= w[1]), "{fits:?}");
    let replicas = candidates
        .iter()
        .find(|c| c["layout"]["pp"] == 1 && c["layout"]["tp"] == 1)
        .unwrap();
    assert!(
        replicas["rejected"]
            .as_str()
            .unwrap()
            .contains("GiB per device")
    );
    let reason = report["reason"].as_str().unwrap();
    assert!(
        reason.contains("the fastest of") && reason.contains("rejected"),
        "{reason}"
    );
}

#[test]
fn the_table_shows_the_best_and_the_choice() {
    let args = [
        &["plan"][..],
        &LLAMA_70B,
        &["--global-batch", "512", "--devices", "64", "--top", "3"],
    ]
    .concat();
    let out = kiln(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(": 68.71 G parameters (68.71 G training)"),
        "{text}"
    );
    assert_eq!(text.matches("| fits |").count(), 3, "{text}");
    // 25 layouts of even stages (as the JSON test counts them), 8 also listed balanced.
    assert!(text.contains("(30 more: --top 33 or --json)"), "{text}");
    assert!(text.contains("\nChosen: "), "{text}");
}

#[test]
fn one_device_trains_alone_and_a_small_model_is_replicated() {
    let small = [
        "--layers",
        "2",
        "--hidden",
        "64",
        "--heads",
        "4",
        "--seq",
        "32",
        "--vocab",
        "100",
        "--global-batch",
        "16",
    ];
    let one = plan_json(&[&small[..], &["--devices", "1"]].concat());
    assert_eq!(one["candidates"][0]["strategy"], "single");
    // GPT-2 small at 1024 tokens: it fits on every device, and replicas waste nothing.
    let gpt2 = [
        "--layers",
        "12",
        "--hidden",
        "768",
        "--heads",
        "12",
        "--seq",
        "1024",
        "--vocab",
        "50257",
        "--tied",
        "--global-batch",
        "64",
    ];
    let eight = plan_json(&[&gpt2[..], &["--devices", "8"]].concat());
    assert_eq!(eight["candidates"][0]["strategy"], "ddp");
    assert_eq!(eight["candidates"][0]["layout"]["dp"], 8);
}

#[test]
fn a_hugging_face_config_is_planned_with_its_own_parameter_count() {
    // LLaMA, and Qwen2 with its query, key and value biases.
    for model in ["llama", "qwen2"] {
        let folder = fixture(model);
        let args = [
            "--model-config",
            &folder,
            "--global-batch",
            "8",
            "--devices",
            "2",
        ];
        let report = plan_json(&args);
        let config = std::path::Path::new(&folder).join("config.json");
        let expected = kiln_nn::llm::LlmConfig::from_file(&config)
            .unwrap()
            .parameters();
        assert_eq!(report["workload"]["params"], expected as u64, "{model}");
    }
}

#[test]
fn qlora_plans_the_everyday_fine_tune_on_one_small_gpu() {
    let seven = [
        "--layers",
        "32",
        "--hidden",
        "4096",
        "--heads",
        "32",
        "--ffn",
        "11008",
        "--gated",
        "--seq",
        "512",
        "--vocab",
        "32000",
        "--global-batch",
        "4",
        "--devices",
        "1",
        "--device-memory",
        "24GiB",
    ];
    let full = [&["plan"][..], &seven].concat();
    assert_one_line_error(&full, "nothing fits");
    let qlora = plan_json(&[&seven[..], &["--lora-rank", "16", "--load-in-4bit"]].concat());
    assert_eq!(qlora["workload"]["trainable"], 39_976_960);
    assert_eq!(qlora["candidates"][0]["strategy"], "single");
    assert!(qlora["candidates"][0]["rejected"].is_null());
    assert_one_line_error(
        &[&full[..], &["--load-in-4bit"]].concat(),
        "add --lora-rank",
    );
}

#[test]
fn what_cannot_be_planned_is_said_in_one_line() {
    assert_one_line_error(
        &[
            &["plan"][..],
            &LLAMA_70B,
            &[
                "--global-batch",
                "8",
                "--devices",
                "2",
                "--device",
                "a100-40g",
            ],
        ]
        .concat(),
        "nothing fits: the smallest layout",
    );
    assert_one_line_error(
        &["plan", "--layers", "2", "--global-batch", "8"],
        "missing: --hidden, --heads, --seq, --vocab",
    );
    assert_one_line_error(
        &[
            &["plan"][..],
            &LLAMA_70B,
            &["--global-batch", "8", "--device", "tpu"],
        ]
        .concat(),
        "unknown --device tpu: use one of h100-sxm",
    );
    assert_one_line_error(
        &[
            &["plan"][..],
            &LLAMA_70B,
            &["--global-batch", "8", "--device-memory", "80 bananas"],
        ]
        .concat(),
        "is not a unit of size",
    );
}

/// `kiln train --model transformer --json` with `args`, 2 steps.
fn train(name: &str, args: &[&str]) -> serde_json::Value {
    let path = std::env::temp_dir().join(format!("kiln-plan-{}-{name}.json", std::process::id()));
    let path_text = path.to_str().unwrap().to_string();
    let mut all = vec![
        "train",
        "--model",
        "transformer",
        "--steps",
        "2",
        "--batch",
        "8",
    ];
    all.extend_from_slice(args);
    all.extend(["--json", path_text.as_str()]);
    let out = kiln(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    report
}

#[test]
fn memory_predictions_match_the_bytes_kiln_s_strategies_hold() {
    use kiln_core::plan::cost::{Layout, Preset, StageSplit, Workload, memory};
    // The built-in transformer: 16 tokens and 16 positions of width 32, 2 pre-norm blocks
    // (4 heads, feed-forward 64, biases everywhere), a head with a bias; f32 and AdamW.
    let (v, l, d, f) = (16u64, 16u64, 32u64, 64u64);
    let embedding = v * d + l * d;
    let head = d * v + v;
    let block = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * (2 * d);
    let params = embedding + head + 2 * block;
    let work = Workload {
        params,
        trainable: params,
        embedding_params: embedding,
        head_params: head,
        weight_bytes: 4.0,
        trainable_extra_bytes: 12.0,
        gradient_bytes: 4.0,
        activation_bytes: 4.0,
        forward_flops: 0.0,
        head_flops: 0.0,
        backward_passes: 2.0,
        layers: 2,
        block_activation_bytes: vec![0.0; 4],
        shardable: 4,
        head_activation_bytes: 0.0,
        boundary_bytes: 0.0,
        tp_bytes: 0.0,
        global_batch: 8,
        fixed_bytes: 0.0,
        stage_activation_scale: 1.0,
        recomputes_blocks: false,
    };
    let layout = |dp, pp, tp| Layout {
        dp,
        pp,
        tp,
        micro_batches: 2,
        micro_batch: 8 / dp / 2,
        recompute: false,
        shard_state: kiln_core::plan::ShardState::None,
        split: StageSplit::Even,
    };
    let most = |report: &serde_json::Value, keys: &[&str]| -> f64 {
        let ranks = report["ranks"].as_array().unwrap();
        let per_rank = ranks
            .iter()
            .map(|r| keys.iter().map(|k| r[k].as_u64().unwrap()).sum::<u64>());
        per_rank.max().unwrap() as f64
    };
    // Weights and trainable state, which do not depend on the devices' kind.
    let gpus = Preset::named("h100-sxm").unwrap().cluster(4, 4, 0.5);
    for (name, args, layout, tolerance) in [
        (
            "ddp",
            vec!["--strategy", "ddp", "--world", "2"],
            layout(2, 1, 1),
            0.0,
        ),
        // ZeRO-1: the moments halved. (ZeRO-2's and ZeRO-3's reports give what a replica holds
        // between steps, where the planner predicts the step's peak, the gradients whole.)
        (
            "zero1",
            vec![
                "--strategy",
                "ddp",
                "--world",
                "2",
                "--shard-state",
                "optimizer",
            ],
            Layout {
                shard_state: kiln_core::plan::ShardState::Optimizer,
                ..layout(2, 1, 1)
            },
            // Owners own whole parameters, balanced by elements: one holds 64 bytes more.
            0.001,
        ),
        (
            "pipeline",
            vec![
                "--strategy",
                "pipeline",
                "--stages",
                "2",
                "--micro-batches",
                "2",
            ],
            layout(1, 2, 1),
            0.0,
        ),
        // The shards also hold whole copies of the norms and of the row-parallel layers'
        // biases, which the model counts as split: 2 % more.
        (
            "tensor",
            vec!["--strategy", "tensor", "--tp", "2"],
            layout(1, 1, 2),
            0.03,
        ),
    ] {
        let report = train(name, &args);
        let predicted = memory(&work, &gpus, &layout);
        let weights = most(&report, &["param_bytes"]);
        let state = most(&report, &["grad_bytes", "optimizer_bytes"]);
        for (what, held, predicted) in [
            ("weights", weights, predicted.weights),
            ("gradients and moments", state, predicted.trainable_state),
        ] {
            let error = (held - predicted).abs() / held;
            assert!(
                error <= tolerance,
                "{name}: {what}: Kiln holds {held} bytes, the planner predicts {predicted}"
            );
        }
    }
}

/// `kiln plan --model`: the built-in transformer measured on this machine, its candidates on
/// `devices` ranks.
fn measured_candidates(devices: usize) -> Vec<serde_json::Value> {
    let devices = devices.to_string();
    let report = plan_json(&[
        "--model",
        "transformer",
        "--global-batch",
        "8",
        "--devices",
        &devices,
    ]);
    let cluster = &report["cluster"];
    for key in ["per_sample", "per_micro_batch", "per_update"] {
        assert!(
            cluster["measured"][key].as_f64().unwrap() >= 0.0,
            "{cluster}"
        );
    }
    assert!(
        cluster["intra_latency"].as_f64().unwrap() > 0.0,
        "{cluster}"
    );
    report["candidates"].as_array().unwrap().clone()
}

#[test]
fn every_plan_auto_can_choose_here_trains_as_one_device_does() {
    use kiln_core::plan::cost::Candidate;
    use kiln_core::strategy::StrategyConfigs;
    let run = |name: &str, strategy: &str, world: usize, parallel: Option<toml::Value>| {
        let mut config = toml::Table::new();
        config.insert("model".into(), "transformer".into());
        config.insert("strategy".into(), strategy.into());
        config.insert("world".into(), (world as i64).into());
        if let Some(parallel) = parallel {
            config.insert("parallel".into(), parallel);
        }
        let path =
            std::env::temp_dir().join(format!("kiln-plan-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
        let report = train(name, &["--config", path.to_str().unwrap()]);
        std::fs::remove_file(path).ok();
        report
    };
    let single = run("single", "single", 1, None);
    let expected = single["param_sq_sum"].as_f64().unwrap();
    let mut layouts = 0;
    for devices in [2, 4] {
        for value in measured_candidates(devices) {
            let c: Candidate = serde_json::from_value(value).unwrap();
            if c.rejected.is_some() {
                continue;
            }
            let parallel = toml::Value::try_from(c.configs(&StrategyConfigs::default())).unwrap();
            let name = format!(
                "{}-{}-{}-{}-{}-zero{}",
                c.strategy.name(),
                c.layout.dp,
                c.layout.pp,
                c.layout.tp,
                c.layout.micro_batches,
                c.layout.shard_state.zero_stage()
            );
            let report = run(&name, c.strategy.name(), c.ranks(), Some(parallel));
            assert_eq!(
                report["mesh"].as_str().unwrap().contains("pp="),
                c.layout.pp > 1 || c.strategy.name() == "pipeline",
                "{name}: {report}"
            );
            let found = report["param_sq_sum"].as_f64().unwrap();
            assert!(
                (found - expected).abs() <= 1e-5 * expected,
                "{name}: sum of squares {found}, one device {expected}"
            );
            layouts += 1;
        }
    }
    // Ddp (whole and at each ZeRO stage), pipeline and tensor at 2 ranks; at 4, their meshes
    // and the 3-D one.
    assert!(layouts >= 12, "{layouts} layouts");
}

#[test]
fn auto_plans_batches_smaller_than_its_calibration() {
    // Two samples over two ranks: the step is timed at 8 samples, and the planner's choice
    // runs (Ddp in a release build; in a busy debug test run two stages of the MLP's
    // dispatch-bound step may come within the timings' precision of it).
    let out = kiln(&[
        "train",
        "--batch",
        "2",
        "--world",
        "2",
        "--steps",
        "1",
        "--samples",
        "16",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        ["ddp", "pipeline"]
            .iter()
            .any(|s| text.contains(&format!("with {s} on 2 rank(s)"))),
        "{text}"
    );
}

#[test]
fn auto_says_what_it_planned_with() {
    let report = train("auto", &[]);
    let reason = report["strategy_reason"].as_str().unwrap();
    assert!(
        reason.contains("ms a step predicted") && reason.contains("layouts that fit"),
        "{reason}"
    );
}

#[test]
fn auto_keeps_the_stages_and_shards_a_user_fixes() {
    // Two stages fixed: the planner lays out the rest of two ranks around them.
    let report = train("auto-stages", &["--world", "2", "--stages", "2"]);
    assert_eq!(report["strategy"], "pipeline", "{report}");
    let reason = report["strategy_reason"].as_str().unwrap();
    assert!(
        reason.contains("pp=2 tp=any (as [parallel.auto] or its flags fix)"),
        "{reason}"
    );
    // Micro-batches and recomputation fixed too: two stages that recompute, the replica's 8
    // samples in 2 micro-batches.
    let report = train(
        "auto-recompute",
        &[
            "--world",
            "2",
            "--stages",
            "2",
            "--micro-batches",
            "2",
            "--recompute",
        ],
    );
    assert_eq!(report["strategy"], "pipeline", "{report}");
    let reason = report["strategy_reason"].as_str().unwrap();
    assert!(
        reason.contains("pp=2 tp=any, 2 micro-batch(es), recomputed")
            && reason.contains("dp=1 pp=2 tp=1, 2 micro-batch(es) of 4, recomputed"),
        "{reason}"
    );
    // The same from a config file's [parallel.auto].
    let config = std::env::temp_dir().join(format!("kiln-plan-{}-auto.toml", std::process::id()));
    std::fs::write(&config, "[parallel.auto]\nstages = 2\n").unwrap();
    let report = train(
        "auto-toml",
        &["--world", "2", "--config", config.to_str().unwrap()],
    );
    assert_eq!(report["strategy"], "pipeline", "{report}");
    std::fs::remove_file(&config).unwrap();
    // Shards the ranks cannot hold, or a precision that rules stages out, are refused.
    assert_one_line_error(
        &[
            "train",
            "--world",
            "2",
            "--tp",
            "4",
            "--model",
            "transformer",
        ],
        "the world has 2 ranks, which is not dp × (stages × shards) = ? × 4",
    );
    assert_one_line_error(
        &[
            "train",
            "--world",
            "2",
            "--stages",
            "2",
            "--precision",
            "bf16",
        ],
        "fixes pp=2 tp=any, against pp=1 tp=any (bf16 runs without pipeline stages)",
    );
    // auto runs 1F1B; a gradient accumulation apart from the micro-batches is refused.
    assert_one_line_error(
        &["train", "--schedule", "gpipe"],
        "--schedule applies to pipeline and tensor (with --stages); auto runs 1F1B",
    );
    assert_one_line_error(
        &["train", "--micro-batches", "2", "--grad-accum", "4"],
        "auto: its micro-batches are set twice, apart: 2",
    );
}

/// `kiln plan` of the 70B model on a global batch of 512, each flag of `overrides` set to its
/// value (or added).
fn llama_with(overrides: &[(&str, &str)]) -> Vec<String> {
    let mut args: Vec<String> = ["plan", "--global-batch", "512"].map(String::from).to_vec();
    args.extend(LLAMA_70B.iter().map(|s| s.to_string()));
    for (flag, value) in overrides {
        match args.iter().position(|a| a == flag) {
            Some(at) => args[at + 1] = value.to_string(),
            None => args.extend([flag.to_string(), value.to_string()]),
        }
    }
    args
}

#[test]
fn sizes_past_the_planner_s_range_are_refused_not_wrapped() {
    // Each once overflowed 64 bits silently (a vocabulary of 2^64 − 1 planned fewer
    // parameters than one of 32,000), saturated, or allocated by the value.
    let cases = [
        (
            "--vocab",
            "18446744073709551615",
            "--vocab is 18446744073709551615; the planner takes 1 to",
        ),
        (
            "--hidden",
            "4294967296",
            "--hidden is 4294967296; the planner takes 1 to",
        ),
        (
            "--layers",
            "1099511627776",
            "--layers is 1099511627776; the planner takes",
        ),
        ("--ffn", "0", "--ffn must be at least 1"),
        (
            "--seq",
            "1000000000",
            "--seq is 1000000000; the planner takes",
        ),
        (
            "--device-memory",
            "99999999999999999999999TiB",
            "is not a device's memory",
        ),
        ("--device-memory", "0.5", "is not a device's memory"),
        (
            "--devices",
            "9223372036854775809",
            "--devices 9223372036854775809 is beyond",
        ),
        (
            "--global-batch",
            "4611686018427387904",
            "--global-batch 4611686018427387904 is beyond",
        ),
        (
            "--lora-rank",
            "1000000",
            "--lora-rank 1000000 is larger than the narrowest",
        ),
    ];
    for (flag, value, needle) in cases {
        let args = llama_with(&[(flag, value)]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_one_line_error(&args, needle);
    }
    // Parameters grow with the width, up to the largest width taken.
    let mut last = 0;
    for hidden in [1024, 4096, 16384, 65536, 131072] {
        let hidden = hidden.to_string();
        let args = llama_with(&[
            ("--global-batch", "8"),
            ("--layers", "2"),
            ("--hidden", &hidden),
            ("--seq", "256"),
            ("--device-memory", "1000TiB"),
        ]);
        let report = plan_json(&args[1..].iter().map(String::as_str).collect::<Vec<_>>());
        let params = report["workload"]["params"].as_u64().unwrap();
        assert!(
            params > last,
            "width {hidden}: {params} parameters after {last}"
        );
        last = params;
    }
}

/// LLaMA-3 8B with rank-16 QLoRA adapters, 4 samples of 1,024 tokens a step.
const LLAMA3_8B_QLORA: [&str; 23] = [
    "--layers",
    "32",
    "--hidden",
    "4096",
    "--heads",
    "32",
    "--kv-heads",
    "8",
    "--ffn",
    "14336",
    "--seq",
    "1024",
    "--vocab",
    "128256",
    "--gated",
    "--global-batch",
    "4",
    "--lora-rank",
    "16",
    "--load-in-4bit",
    "--device-memory",
    "24GiB,8GiB",
    "--top=20",
];

#[test]
fn unequal_devices_are_planned_each_within_its_own_memory() {
    let report = plan_json(&LLAMA3_8B_QLORA);
    assert_eq!(report["cluster"]["devices"], 2, "{report}");
    let chosen = &report["candidates"][0];
    assert!(chosen["rejected"].is_null(), "{chosen}");
    // The chosen layout's fullest device within what it may use (90 % of 24 or 8 GiB).
    let gib = (1u64 << 30) as f64;
    let usable = match chosen["memory"]["device"].as_u64().unwrap() {
        0 => 24.0 * 0.9 * gib,
        _ => 8.0 * 0.9 * gib,
    };
    assert!(
        chosen["memory"]["total"].as_f64().unwrap() <= usable,
        "{chosen}"
    );
    // Plain replicas each need the whole model: the 8 GiB card says by how much it overflows.
    let replicas = report["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["layout"]["dp"] == 2)
        .unwrap();
    let why = replicas["rejected"].as_str().unwrap();
    assert!(
        why.starts_with("device 1 needs") && why.contains("over the 7.2"),
        "{why}"
    );
    // The table lists each device's memory.
    let table = kiln(&[&["plan"][..], &LLAMA3_8B_QLORA].concat());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("Devices: 2 (2 per machine), 24.0 GiB, 8.0 GiB,"),
        "{text}"
    );
}

#[test]
fn memory_limits_that_name_no_device_or_exceed_it_are_refused_in_one_line() {
    // With a built-in model, the devices are this machine's ranks: limits apply to them, and
    // flags that describe other devices are refused rather than ignored.
    let measured = [
        "plan",
        "--model",
        "mlp",
        "--global-batch",
        "8",
        "--devices",
        "2",
    ];
    assert_one_line_error(
        &[&measured[..], &["--max-memory", "1=1KiB"]].concat(),
        "device 1 needs",
    );
    assert_one_line_error(
        &[&measured[..], &["--device-memory", "1GiB"]].concat(),
        "cannot be used with",
    );
    fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        [&["plan"][..], &LLAMA3_8B_QLORA, extra].concat()
    }
    assert_one_line_error(
        &with(&["--max-memory", "2=1GiB"]),
        "a memory limit is set for device 2, but the run has 2 device(s)",
    );
    assert_one_line_error(
        &with(&["--max-memory", "1=30GiB"]),
        "device 1 is limited to 30.0 GiB but has 8.0 GiB",
    );
    assert_one_line_error(
        &with(&["--devices", "3"]),
        "2 device memories are listed for 3 devices",
    );
    assert_one_line_error(&with(&["--max-memory", "1:8GiB"]), "0=10GiB");
    assert_one_line_error(
        &with(&["--memory-margin", "30GiB"]),
        "a memory margin of 30.0 GiB leaves nothing of device 1's 8.0 GiB",
    );
}

/// A built-in model of more blocks than its own two: the planner lists stages cut unevenly
/// beside the even ones, each adding up to its blocks.
#[test]
fn a_deeper_built_in_transformer_is_planned_with_balanced_stages_beside_even_ones() {
    let report = plan_json(&[
        "--model",
        "transformer",
        "--layers",
        "6",
        "--global-batch",
        "96",
        "--devices",
        "4",
    ]);
    assert_eq!(report["workload"]["layers"], 6, "{report}");
    let balanced: Vec<_> = report["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["layout"]["split"] == "balanced")
        .collect();
    assert!(!balanced.is_empty(), "{report}");
    for c in &balanced {
        let blocks = stage_blocks(c);
        assert_eq!(blocks.iter().sum::<u64>(), 6, "{c}");
    }
}
