//! `kiln finetune` and `kiln generate` on the committed llama fixture: adapters written in
//! PEFT's layout by any strategy, the same adapters from Ddp, Pipeline and Tensor as from
//! Single, the JSON summary, checkpoints that resume to the straight run's adapters,
//! generation with and without adapters, and one-line errors.

mod common;

use std::path::Path;

use burn::backend::Flex;
use common::{assert_one_line_error, finetune_args, fixture, kiln, run_args, scratch};
use kiln_nn::llm::load;

/// A fresh folder for one test's outputs.
/// `kiln finetune` of the llama fixture on the chat data for 3 steps of 8 sequences, with
/// `extra` flags; its JSON summary.
fn finetune(out: &Path, extra: &[&str]) -> serde_json::Value {
    finetune_for(out, "3", extra)
}

/// The `(step, loss)` of every evaluation in a run's summary.
fn evals(report: &serde_json::Value) -> Vec<(u64, f64)> {
    report["evals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["step"].as_u64().unwrap(), e["loss"].as_f64().unwrap()))
        .collect()
}

/// [`finetune`] for `steps` steps.
fn finetune_for(out: &Path, steps: &str, extra: &[&str]) -> serde_json::Value {
    summary(out, finetune_args(out, steps, extra))
}

/// Runs `kiln` with `args`, which must succeed; the JSON summary it wrote to `out/run.json`.
fn summary(out: &Path, args: Vec<String>) -> serde_json::Value {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = kiln(&args);
    assert!(
        run.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap()
}

/// The values of every adapter a run wrote into `out/adapters`, read back through PEFT's
/// layout onto the fixture.
fn adapter_values(out: &Path) -> Vec<f32> {
    let device = Default::default();
    let (_, base) = load::<Flex>(Path::new(&fixture("llama")), &device).unwrap();
    let (model, _) = base.load_peft(&out.join("adapters")).unwrap();
    model
        .adapters()
        .adapters
        .into_iter()
        .flatten()
        .flat_map(|a| {
            let mut values = a.a.val().into_data().to_vec::<f32>().unwrap();
            values.extend(a.b.val().into_data().to_vec::<f32>().unwrap());
            values
        })
        .collect()
}

/// Every loss of the run whose summary is `out/run.json`.
fn losses(out: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(out.join("run.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_f64().unwrap())
        .collect()
}

#[test]
fn single_ddp_pipeline_and_tensor_write_the_same_peft_adapters() {
    // Evaluated after step 2 and at the end (step 3), on a file of its own (the training data
    // again: what is compared is the loss, not what it says of over-fitting).
    let chat = fixture("chat.jsonl");
    let held_out = ["--eval-data", chat.as_str(), "--eval-every", "2"];
    let finetune = |out: &Path, extra: &[&str]| finetune(out, &[extra, &held_out[..]].concat());
    let single = scratch("single");
    let report = finetune(&single, &["--strategy", "single"]);
    assert_eq!(report["strategy"], "single");
    let single_evals = evals(&report);
    assert_eq!(single_evals.iter().map(|e| e.0).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(report["steps"], 3);
    assert!(report["tokens_per_s"].as_f64().unwrap() > 0.0);
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(single.join("adapters/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["r"], 4);

    let ddp = scratch("ddp");
    let ddp_report = finetune(&ddp, &["--strategy", "ddp", "--world", "2"]);
    assert_eq!(ddp_report["world"], 2);
    let pipeline = scratch("pipeline");
    let pipeline_report = finetune(
        &pipeline,
        &["--strategy", "pipeline", "--world", "2", "--stages", "2"],
    );
    assert_eq!(pipeline_report["strategy"], "pipeline");
    // The same losses and adapters, within float rounding: only the sums' order differs.
    let (reference, values) = (losses(&single), adapter_values(&single));
    let largest = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    let tensor = scratch("tensor");
    let report = finetune(
        &tensor,
        &["--strategy", "tensor", "--world", "2", "--tp", "2"],
    );
    assert_eq!(report["strategy"], "tensor");
    // Every strategy evaluates its whole model: the same held-out losses.
    for theirs in [&ddp_report, &pipeline_report, &report].map(evals) {
        assert_eq!(theirs.len(), single_evals.len());
        for (a, b) in single_evals.iter().zip(&theirs) {
            assert!(a.0 == b.0 && (a.1 - b.1).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }
    for other in [&ddp, &pipeline, &tensor] {
        let theirs = losses(other);
        assert_eq!(theirs.len(), reference.len());
        for (a, b) in reference.iter().zip(&theirs) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        let other_values = adapter_values(other);
        assert_eq!(other_values.len(), values.len());
        for (a, b) in values.iter().zip(&other_values) {
            assert!((a - b).abs() <= 1e-5 * largest, "{a} vs {b}");
        }
    }
    // Replicas that split the optimizer state train plain ddp's adapters, bit for bit.
    let zero1 = scratch("zero1");
    finetune(
        &zero1,
        &[
            "--strategy",
            "ddp",
            "--world",
            "2",
            "--shard-state",
            "optimizer",
        ],
    );
    assert_eq!(adapter_values(&zero1), adapter_values(&ddp));
    std::fs::remove_dir_all(zero1).ok();
    // Activation checkpointing trains the same adapters, under ddp and with stages too.
    for (name, strategy) in [
        ("recomputed", &["--strategy", "ddp", "--world", "2"][..]),
        (
            "recomputed-stages",
            &["--strategy", "pipeline", "--world", "2", "--stages", "2"],
        ),
    ] {
        let dir = scratch(name);
        finetune(&dir, &[strategy, &["--gradient-checkpointing"]].concat());
        let recomputed = adapter_values(&dir);
        for (a, b) in values.iter().zip(&recomputed) {
            assert!((a - b).abs() <= 1e-5 * largest, "{name}: {a} vs {b}");
        }
        std::fs::remove_dir_all(dir).ok();
    }
    for dir in [single, ddp, pipeline, tensor] {
        std::fs::remove_dir_all(dir).ok();
    }
}

/// `kiln finetune` as [`finetune`] does, on the data file `data` in place of the chat
/// fixture.
fn finetune_on(out: &Path, data: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = finetune_args(out, "3", extra);
    let at = args.iter().position(|a| a == "--data").unwrap() + 1;
    args[at] = data.display().to_string();
    summary(out, args)
}

#[test]
fn conversations_train_through_a_chat_template_the_same_under_single_and_ddp() {
    let dir = scratch("chat");
    // The chat fixture's pairs as conversations, through a template of the fixture's tokens.
    let text = std::fs::read_to_string(fixture("chat.jsonl")).unwrap();
    let rows: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            let (prompt, response) = (row.get("prompt")?, row.get("response")?);
            Some(
                serde_json::json!({"messages": [
                    {"role": "user", "content": prompt},
                    {"role": "assistant", "content": response},
                ]})
                .to_string(),
            )
        })
        .collect();
    let data = dir.join("messages.jsonl");
    std::fs::write(&data, rows.join("\n")).unwrap();
    let template = dir.join("template.jinja");
    std::fs::write(
        &template,
        "<s>{% for m in messages %}{{ m['role'] }}: {{ m['content'] | trim }}</s>{% endfor %}\
         {% if add_generation_prompt %}assistant:{% endif %}",
    )
    .unwrap();
    let flags = [
        "--chat-template",
        template.to_str().unwrap(),
        "--target-modules",
        "all-linear",
        "--use-rslora",
    ];
    let single = dir.join("single");
    let report = finetune_on(
        &single,
        &data,
        &[&flags[..], &["--strategy", "single"]].concat(),
    );
    assert_eq!(report["steps"], 3);
    // PEFT's `all-linear` is written as the seven projections it stands for, with rsLoRA.
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(single.join("adapters/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["target_modules"].as_array().unwrap().len(), 7);
    assert_eq!(config["use_rslora"], true);
    let ddp = dir.join("ddp");
    finetune_on(
        &ddp,
        &data,
        &[&flags[..], &["--strategy", "ddp", "--world", "2"]].concat(),
    );
    // Each rank pads its half of a batch to its own longest: the same losses all the same.
    for (a, b) in losses(&single).iter().zip(&losses(&ddp)) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    // Without the template, the fixture's folder has none to render them with.
    assert_one_line_error(
        &[
            "finetune",
            "--model",
            &fixture("llama"),
            "--data",
            data.to_str().unwrap(),
            "--steps",
            "1",
            "--output",
            dir.join("none").to_str().unwrap(),
        ],
        "--chat-template FILE",
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn generate_continues_a_prompt_greedily_and_with_the_fine_tuned_adapters() {
    let out = scratch("generate");
    // Trained with PEFT's usual dropout, which the adapters' config records; merged in bf16
    // (the fixture's base is f32), its config saying so.
    let merged = out.join("merged");
    finetune(
        &out,
        &[
            "--lora-dropout",
            "0.1",
            "--merged",
            merged.to_str().unwrap(),
            "--merged-dtype",
            "bf16",
        ],
    );
    assert_eq!(
        kiln_nn::llm::stored_dtype(&merged).unwrap(),
        burn::tensor::DType::BF16
    );
    let merged_config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(merged.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(merged_config["dtype"], "bfloat16");
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("adapters/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["lora_dropout"], 0.1);
    let model = fixture("llama");
    let adapters = out.join("adapters");
    let generate = |extra: &[&str]| -> String {
        let mut args = vec![
            "generate",
            "--model",
            &model,
            "--prompt",
            "what colour is the sky? ",
            "--max-new-tokens",
            "6",
        ];
        args.extend_from_slice(extra);
        let run = kiln(&args);
        assert!(
            run.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        String::from_utf8(run.stdout).unwrap()
    };
    let base = generate(&[]);
    assert_eq!(base, generate(&[]), "greedy decoding is deterministic");
    // Greedy continuations of the random fixture are arbitrary text. Adapters change them:
    // PEFT's fixture adapter (random A and B) does; a run's own adapters load and apply.
    let peft = fixture("llama-peft");
    assert_ne!(
        generate(&["--adapter", &peft]),
        base,
        "--adapter changed nothing"
    );
    let tuned = generate(&["--adapter", adapters.to_str().unwrap()]);
    assert_eq!(tuned, generate(&["--adapter", adapters.to_str().unwrap()]));
    let sampled = generate(&["--temperature", "1.0", "--top-p", "0.9", "--seed", "3"]);
    assert_eq!(
        sampled,
        generate(&["--temperature", "1.0", "--top-p", "0.9", "--seed", "3"]),
        "a seeded draw repeats"
    );
    let top_k = generate(&["--temperature", "1.0", "--top-k", "1", "--seed", "3"]);
    assert_eq!(top_k, base, "the one most likely token is the greedy one");
    std::fs::remove_dir_all(out).ok();
}

#[test]
fn a_hub_name_reads_the_hugging_face_cache_s_snapshot() {
    let out = scratch("hub-cache");
    let snapshot = out.join("hub/models--kiln-test--tiny-llama/snapshots/0123abc");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(out.join("hub/models--kiln-test--tiny-llama/refs")).unwrap();
    std::fs::write(
        out.join("hub/models--kiln-test--tiny-llama/refs/main"),
        "0123abc",
    )
    .unwrap();
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(Path::new(&fixture("llama")).join(file), snapshot.join(file)).unwrap();
    }
    let generate = |model: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args([
                "generate",
                "--model",
                model,
                "--prompt",
                "the sky",
                "--max-new-tokens",
                "5",
            ])
            .env("HF_HUB_CACHE", out.join("hub"))
            .env("RUST_LOG", "error")
            .output()
            .unwrap()
    };
    let (named, folder) = (
        generate("kiln-test/tiny-llama"),
        generate(&fixture("llama")),
    );
    assert!(
        named.status.success(),
        "{}",
        String::from_utf8_lossy(&named.stderr)
    );
    assert_eq!(named.stdout, folder.stdout);
    // `kiln plan --model-config` and `kiln export gguf` take the name too.
    let with_cache = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(args)
            .env("HF_HUB_CACHE", out.join("hub"))
            .env("RUST_LOG", "error")
            .output()
            .unwrap()
    };
    let plan = |model: &str| {
        let run = with_cache(&[
            "plan",
            "--model-config",
            model,
            "--devices",
            "2",
            "--global-batch",
            "8",
        ]);
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        // The first line names the file; the plan below it is the model's.
        let text = String::from_utf8_lossy(&run.stdout).into_owned();
        text.split_once('\n').unwrap().1.to_string()
    };
    assert_eq!(plan("kiln-test/tiny-llama"), plan(&fixture("llama")));
    let gguf = out.join("tiny.gguf");
    let export = with_cache(&[
        "export",
        "gguf",
        "--model",
        "kiln-test/tiny-llama",
        "--out",
        gguf.to_str().unwrap(),
    ]);
    assert!(
        export.status.success() && gguf.is_file(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );
    let missing = generate("kiln-test/absent");
    let error = String::from_utf8_lossy(&missing.stderr);
    assert!(
        !missing.status.success() && error.contains("hf download kiln-test/absent"),
        "{error}"
    );
    std::fs::remove_dir_all(out).ok();
}

/// `--model org/name --download` fetches what the cache lacks from `$HF_ENDPOINT` (a Hub on
/// loopback here, answering as huggingface.co does) into `$HF_HUB_CACHE`, only the files Kiln
/// reads; without `--download` the run is refused in one line naming the cache; afterwards the
/// model is found offline.
#[test]
fn a_hub_name_downloads_into_the_cache_with_download() {
    let out = scratch("hub-download");
    let cache = out.join("hub");
    let mut files: Vec<(String, Vec<u8>)> = ["config.json", "model.safetensors", "tokenizer.json"]
        .iter()
        .map(|f| {
            let bytes = std::fs::read(Path::new(&fixture("llama")).join(f)).unwrap();
            (f.to_string(), bytes)
        })
        .collect();
    // Files other libraries read, which a download must skip.
    files.push(("pytorch_model.bin".into(), vec![0; 64]));
    files.push(("original/consolidated.00.pth".into(), vec![0; 64]));
    let endpoint = hub_server::serve("kiln-test/remote-llama", "c0ffee42", files);
    let generate = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(extra)
            .args([
                "generate",
                "--model",
                "kiln-test/remote-llama",
                "--prompt",
                "the sky",
                "--max-new-tokens",
                "5",
            ])
            .env("HF_HUB_CACHE", &cache)
            .env("HF_ENDPOINT", &endpoint)
            .env("RUST_LOG", "error")
            .output()
            .unwrap()
    };
    let refused = generate(&[]);
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && error.contains("--download")
            && error.contains(&cache.display().to_string()),
        "{error}"
    );
    let downloaded = generate(&["--download"]);
    assert!(
        downloaded.status.success(),
        "{}",
        String::from_utf8_lossy(&downloaded.stderr)
    );
    let folder = kiln(&[
        "generate",
        "--model",
        &fixture("llama"),
        "--prompt",
        "the sky",
        "--max-new-tokens",
        "5",
    ]);
    assert_eq!(downloaded.stdout, folder.stdout);
    let repo = cache.join("models--kiln-test--remote-llama");
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main"))
            .unwrap()
            .trim(),
        "c0ffee42"
    );
    let mut held: Vec<String> = std::fs::read_dir(repo.join("snapshots/c0ffee42"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    held.sort();
    assert_eq!(held, ["config.json", "model.safetensors", "tokenizer.json"]);
    // Cached now: no --download needed.
    let offline = generate(&[]);
    assert_eq!(offline.stdout, folder.stdout);
    std::fs::remove_dir_all(out).ok();
}

/// A Hugging Face Hub on loopback for one repository, answering the requests `hf-hub` makes:
/// the repository's file list (`/api/models/{repo}/revision/main`), and each file
/// (`/{repo}/resolve/main/{file}`) with the commit and etag headers and the byte ranges asked.
mod hub_server {
    use std::io::{BufRead, BufReader, Write};
    use std::net::{TcpListener, TcpStream};

    /// Serves `files` of `repo` at `commit` until the test ends; returns its address.
    pub fn serve(repo: &str, commit: &str, files: Vec<(String, Vec<u8>)>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (repo, commit) = (repo.to_string(), commit.to_string());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                answer(stream, &repo, &commit, &files);
            }
        });
        endpoint
    }

    fn answer(stream: TcpStream, repo: &str, commit: &str, files: &[(String, Vec<u8>)]) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut request = String::new();
        reader.read_line(&mut request).unwrap();
        let path = request.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut range = None;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("range")
            {
                range = Some(value.trim().trim_start_matches("bytes=").to_string());
            }
        }
        let listing = format!("/api/models/{repo}/revision/main");
        let prefix = format!("/{repo}/resolve/main/");
        let mut stream = stream;
        if path == listing {
            let siblings: Vec<String> = files
                .iter()
                .map(|(f, _)| format!("{{\"rfilename\":\"{f}\"}}"))
                .collect();
            let body = format!(
                "{{\"sha\":\"{commit}\",\"siblings\":[{}]}}",
                siblings.join(",")
            );
            reply(&mut stream, "200 OK", &[], body.as_bytes());
        } else if let Some((_, bytes)) = path
            .strip_prefix(&prefix)
            .and_then(|f| files.iter().find(|(name, _)| name == f))
        {
            let size = bytes.len();
            let (first, last) = match range.as_deref().and_then(|r| r.split_once('-')) {
                Some((a, b)) => (
                    a.parse().unwrap_or(0),
                    b.parse().unwrap_or(size - 1).min(size - 1),
                ),
                None => (0, size - 1),
            };
            // The etag names the blob in the cache: one per content.
            let etag = format!("{:016x}", fnv(bytes));
            let headers = [
                ("x-repo-commit", commit.to_string()),
                ("etag", format!("\"{etag}\"")),
                ("content-range", format!("bytes {first}-{last}/{size}")),
            ];
            reply(
                &mut stream,
                "206 Partial Content",
                &headers,
                &bytes[first..=last],
            );
        } else {
            reply(&mut stream, "404 Not Found", &[], b"not found");
        }
    }

    fn reply(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
        let mut head = format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n",
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).ok();
        stream.write_all(body).ok();
    }

    fn fnv(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
    }
}

#[test]
fn generate_chat_renders_the_template_and_stops_at_the_end_of_turn() {
    let out = scratch("generate-chat");
    let model = fixture("llama");
    // The template writes the beginning-of-sequence token itself, as LLaMA 3's does.
    let template = out.join("chat_template.jinja");
    std::fs::write(
        &template,
        "<s>{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}\
         {% if add_generation_prompt %}assistant: {% endif %}",
    )
    .unwrap();
    let generate = |dir: &str, extra: &[&str]| -> String {
        let mut args = vec!["generate", "--model", dir, "--max-new-tokens", "8"];
        args.extend_from_slice(extra);
        let run = kiln(&args);
        assert!(
            run.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        String::from_utf8(run.stdout).unwrap()
    };
    // A chat is the plain continuation of the text its template renders (whose first token
    // the tokenizer then adds): no token twice, none missing.
    let chat = generate(
        &model,
        &[
            "--chat",
            "--chat-template",
            template.to_str().unwrap(),
            "--system",
            "be brief",
            "--prompt",
            "the sky?",
        ],
    );
    let rendered = "system: be brief\nuser: the sky?\nassistant: ";
    assert_eq!(chat, generate(&model, &["--prompt", rendered]));
    // The end of a turn as generation_config.json names it ends the answer, as transformers'
    // generate stops there.
    let folder = out.join("model");
    std::fs::create_dir_all(&folder).unwrap();
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(Path::new(&model).join(file), folder.join(file)).unwrap();
    }
    let tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("tokenizer.json")).unwrap())
            .unwrap();
    let full = generate(folder.to_str().unwrap(), &["--prompt", rendered]);
    let stop_char = full.trim_start().chars().next().unwrap().to_string();
    let stop_id = &tokenizer["model"]["vocab"][stop_char.as_str()];
    std::fs::write(
        folder.join("generation_config.json"),
        serde_json::json!({"eos_token_id": [2, stop_id]}).to_string(),
    )
    .unwrap();
    let stopped = generate(folder.to_str().unwrap(), &["--prompt", rendered]);
    assert!(
        stopped.trim().len() < full.trim().len(),
        "{stopped:?} vs {full:?}"
    );
    // No template, no chat.
    assert_one_line_error(
        &["generate", "--model", &model, "--chat", "--prompt", "hi"],
        "--chat needs a chat template",
    );
    std::fs::remove_dir_all(out).ok();
}

#[test]
fn bad_inputs_are_refused_in_one_line() {
    let out = scratch("errors");
    let (model, data) = (fixture("llama"), fixture("chat.jsonl"));
    let adapters = out.join("adapters");
    let adapters = adapters.to_str().unwrap();
    let base = |extra: &[&'static str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "finetune",
            "--model",
            &model,
            "--data",
            &data,
            "--output",
            adapters,
            "--seq-len",
            "24",
        ]
        .map(String::from)
        .to_vec();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let check = |args: Vec<String>, needle: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_one_line_error(&args, needle);
    };
    // A folder without config.json.
    let empty = out.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    check(
        vec![
            "finetune".into(),
            "--model".into(),
            empty.display().to_string(),
            "--data".into(),
            data.clone(),
        ],
        "has no config.json",
    );
    // Schedules, weight decay and epochs that cannot train.
    check(
        base(&["--warmup-ratio", "1.5"]),
        "--warmup-ratio must be between 0 and 1",
    );
    check(
        base(&["--warmup-ratio", "0.1", "--warmup-steps", "3"]),
        "--warmup-steps",
    );
    check(base(&["--weight-decay", "-1"]), "--weight-decay must be");
    check(
        base(&["--epochs", "0"]),
        "--epochs must be a positive number",
    );
    check(base(&["--epochs", "1", "--steps", "3"]), "--steps");
    check(
        base(&["--eval-split", "1"]),
        "--eval-split must be a fraction",
    );
    check(base(&["--lora-dropout", "1"]), "lora_dropout must be");
    // Full fine-tuning with what belongs to adapters.
    check(
        base(&["--full", "--load-in-4bit"]),
        "--full trains every weight, but --load-in-4bit",
    );
    check(
        base(&["--full", "--lora-rank", "8"]),
        "--full trains without adapters",
    );
    check(
        base(&["--full", "--merged", "elsewhere"]),
        "--full writes the whole model to --out",
    );
    check(
        base(&["--merged-dtype", "f32"]),
        "--merged-dtype sets the dtype of the model --merged or --full writes",
    );
    check(
        base(&["--lora-dropout", "0.1", "--gradient-checkpointing"]),
        "--lora-dropout 0.1 with --gradient-checkpointing",
    );
    check(
        base(&["--eval-split", "0.1", "--eval-data", "x.jsonl"]),
        "--eval-data and --eval-split",
    );
    check(base(&["--eval-every", "2"]), "there is nothing to evaluate");
    check(
        base(&["--eval-split", "0.1", "--eval-every", "0"]),
        "--eval-every 0",
    );
    // A data line that is not JSON, named by file and line.
    let broken = out.join("broken.jsonl");
    std::fs::write(&broken, "{\"text\": \"fine\"}\n{not json\n").unwrap();
    check(
        vec![
            "finetune".into(),
            "--model".into(),
            model.clone(),
            "--data".into(),
            broken.display().to_string(),
            "--seq-len".into(),
            "24".into(),
        ],
        "broken.jsonl:2",
    );
    check(base(&["--target-modules", "q_proj,c_attn"]), "c_attn");
    // The merged model would overwrite the base it merges.
    let mut merged_over_base = base(&[]);
    merged_over_base.extend(["--merged".to_string(), model.clone()]);
    check(merged_over_base, "is the --model folder");
    check(
        vec![
            "finetune".into(),
            "--model".into(),
            model.clone(),
            "--data".into(),
            data.clone(),
            "--seq-len".into(),
            "100000".into(),
        ],
        "max_position_embeddings",
    );
    // Shards of the fixture's 4-bit projections would cut their blocks of 64 rows.
    check(
        base(&["--strategy", "tensor", "--world", "2", "--load-in-4bit"]),
        "quantisation blocks",
    );
    assert_one_line_error(
        &[
            "generate",
            "--model",
            &model,
            "--prompt",
            "hi",
            "--adapter",
            "/nonexistent",
        ],
        "adapter_config.json",
    );
    // The generator's own flags.
    for (flag, value, needle) in [
        ("--temperature", "-1", "--temperature"),
        ("--top-p", "0", "--top-p"),
        ("--max-new-tokens", "0", "--max-new-tokens"),
        ("--max-new-tokens", "500", "max_position_embeddings"),
    ] {
        assert_one_line_error(
            &["generate", "--model", &model, "--prompt", "hi", flag, value],
            needle,
        );
    }
    std::fs::remove_dir_all(out).ok();
}

#[test]
fn batches_grouped_by_length_train_alike_under_single_and_ddp() {
    let runs: Vec<Vec<f64>> = [
        &["--strategy", "single"][..],
        &["--strategy", "single", "--group-by-length"],
        &["--strategy", "ddp", "--world", "2", "--group-by-length"],
    ]
    .iter()
    .enumerate()
    .map(|(i, flags)| {
        let out = scratch(&format!("grouped-{i}"));
        finetune(&out, flags);
        let run = losses(&out);
        std::fs::remove_dir_all(out).ok();
        run
    })
    .collect();
    assert_ne!(runs[0], runs[1], "grouping changed no batch");
    for (a, b) in runs[1].iter().zip(&runs[2]) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

#[test]
fn the_checkpoint_of_the_lowest_eval_loss_survives_keep_1() {
    let out = scratch("best");
    // Held-out answers that contradict the training data's: their loss falls while the
    // model learns the format, then rises as it learns the training answers.
    let contradicting = out.join("contradicting.jsonl");
    let rows: Vec<String> = std::fs::read_to_string(fixture("chat.jsonl"))
        .unwrap()
        .lines()
        .take(8)
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            let answer: String = row["response"].as_str().unwrap().chars().rev().collect();
            serde_json::json!({"prompt": row["prompt"], "response": answer + " no"}).to_string()
        })
        .collect();
    std::fs::write(&contradicting, rows.join("\n")).unwrap();
    let save = out.join("checkpoints");
    let (log, svg) = (out.join("log.jsonl"), out.join("loss.svg"));
    let report = finetune_for(
        &out,
        "6",
        &[
            "--eval-data",
            contradicting.to_str().unwrap(),
            "--save",
            save.to_str().unwrap(),
            "--save-every",
            "1",
            "--keep",
            "1",
            "--log-file",
            log.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ],
    );
    let evals = evals(&report);
    assert_eq!(evals.len(), 6, "every checkpoint records its eval loss");
    // The log: the run's line, then each step's line and its evaluation's, as they happened.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1 + 2 * 6);
    for (step, pair) in lines[1..].chunks(2).enumerate() {
        assert_eq!(pair[0]["step"], step + 1);
        assert_eq!(pair[0]["loss"], report["losses"][step]);
        assert_eq!(pair[0]["lr"], 0.01);
        assert_eq!(pair[1]["eval_loss"], evals[step].1);
    }
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains("training loss") && drawn.contains("eval loss"));
    let best = evals
        .iter()
        .copied()
        .reduce(|b, e| if e.1 < b.1 { e } else { b })
        .unwrap();
    assert!(best.0 < 6, "the data is made to over-fit: {evals:?}");
    assert_eq!(report["best_eval"]["step"], best.0);
    // --keep 1 keeps the newest step, and the best beside it.
    let mut kept: Vec<String> = std::fs::read_dir(&save)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("step-"))
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        [format!("step-{:08}", best.0), "step-00000006".into()]
    );
    let best_dir = save.join(format!("step-{:08}", best.0));
    assert_eq!(report["best_checkpoint"], best_dir.display().to_string());
    let manifest = std::fs::read_to_string(best_dir.join("manifest.toml")).unwrap();
    assert!(
        manifest.contains(&format!("eval_loss = {}", best.1)),
        "{manifest}"
    );
    std::fs::remove_dir_all(out).ok();
}

#[test]
fn a_fine_tuning_run_saved_and_resumed_equals_the_straight_run() {
    let straight = scratch("straight");
    finetune_for(&straight, "4", &[]);
    let (first, second) = (scratch("first"), scratch("second"));
    let folder = first.join("checkpoints");
    let folder_arg = folder.to_str().unwrap();
    finetune_for(&first, "2", &["--save", folder_arg]);
    let step = |n: usize| folder.join(format!("step-{n:08}"));
    assert!(step(2).is_dir());
    let report = finetune_for(
        &second,
        "4",
        &["--resume", folder_arg, "--save", folder_arg],
    );
    assert_eq!(report["resumed_from"], 2);
    assert!(step(4).is_dir());
    // Bit for bit the straight run's last two steps and adapters.
    assert_eq!(losses(&second), losses(&straight)[2..].to_vec());
    assert_eq!(adapter_values(&second), adapter_values(&straight));
    // A checkpoint holds the adapters and the optimizer state, not the base.
    let model = std::fs::metadata(step(4).join("model.mpk")).unwrap().len();
    let base = std::fs::metadata(fixture("llama/model.safetensors"))
        .unwrap()
        .len();
    assert!(model < base / 2, "{model} bytes saved for a base of {base}");
    // Another adapter rank is another run: refused, naming the setting.
    let (model_dir, data) = (fixture("llama"), fixture("chat.jsonl"));
    assert_one_line_error(
        &[
            "finetune",
            "--model",
            &model_dir,
            "--data",
            &data,
            "--steps",
            "6",
            "--batch",
            "8",
            "--seq-len",
            "24",
            "--lora-rank",
            "8",
            "--lr",
            "0.01",
            "--threads-per-rank",
            "1",
            "--output",
            second.join("again").to_str().unwrap(),
            "--resume",
            folder_arg,
        ],
        "lora.rank",
    );
    for dir in [straight, first, second] {
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn a_run_resumed_mid_warm_up_follows_its_schedule_bit_for_bit() {
    let schedule = ["--lr-scheduler", "cosine", "--warmup-steps", "3"];
    let straight = scratch("warm-straight");
    finetune_for(&straight, "4", &schedule);
    // The schedule trains: the first step, at a rate of 0, moved nothing where a constant
    // rate moved the adapters.
    let flat = scratch("warm-flat");
    finetune_for(&flat, "4", &[]);
    assert_eq!(losses(&straight)[0], losses(&flat)[0]);
    assert_ne!(losses(&straight)[1], losses(&flat)[1]);

    let saved = scratch("warm-saved");
    let folder = saved.join("checkpoints");
    let folder_arg = folder.to_str().unwrap();
    finetune_for(
        &saved,
        "4",
        &[&schedule[..], &["--save", folder_arg, "--save-every", "2"]].concat(),
    );
    let step_2 = folder.join(format!("step-{:08}", 2));
    let resumed = scratch("warm-resumed");
    let report = finetune_for(
        &resumed,
        "4",
        &[&schedule[..], &["--resume", step_2.to_str().unwrap()]].concat(),
    );
    assert_eq!(report["resumed_from"], 2);
    assert_eq!(losses(&resumed), losses(&straight)[2..].to_vec());
    assert_eq!(adapter_values(&resumed), adapter_values(&straight));
    // The decay spreads over the steps: another length is another run.
    let mut args = finetune_args(&resumed.join("longer"), "6", &schedule);
    args.extend(["--resume".to_string(), step_2.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_one_line_error(&args, "steps");
    for dir in [straight, flat, saved, resumed] {
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn a_resume_on_edited_data_is_refused_naming_it_and_on_moved_data_continues() {
    let out = scratch("edited-data");
    let (data, moved) = (out.join("chat.jsonl"), out.join("moved.jsonl"));
    std::fs::copy(fixture("chat.jsonl"), &data).unwrap();
    let folder = out.join("checkpoints");
    let run = |data: &Path, steps: &str, extra: &[&str]| {
        let mut args = finetune_args(&out, steps, &["--save", folder.to_str().unwrap()]);
        let at = args.iter().position(|a| a == "--data").unwrap();
        args[at + 1] = data.display().to_string();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let first = run(&data, "1", &[]);
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    assert!(kiln(&first).status.success());
    // The same bytes elsewhere: the digests match, the resume continues.
    std::fs::copy(&data, &moved).unwrap();
    let resume = run(&moved, "2", &["--resume", folder.to_str().unwrap()]);
    let resume: Vec<&str> = resume.iter().map(String::as_str).collect();
    let continued = kiln(&resume);
    assert!(
        continued.status.success(),
        "{}",
        String::from_utf8_lossy(&continued.stderr)
    );
    // The same path, other contents: the checkpoint's digest of it no longer matches.
    let mut text = std::fs::read_to_string(&data).unwrap();
    text.push_str("{\"prompt\": \"one more\", \"response\": \"example\"}\n");
    std::fs::write(&data, text).unwrap();
    let resume = run(&data, "3", &["--resume", folder.to_str().unwrap()]);
    let resume: Vec<&str> = resume.iter().map(String::as_str).collect();
    assert_one_line_error(&resume, "was trained on another data");
    std::fs::remove_dir_all(out).ok();
}

#[test]
fn a_toml_config_sets_the_adapters_the_data_and_checkpoints_and_the_length_fits() {
    let out = scratch("toml");
    let config = out.join("finetune.toml");
    std::fs::write(
        &config,
        format!(
            "model = {:?}\ndata = {:?}\noutput = {:?}\npacking = \"pack\"\n\n\
             [lora]\nrank = 2\nalpha = 4.0\ntarget_modules = [\"q_proj\", \"v_proj\"]\n\n\
             [checkpoint]\nevery = 1\n\n[train]\nsteps = 2\nbatch = 2\nstrategy = \"single\"\n",
            fixture("llama"),
            fixture("chat.jsonl"),
            out.join("adapters").display().to_string(),
        ),
    )
    .unwrap();
    let (folder, json) = (out.join("checkpoints"), out.join("run.json"));
    let run = kiln(&[
        "finetune",
        "--config",
        config.to_str().unwrap(),
        "--save",
        folder.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // No sequence length given: the default 256 fitted to the fixture's 128 positions.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["seq_len"], 128);
    for step in [1, 2] {
        assert!(
            folder.join(format!("step-{step:08}")).is_dir(),
            "step {step}"
        );
    }
    let peft: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("adapters/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(peft["r"], 2);
    assert_eq!(
        peft["target_modules"],
        serde_json::json!(["q_proj", "v_proj"])
    );
    // An unknown field is named with its line.
    let bad = out.join("bad.toml");
    std::fs::write(&bad, "seq_len = 24\nbogus = 1\n").unwrap();
    assert_one_line_error(&["finetune", "--config", bad.to_str().unwrap()], "line 2");
    std::fs::remove_dir_all(out).ok();
}

#[test]
fn sigint_saves_the_adapters_and_a_checkpoint_that_resumes_bit_for_bit() {
    let out = scratch("sigint");
    let folder = out.join("checkpoints");
    let adapters = out.join("adapters");
    let args = finetune_args(
        &out,
        "1000000",
        &["--strategy", "single", "--save", folder.to_str().unwrap()],
    );
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(&args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The save folder exists once the handlers are installed: from then on SIGINT stops the
    // run after a step.
    let start = std::time::Instant::now();
    while !folder.exists() {
        assert!(start.elapsed().as_secs() < 120, "the child never got ready");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let sent = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let run = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("resume with --resume"), "{stderr}");
    let step: usize = stderr
        .split("after step ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no step in: {stderr}"));
    assert!(folder.join(format!("step-{step:08}")).is_dir());
    // The adapters of the step it stopped after, in PEFT's layout, and a resume from there
    // for one more step that ends where a run that never stopped does.
    assert!(adapters.join("adapter_model.safetensors").is_file());
    let target = (step + 1).to_string();
    let (resumed, straight) = (out.join("resumed"), out.join("straight"));
    std::fs::create_dir_all(&resumed).unwrap();
    std::fs::create_dir_all(&straight).unwrap();
    finetune_for(
        &resumed,
        &target,
        &["--strategy", "single", "--resume", folder.to_str().unwrap()],
    );
    finetune_for(&straight, &target, &["--strategy", "single"]);
    assert_eq!(adapter_values(&resumed), adapter_values(&straight));
    std::fs::remove_dir_all(out).ok();
}

/// Every weight of the model folder `dir` wrote, read back by Kiln, in order.
fn weights(dir: &Path) -> Vec<Vec<f32>> {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::Tensor;
    struct Collect(Vec<Vec<f32>>);
    impl ModuleVisitor<Flex> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Flex, D>>) {
            self.0
                .push(param.val().into_data().to_vec::<f32>().unwrap());
        }
    }
    let (_, model) = load::<Flex>(dir, &Default::default()).unwrap();
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

/// A `--full` fine-tuning run of `model` on the chat data: `steps` steps of 8 sequences of 24
/// tokens at learning rate `lr`, then `extra`, the model written to `out/model`; its weights.
fn full_run(model: &str, out: &Path, steps: &str, lr: &str, extra: &[&str]) -> Vec<Vec<f32>> {
    let (folder, json) = (out.join("model"), out.join("run.json"));
    let full = [&["--full"][..], extra].concat();
    let report = summary(out, run_args(model, &folder, &json, [steps, lr], &full));
    assert_eq!(report["full"], true);
    weights(&folder)
}

#[test]
fn full_fine_tuning_trains_every_weight_alike_under_single_and_ddp_with_the_state_split() {
    let model = fixture("llama");
    let run =
        |out: &Path, steps: &str, extra: &[&str]| full_run(&model, out, steps, "0.001", extra);
    let single_dir = scratch("full-single");
    let single = run(&single_dir, "2", &["--strategy", "single"]);
    let split = [
        "--strategy",
        "ddp",
        "--world",
        "2",
        "--shard-state",
        "optimizer",
    ];
    let split_dir = scratch("full-split");
    let trained = run(&split_dir, "2", &split);
    let base = weights(Path::new(&fixture("llama")));
    // A whole model, every weight of it trained, in the base's layout (the fixture is f32).
    assert_eq!(single.len(), base.len());
    let moved = single.iter().zip(&base).filter(|(a, b)| a != b).count();
    assert_eq!(moved, base.len(), "every weight trains");
    let largest = single.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    for (a, b) in single.iter().flatten().zip(trained.iter().flatten()) {
        assert!((a - b).abs() <= 1e-5 * largest, "{a} vs {b}");
    }
    // The reduced gradients split too (ZeRO-2), and the parameters between steps (ZeRO-3,
    // whose saved model is gathered from both replicas), gathered whole before the step or,
    // with the layers recomputed, one layer at a time as each runs: the same training.
    for (name, extra) in [
        ("gradients", &["--shard-state", "gradients"][..]),
        ("parameters", &["--shard-state", "parameters"]),
        (
            "by-layer",
            &["--shard-state", "parameters", "--gradient-checkpointing"],
        ),
    ] {
        let dir = scratch(&format!("full-{name}"));
        let zero = run(&dir, "2", &[&split[..4], extra].concat());
        assert_eq!(zero.len(), base.len(), "{name}");
        for (a, b) in single.iter().flatten().zip(zero.iter().flatten()) {
            assert!((a - b).abs() <= 1e-5 * largest, "{name}: {a} vs {b}");
        }
        std::fs::remove_dir_all(dir).ok();
    }
    for file in ["config.json", "tokenizer.json"] {
        assert!(single_dir.join("model").join(file).is_file(), "{file}");
    }
    // Saved after 2 steps with the parts of the state gathered, resumed for 2 more: the
    // straight run's model, bit for bit.
    let checkpoints = split_dir.join("checkpoints");
    let folder = checkpoints.to_str().unwrap();
    let (first, second, straight) = (scratch("full-1"), scratch("full-2"), scratch("full-4"));
    run(&first, "2", &[&split[..], &["--save", folder]].concat());
    let resumed = run(&second, "4", &[&split[..], &["--resume", folder]].concat());
    let straight_run = run(&straight, "4", &split);
    assert!(
        resumed == straight_run,
        "the resumed model differs from the straight run's"
    );
    for dir in [single_dir, split_dir, first, second, straight] {
        std::fs::remove_dir_all(dir).ok();
    }
}

/// `--full` in bf16 on a bf16 base: f32 master weights train under ddp with the optimizer state
/// whole and split alike, and the model comes out in the base's dtype, every weight moved.
#[test]
fn full_fine_tuning_in_bf16_keeps_the_base_s_dtype_and_trains_alike_with_the_state_split() {
    // The bf16 fixture's weights and config, with the llama fixture's tokenizer.
    let folder = scratch("full-bf16-base");
    for (from, file) in [
        ("llama/bf16", "config.json"),
        ("llama/bf16", "model.safetensors"),
        ("llama", "tokenizer.json"),
    ] {
        std::fs::copy(fixture(&format!("{from}/{file}")), folder.join(file)).unwrap();
    }
    let model = folder.display().to_string();
    let run = |out: &Path, extra: &[&str]| {
        let bf16 = [&["--precision", "bf16"][..], extra].concat();
        let weights = full_run(&model, out, "2", "0.01", &bf16);
        assert_eq!(
            kiln_nn::llm::stored_dtype(&out.join("model")).unwrap(),
            burn::tensor::DType::BF16
        );
        weights
    };
    let ddp = ["--strategy", "ddp", "--world", "2"];
    let (whole_dir, split_dir) = (scratch("full-bf16-whole"), scratch("full-bf16-split"));
    let whole = run(&whole_dir, &ddp);
    let split = run(
        &split_dir,
        &[&ddp[..], &["--shard-state", "optimizer"]].concat(),
    );
    let base = weights(Path::new(&model));
    assert_eq!(whole.len(), base.len());
    // Every weight moves, the norms' gains of 1 too: a step of 0.01 is more than half a bf16
    // step at 1 (2⁻⁸), so the bf16 output shows it.
    let moved = whole.iter().zip(&base).filter(|(a, b)| a != b).count();
    assert_eq!(moved, base.len(), "every weight trains");
    // Splitting the state changes which replica steps which parameter, not the arithmetic:
    // the same bf16 model, bit for bit. (Against `single` a bf16 run is not comparable value
    // by value: AdamW's first steps move a weight by about the learning rate times the sign
    // of its gradient, and a gradient near zero, summed in bf16 over other halves of the
    // batch, may change sign.)
    assert!(
        whole == split,
        "the split state's model differs from the whole state's"
    );
    // ZeRO-3 one layer at a time: bf16 placeholders for the other replica's parameters, each
    // layer gathered as the owner's bf16 copy. The same bf16 model here too.
    let by_layer_dir = scratch("full-bf16-by-layer");
    let by_layer = run(
        &by_layer_dir,
        &[
            &ddp[..],
            &["--shard-state", "parameters", "--gradient-checkpointing"],
        ]
        .concat(),
    );
    assert!(
        whole == by_layer,
        "ZeRO-3 by layer's model differs from the whole state's"
    );
    for dir in [whole_dir, split_dir, by_layer_dir, folder] {
        std::fs::remove_dir_all(dir).ok();
    }
}
