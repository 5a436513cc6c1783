//! Pretrained LLaMA-family models from Hugging Face folders: Kiln's logits against the
//! `transformers` logits of the same checkpoints (tests/fixtures/llm, made by
//! `.ci/llm-fixtures`), from single and sharded safetensors, f32 and bf16; and one-line errors.

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::tensor::{DType, Int, Tensor, TensorData, activation::log_softmax};
use kiln_nn::llm::{LlmError, load};

type B = Flex;

mod common;
use common::{expected, fixture, max_abs_diff};

/// Kiln's logits of the fixture's tokens, loading the folder `folder`.
fn logits(folder: &str, tokens: &[i64]) -> Tensor<B, 3> {
    let device = Default::default();
    let (_, model) = load::<B>(&fixture(folder), &device).unwrap();
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens.to_vec(), [2, 12]), &device);
    model.forward(tokens)
}

/// Mean next-token cross-entropy of `logits` over `tokens`, as `transformers` computes `loss`.
fn loss(logits: Tensor<B, 3>, tokens: &[i64]) -> f32 {
    let [batch, seq, vocab] = logits.dims();
    let logp = log_softmax(logits.narrow(1, 0, seq - 1), 2)
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let mut total = 0.0;
    for b in 0..batch {
        for s in 0..seq - 1 {
            let target = tokens[b * seq + s + 1] as usize;
            total -= logp[(b * (seq - 1) + s) * vocab + target];
        }
    }
    total / (batch * (seq - 1)) as f32
}

fn check(model: &str) {
    let (tokens, reference, shape) = expected(model, "logits");
    for folder in [model.to_string(), format!("{model}/sharded")] {
        let ours = logits(&folder, &tokens);
        assert_eq!(ours.dims().to_vec(), shape);
        let ours_loss = loss(ours.clone(), &tokens);
        let ours = ours.into_data().to_vec::<f32>().unwrap();
        let diff = max_abs_diff(&ours, &reference);
        assert!(
            diff < 1e-4,
            "{folder}: logits differ from transformers' by {diff}"
        );
        let (_, reference_loss, _) = expected(model, "loss");
        assert!(
            (ours_loss - reference_loss[0]).abs() < 1e-4,
            "{folder}: loss {ours_loss} vs {}",
            reference_loss[0]
        );
    }
    // bf16 weights, computed in f32 by both.
    let (_, reference, _) = expected(model, "logits_bf16");
    let ours = logits(&format!("{model}/bf16"), &tokens)
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let diff = max_abs_diff(&ours, &reference);
    assert!(
        diff < 1e-4,
        "{model}/bf16: logits differ from transformers' by {diff}"
    );
}

#[test]
fn llama_with_gqa_and_llama3_rope_matches_transformers() {
    check("llama");
}

#[test]
fn qwen2_with_qkv_biases_and_tied_embeddings_matches_transformers() {
    check("qwen2");
}

#[test]
fn qwen3_with_per_head_qk_norms_and_its_own_head_dim_matches_transformers() {
    check("qwen3");
}

/// A sliding window of 4 over 12 tokens: each token sees itself and the 3 before it.
#[test]
fn mistral_with_a_sliding_window_shorter_than_the_sequence_matches_transformers() {
    check("mistral");
}

/// A scratch copy of the llama fixture's f32 folder, `config.json` edited by `edit`.
fn edited(name: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-llm-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        fixture("llama/model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let text = std::fs::read_to_string(fixture("llama/config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

fn load_error(dir: &Path) -> LlmError {
    load::<B>(dir, &Default::default()).map(|_| ()).unwrap_err()
}

#[test]
fn bad_folders_are_refused_in_one_line_naming_what_is_wrong() {
    let empty = std::env::temp_dir().join(format!("kiln-llm-{}-empty", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    assert!(matches!(load_error(&empty), LlmError::NoConfig { .. }));
    std::fs::copy(fixture("llama/config.json"), empty.join("config.json")).unwrap();
    let no_weights = load_error(&empty).to_string();
    assert!(no_weights.contains("has no weights"), "{no_weights}");

    let deeper = edited("deeper", |c| c["num_hidden_layers"] = 3.into());
    let missing = load_error(&deeper).to_string();
    assert!(missing.contains("model.layers.2."), "{missing}");
    assert!(missing.contains("missing"), "{missing}");

    let wider = edited("wider", |c| c["intermediate_size"] = 48.into());
    let shape = load_error(&wider).to_string();
    assert!(shape.contains("mlp"), "{shape}");

    let gpt2 = edited("gpt2", |c| c["model_type"] = "gpt2".into());
    assert!(matches!(load_error(&gpt2), LlmError::Architecture(a) if a == "gpt2"));
    for dir in [empty, deeper, wider, gpt2] {
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn a_peft_adapter_loads_and_gives_peft_s_logits_and_saves_back_identically() {
    let device = Default::default();
    let (_, base) = load::<B>(&fixture("llama"), &device).unwrap();
    let (model, spec) = base.load_peft(&fixture("llama-peft")).unwrap();
    assert_eq!((spec.rank, spec.alpha), (4, 8.0));
    let (tokens, reference, _) = expected("llama-peft", "logits");
    let input = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens.clone(), [2, 12]), &device);
    let ours = model
        .forward(input.clone())
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let diff = max_abs_diff(&ours, &reference);
    assert!(diff < 1e-4, "logits differ from peft's by {diff}");
    // The adapter changes the logits: the comparison above is not the base model's.
    let (_, base_logits, _) = expected("llama", "logits");
    assert!(max_abs_diff(&base_logits, &reference) > 1e-2);

    // Saved by Kiln, loaded again: the same logits exactly. (KILN_PEFT_OUT keeps the folder,
    // for `PeftModel.from_pretrained` to read.)
    let dir = std::env::var_os("KILN_PEFT_OUT").map_or_else(
        || std::env::temp_dir().join(format!("kiln-llm-{}-peft", std::process::id())),
        std::path::PathBuf::from,
    );
    model.save_peft(&dir, &spec, "llama").unwrap();
    let (_, base) = load::<B>(&fixture("llama"), &device).unwrap();
    let (again, _) = base.load_peft(&dir).unwrap();
    let twice = again.forward(input).into_data().to_vec::<f32>().unwrap();
    assert_eq!(ours, twice);
    if std::env::var_os("KILN_PEFT_OUT").is_none() {
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn lora_targets_must_exist_and_leave_the_base_frozen() {
    use kiln_nn::llm::LoraSpec;
    // On an autodiff backend, where "frozen" means something.
    let device = Default::default();
    let (_, base) = load::<burn::backend::Autodiff<B>>(&fixture("llama"), &device).unwrap();
    let spec = |targets: &[&str]| LoraSpec {
        rank: 2,
        alpha: 4.0,
        target_modules: targets.iter().map(ToString::to_string).collect(),
        use_rslora: false,
        dropout: 0.0,
    };
    let err = base
        .clone()
        .with_lora(&spec(&["q_proj", "qkv_proj"]))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("target module 'qkv_proj' does not exist"),
        "{err}"
    );
    let model = base.with_lora(&spec(&["q_proj", "down_proj"])).unwrap();
    let layer = &model.model.layers[0];
    assert!(layer.self_attn.q_proj.lora.is_some() && layer.self_attn.k_proj.lora.is_none());
    assert!(
        !layer
            .self_attn
            .q_proj
            .base
            .as_ref()
            .unwrap()
            .weight
            .is_require_grad()
    );
    let adapter = layer.mlp.down_proj.lora.as_ref().unwrap();
    assert!(adapter.a.is_require_grad() && adapter.b.is_require_grad());
}

#[test]
fn merged_adapters_save_as_a_plain_checkpoint_that_loads_to_the_same_logits() {
    let device = Default::default();
    let (_, base) = load::<B>(&fixture("llama"), &device).unwrap();
    let (model, _) = base.load_peft(&fixture("llama-peft")).unwrap();
    let (tokens, reference, _) = expected("llama-peft", "logits");
    let input = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [2, 12]), &device);
    let merged = model.clone().merge_lora();
    assert!(merged.model.layers[0].self_attn.q_proj.lora.is_none());
    let ours = merged
        .forward(input.clone())
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    assert!(max_abs_diff(&ours, &reference) < 1e-4);

    let dir = std::env::var_os("KILN_MERGED_OUT").map_or_else(
        || std::env::temp_dir().join(format!("kiln-llm-{}-merged", std::process::id())),
        PathBuf::from,
    );
    // A base folder with an instruct model's files: each travels with the merged model, so
    // that it keeps its chat template and its end of turn.
    let base_dir = std::env::temp_dir().join(format!("kiln-llm-{}-instruct", std::process::id()));
    std::fs::create_dir_all(&base_dir).unwrap();
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture(&format!("llama/{file}")), base_dir.join(file)).unwrap();
    }
    let companions = [
        ("tokenizer_config.json", "{\"eos_token\": \"</s>\"}"),
        (
            "chat_template.jinja",
            "{% for m in messages %}{{ m.content }}{% endfor %}",
        ),
        ("generation_config.json", "{\"eos_token_id\": [2]}"),
        ("special_tokens_map.json", "{\"eos_token\": \"</s>\"}"),
    ];
    for (file, text) in companions {
        std::fs::write(base_dir.join(file), text).unwrap();
    }
    model.save_pretrained(&dir, &base_dir).unwrap();
    let json = |path: PathBuf| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    assert_eq!(
        json(dir.join("config.json")),
        json(base_dir.join("config.json"))
    );
    for file in std::iter::once("tokenizer.json").chain(companions.map(|c| c.0)) {
        assert_eq!(
            std::fs::read(dir.join(file)).unwrap(),
            std::fs::read(base_dir.join(file)).unwrap(),
            "{file}"
        );
    }
    let config = kiln_nn::llm::load_config(&dir).unwrap();
    let tokenizer = kiln_nn::llm::LlmTokenizer::from_dir(&dir, &config).unwrap();
    assert!(tokenizer.chat_template().is_some());
    std::fs::remove_dir_all(&base_dir).ok();

    // A bf16 base's merged model is written in bf16 (the merge in f32, rounded once), its
    // config saying so; in f32 when asked.
    let bf16 = fixture("llama/bf16");
    let (_, base16) = load::<B>(&bf16, &device).unwrap();
    let (model16, _) = base16.load_peft(&fixture("llama-peft")).unwrap();
    let merged16 = model16.clone().merge_lora();
    let dir16 = dir.with_extension("bf16");
    model16.save_pretrained(&dir16, &bf16).unwrap();
    assert_eq!(kiln_nn::llm::stored_dtype(&dir16).unwrap(), DType::BF16);
    assert_eq!(json(dir16.join("config.json"))["dtype"], "bfloat16");
    let weights = std::fs::metadata(dir16.join("model.safetensors"))
        .unwrap()
        .len();
    let exact = merged16
        .forward(input.clone())
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let (_, loaded16) = load::<B>(&dir16, &device).unwrap();
    let rounded = loaded16
        .forward(input.clone())
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        max_abs_diff(&rounded, &exact) < 2e-2 * scale,
        "bf16 rounding only"
    );
    model16
        .save_pretrained_as(&dir16, &bf16, DType::F32)
        .unwrap();
    assert_eq!(kiln_nn::llm::stored_dtype(&dir16).unwrap(), DType::F32);
    assert_eq!(json(dir16.join("config.json"))["dtype"], "float32");
    let wide = std::fs::metadata(dir16.join("model.safetensors"))
        .unwrap()
        .len();
    assert!(wide > weights * 19 / 10, "{wide} vs {weights}");
    std::fs::remove_dir_all(&dir16).ok();
    let (_, loaded) = load::<B>(&dir, &device).unwrap();
    let again = loaded.forward(input).into_data().to_vec::<f32>().unwrap();
    assert!(max_abs_diff(&again, &reference) < 1e-4);
    assert_eq!(again, ours, "the saved merged model is the merged model");
    if std::env::var_os("KILN_MERGED_OUT").is_none() {
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// Past the shard size, a merged model is written as transformers shards one: numbered files
/// in the model's order and an index naming each tensor's, with the bytes of them all; it
/// loads to the same logits, bit for bit.
#[test]
fn a_model_past_the_shard_size_is_written_in_shards_with_an_index() {
    let device = Default::default();
    let (_, base) = load::<B>(&fixture("llama"), &device).unwrap();
    let (model, _) = base.load_peft(&fixture("llama-peft")).unwrap();
    let dir = std::env::temp_dir().join(format!("kiln-llm-{}-sharded", std::process::id()));
    // 20 KB a shard: the embedding (12 KB in f32) fits one, a layer's projections several.
    model
        .save_pretrained_sharded(&dir, &fixture("llama"), DType::F32, 20_000)
        .unwrap();
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    let files: std::collections::BTreeSet<&str> =
        map.values().map(|v| v.as_str().unwrap()).collect();
    assert!(files.len() >= 3, "{files:?}");
    let count = files.len();
    for (i, file) in files.iter().enumerate() {
        assert_eq!(
            *file,
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        );
        let bytes = std::fs::metadata(dir.join(file)).unwrap().len();
        assert!(bytes < 20_000 + 4096, "{file}: {bytes} bytes");
    }
    assert!(!dir.join("model.safetensors").exists());
    let parameters = kiln_nn::llm::load_config(&fixture("llama"))
        .unwrap()
        .parameters();
    assert_eq!(index["metadata"]["total_size"], 4 * parameters as u64);
    assert!(map.contains_key("model.layers.1.mlp.down_proj.weight"));
    assert!(map.contains_key("model.norm.weight"));
    let tokens: Vec<i64> = (0..24).map(|t| t % 96).collect();
    let input = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [2, 12]), &device);
    let merged = model.merge_lora().forward(input.clone()).into_data();
    let (_, loaded) = load::<B>(&dir, &device).unwrap();
    assert_eq!(loaded.forward(input).into_data(), merged);
    std::fs::remove_dir_all(&dir).ok();
}
