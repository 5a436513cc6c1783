//! Hostile and broken model folders, adapters and data, as a user's disk and downloads give
//! them: each is refused before use in one line naming what is wrong, never a panic, a hang,
//! a read outside the folder, a silently wrong model or a lost output.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::module::Param;
use burn::tensor::{Tensor, TensorData};
use kiln_nn::llm::{CausalLm, DataFormat, DataSet, LoraSpec, TARGET_MODULES, load, load_4bit};
use kiln_nn::lora::QuantConfig;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

type B = Flex;

mod common;
use common::fixture;

/// A fresh scratch folder for one case.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kiln-hostile-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A copy of the llama fixture's f32 folder whose weights `edit` rewrites: it gets each
/// tensor's name, dtype, shape and bytes and returns the ones to write.
fn with_weights(
    name: &str,
    edit: impl Fn(&str, Dtype, &[usize], Vec<u8>) -> (Dtype, Vec<u8>),
) -> PathBuf {
    let dir = scratch(name);
    std::fs::copy(fixture("llama/config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(fixture("llama/model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let (dtype, data) = edit(&n, v.dtype(), v.shape(), v.data().to_vec());
            (n, dtype, v.shape().to_vec(), data)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &dir.join("model.safetensors")).unwrap();
    dir
}

/// The error of loading `dir` in f32 and in 4 bits (both must refuse, with the same class).
fn refusals(dir: &Path) -> [String; 2] {
    let device = Default::default();
    let full = load::<B>(dir, &device).map(|_| ()).unwrap_err();
    let four = load_4bit::<B>(dir, &device, &QuantConfig::new())
        .map(|_| ())
        .unwrap_err();
    [full.to_string(), four.to_string()]
}

fn one_line(message: &str) {
    assert!(!message.contains('\n'), "more than one line: {message}");
    assert!(message.len() < 400, "too long: {message}");
}

#[test]
fn integer_weights_are_refused_naming_the_tensor() {
    for (dtype, width) in [
        (Dtype::I32, 4),
        (Dtype::I64, 8),
        (Dtype::U8, 1),
        (Dtype::BOOL, 1),
    ] {
        let dir = with_weights(&format!("{dtype:?}"), |name, d, shape, data| {
            if name == "model.layers.1.mlp.down_proj.weight" {
                (dtype, vec![0; shape.iter().product::<usize>() * width])
            } else {
                (d, data)
            }
        });
        for message in refusals(&dir) {
            one_line(&message);
            assert!(
                message.contains("model.layers.1.mlp.down_proj.weight")
                    && message.contains(&format!("{dtype:?}")),
                "{message}"
            );
        }
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn non_finite_weights_are_refused_at_load() {
    for (value, what, tensor) in [
        (f32::NAN, "NaN", "model.layers.0.self_attn.q_proj.weight"),
        (f32::INFINITY, "infinite", "model.norm.weight"),
        (f32::NEG_INFINITY, "infinite", "lm_head.weight"),
    ] {
        let dir = with_weights(what, |name, d, _, mut data| {
            if name == tensor {
                data[4..8].copy_from_slice(&value.to_le_bytes());
            }
            (d, data)
        });
        for message in refusals(&dir) {
            one_line(&message);
            assert!(
                message.contains(tensor) && message.contains(what),
                "{message}"
            );
        }
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn a_shard_index_cannot_read_outside_the_folder() {
    let root = scratch("traversal");
    let dir = root.join("model");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture("llama/config.json"), dir.join("config.json")).unwrap();
    // A file the index tries to reach: a valid checkpoint, so only the path check stops it.
    std::fs::copy(
        fixture("llama/model.safetensors"),
        root.join("x.safetensors"),
    )
    .unwrap();
    let absolute = root.join("x.safetensors").display().to_string();
    for shard in [
        "../x.safetensors",
        absolute.as_str(),
        "sub/../../x.safetensors",
    ] {
        let index = serde_json::json!({"weight_map": {"model.norm.weight": shard}});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
        for message in refusals(&dir) {
            one_line(&message);
            assert!(
                message.contains("not inside the model folder"),
                "{shard}: {message}"
            );
        }
    }
    std::fs::remove_dir_all(root).ok();
}

#[cfg(unix)]
#[test]
fn a_fifo_is_refused_not_read_forever() {
    let dir = scratch("fifo");
    std::fs::copy(fixture("llama/config.json"), dir.join("config.json")).unwrap();
    let fifo = dir.join("model.safetensors");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("mkfifo is not available; skipped");
        return;
    }
    let data = dir.join("data.jsonl");
    std::process::Command::new("mkfifo")
        .arg(&data)
        .status()
        .unwrap();
    // Read, a FIFO blocks until a writer comes: the test fails on a timeout, not by hanging.
    let (send, receive) = std::sync::mpsc::channel();
    let (model, data_path) = (dir.clone(), data.clone());
    std::thread::spawn(move || {
        let mut messages = refusals(&model).to_vec();
        messages.push(
            DataSet::read(&data_path, DataFormat::Auto)
                .map(|_| ())
                .unwrap_err()
                .to_string(),
        );
        let _ = send.send(messages);
    });
    let messages = receive
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("a FIFO was read instead of refused: the load hung");
    for message in messages {
        assert!(message.contains("a FIFO, not a regular file"), "{message}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn config_values_out_of_range_are_refused_before_anything_is_built() {
    let cases: [(&str, serde_json::Value, &str); 7] = [
        (
            "rms_norm_eps",
            0.0.into(),
            "rms_norm_eps must be a positive number",
        ),
        (
            "rms_norm_eps",
            (-1e-6).into(),
            "rms_norm_eps must be a positive number",
        ),
        (
            "vocab_size",
            u64::MAX.into(),
            "vocab_size is 18446744073709551615, beyond",
        ),
        (
            "hidden_size",
            (1u64 << 40).into(),
            "hidden_size is 1099511627776, beyond",
        ),
        (
            "num_hidden_layers",
            1_000_000.into(),
            "num_hidden_layers is 1000000, beyond",
        ),
        (
            "max_position_embeddings",
            0.into(),
            "max_position_embeddings is missing or zero",
        ),
        ("head_dim", 1_000_000.into(), "head_dim is 1000000, beyond"),
    ];
    for (key, value, expected) in cases {
        let dir = scratch(&format!("config-{key}"));
        let text = std::fs::read_to_string(fixture("llama/config.json")).unwrap();
        let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
        config[key] = value;
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        std::fs::copy(
            fixture("llama/model.safetensors"),
            dir.join("model.safetensors"),
        )
        .unwrap();
        for message in refusals(&dir) {
            one_line(&message);
            assert!(message.contains(expected), "{key}: {message}");
        }
        std::fs::remove_dir_all(dir).ok();
    }
}

fn spec(rank: usize, alpha: f32, targets: &[&str]) -> LoraSpec {
    LoraSpec {
        rank,
        alpha,
        target_modules: targets.iter().map(|t| t.to_string()).collect(),
        use_rslora: false,
        dropout: 0.0,
    }
}

#[test]
fn lora_settings_out_of_range_are_refused_before_any_adapter_is_allocated() {
    let (config, model) = load::<B>(&fixture("llama"), &Default::default()).unwrap();
    let all: Vec<&str> = TARGET_MODULES.to_vec();
    let cases = [
        (spec(1_000_000, 16.0, &all), "rank 1000000 is larger than"),
        (spec(usize::MAX, 16.0, &["q_proj"]), "is larger than"),
        // k_proj is 32 → 16 in the fixture.
        (spec(17, 16.0, &["k_proj"]), "at most 16"),
        (
            spec(8, 0.0, &all),
            "lora_alpha must be a positive number, got 0",
        ),
        (spec(8, -16.0, &all), "got -16"),
        (spec(8, f32::NAN, &all), "got NaN"),
        (spec(8, f32::INFINITY, &all), "got inf"),
        (
            spec(8, 16.0, &["q_proj", "v_proj", "q_proj"]),
            "'q_proj' is given twice",
        ),
    ];
    for (spec, expected) in cases {
        let early = spec.validate().and_then(|()| spec.check_model(&config));
        let late = model.clone().with_lora(&spec).map(|_| ());
        for message in [
            early.unwrap_err().to_string(),
            late.unwrap_err().to_string(),
        ] {
            one_line(&message);
            assert!(message.contains(expected), "{spec:?}: {message}");
        }
    }
    spec(16, 16.0, &all).check_model(&config).unwrap();
}

/// The llama fixture with rank-4 adapters whose `B` is `value` everywhere.
fn adapted(value: f32) -> (CausalLm<B>, LoraSpec) {
    let (_, base) = load::<B>(&fixture("llama"), &Default::default()).unwrap();
    let spec = spec(4, 8.0, &TARGET_MODULES);
    let mut model = base.with_lora(&spec).unwrap();
    for (_, _, proj) in model.projections_mut() {
        let adapter = proj.lora.as_mut().unwrap();
        let [rows, cols] = adapter.b.dims();
        let filled = Tensor::<B, 2>::from_data(
            TensorData::new(vec![value; rows * cols], [rows, cols]),
            &adapter.b.device(),
        );
        adapter.b = Param::initialized(adapter.b.id, filled);
    }
    (model, spec)
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[cfg(unix)]
#[test]
fn saving_adapters_never_writes_through_a_link_or_destroys_the_previous_ones() {
    let root = scratch("save");
    let out = root.join("adapters");
    let precious = root.join("precious.safetensors");
    std::fs::write(&precious, b"the user's file").unwrap();
    std::fs::create_dir_all(&out).unwrap();
    std::os::unix::fs::symlink(&precious, out.join("adapter_model.safetensors")).unwrap();
    std::fs::write(out.join("README.md"), b"the user's notes").unwrap();

    let (good, spec) = adapted(0.01);
    good.save_peft(&out, &spec, "llama").unwrap();
    assert_eq!(std::fs::read(&precious).unwrap(), b"the user's file");
    assert_eq!(
        names(&out),
        [
            "README.md",
            "adapter_config.json",
            "adapter_model.safetensors"
        ]
    );
    let saved = std::fs::read(out.join("adapter_model.safetensors")).unwrap();

    // Diverged adapters are refused, and the good ones stay as they were.
    let (bad, _) = adapted(f32::NAN);
    let message = bad.save_peft(&out, &spec, "llama").unwrap_err().to_string();
    assert!(
        message.contains("NaN") && message.contains("nothing was written"),
        "{message}"
    );
    assert_eq!(
        std::fs::read(out.join("adapter_model.safetensors")).unwrap(),
        saved
    );
    let merged = root.join("merged");
    let message = bad
        .save_pretrained(&merged, &fixture("llama"))
        .unwrap_err()
        .to_string();
    assert!(message.contains("NaN"), "{message}");
    assert!(
        !merged.exists() || names(&merged).is_empty(),
        "nothing merged is left"
    );
    assert_eq!(
        names(&root),
        ["adapters", "precious.safetensors"],
        "no staging left"
    );

    // Adapters with a NaN on disk are refused when loaded.
    let (_, base) = load::<B>(&fixture("llama"), &Default::default()).unwrap();
    std::fs::remove_file(out.join("adapter_model.safetensors")).unwrap();
    let (ok, _) = adapted(0.01);
    ok.save_peft(&out, &spec, "llama").unwrap();
    let bytes = std::fs::read(out.join("adapter_model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let name = "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight";
    let view = file.tensor(name).unwrap();
    let mut data = view.data().to_vec();
    data[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    let mut tensors: Vec<(String, Vec<u8>, Dtype, Vec<usize>)> = file
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.data().to_vec(), v.dtype(), v.shape().to_vec()))
        .collect();
    tensors.iter_mut().find(|t| t.0 == name).unwrap().1 = data;
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, b, d, s)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &out.join("adapter_model.safetensors")).unwrap();
    let message = base.load_peft(&out).map(|_| ()).unwrap_err().to_string();
    assert!(
        message.contains(name) && message.contains("NaN"),
        "{message}"
    );
    std::fs::remove_dir_all(root).ok();
}

#[test]
fn data_files_are_refused_with_the_line_and_the_cause() {
    let dir = scratch("data");
    let cases: [(&str, &[u8], &str); 4] = [
        (
            "empty",
            b"\n\n",
            "holds no example; give one JSON object per line",
        ),
        (
            "utf8",
            b"{\"text\": \"ok\"}\n{\"text\": \"\xff\"}\n",
            ":2: is not UTF-8 text",
        ),
        ("blank", b"{\"text\": \"\"}\n", ":1: the example is empty"),
        (
            "response",
            b"{\"prompt\": \"q\", \"response\": \"\"}\n",
            ":1: the completion is empty",
        ),
    ];
    for (name, bytes, expected) in cases {
        let path = dir.join(format!("{name}.jsonl"));
        std::fs::write(&path, bytes).unwrap();
        let message = DataSet::read(&path, DataFormat::Auto)
            .unwrap_err()
            .to_string();
        one_line(&message);
        assert!(message.contains(expected), "{name}: {message}");
    }
    // A byte-order mark is not data.
    let bom = dir.join("bom.jsonl");
    std::fs::write(&bom, b"\xEF\xBB\xBF{\"text\": \"hi\"}\r\n").unwrap();
    assert_eq!(DataSet::read(&bom, DataFormat::Auto).unwrap().len(), 1);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_shape_mismatch_names_the_checkpoint_s_tensor_in_one_line() {
    let dir = with_weights("shape", |_, d, _, data| (d, data));
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    config["intermediate_size"] = 48.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    for message in refusals(&dir) {
        one_line(&message);
        assert!(message.contains("model.layers.0.mlp."), "{message}");
        assert!(
            !message.contains(".base.") && !message.contains("gamma"),
            "{message}"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}
