//! GGUF exports of the fixtures read back with candle's GGUF reader: every tensor equal to the
//! source (rounded to f16 or bf16; within q8_0's error), the query and key rows in llama.cpp's
//! interleaved order for `llama`, the metadata llama.cpp reads, and the tokenizer's tokens,
//! types, merges, special ids and chat template.
//!
//! The model fixtures carry no tokenizer but the llama one's: each is exported from a scratch
//! copy with it (they share its 96-token vocabulary). The byte-level tokenizer is the chat
//! fixture's Qwen-style one, on a model Kiln writes from that fixture's config.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device};
use kiln_nn::llm::{GgufType, LlmTokenizer, export_gguf, load_config};
use safetensors::SafeTensors;

mod common;
use common::fixture;

/// A tensor's name, shape and values in f32.
type Named = (String, Vec<usize>, Vec<f32>);

/// A fresh folder: tests run side by side, so every call gets its own.
fn scratch(name: &str) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("kiln-gguf-{}-{call}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A scratch copy of the fixture `model`'s f32 folder with the llama fixture's tokenizer.
fn folder(model: &str) -> PathBuf {
    let dir = scratch(&format!("{model}-folder"));
    for name in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(model).join(name), dir.join(name)).unwrap();
    }
    std::fs::copy(fixture("llama/tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    dir
}

/// The export of the folder `dir` as `ty`, read back: its metadata and its tensors in f32.
fn exported_from(dir: &Path, ty: GgufType) -> (Content, Vec<Named>) {
    let out = scratch(&format!("out-{ty}")).join("m.gguf");
    let report = export_gguf(dir, &out, ty).unwrap();
    let mut file = std::fs::File::open(&out).unwrap();
    let content = Content::read(&mut file).unwrap();
    assert_eq!(content.tensor_infos.len(), report.tensors);
    assert_eq!(report.bytes, std::fs::metadata(&out).unwrap().len());
    let mut tensors = Vec::new();
    for name in content.tensor_infos.keys() {
        let t = content.tensor(&mut file, name, &Device::Cpu).unwrap();
        let dims = t.shape().dims().to_vec();
        let values = t.dequantize(&Device::Cpu).unwrap();
        let values = values.to_dtype(DType::F32).unwrap().flatten_all().unwrap();
        tensors.push((name.clone(), dims, values.to_vec1::<f32>().unwrap()));
    }
    std::fs::remove_dir_all(out.parent().unwrap()).ok();
    (content, tensors)
}

/// [`exported_from`] the fixture `model` with a tokenizer.
fn exported(model: &str, ty: GgufType) -> (Content, Vec<Named>) {
    let dir = folder(model);
    let read = exported_from(&dir, ty);
    std::fs::remove_dir_all(dir).ok();
    read
}

/// The fixture's tensors by Hugging Face name, in f32.
fn source(model: &str) -> Vec<Named> {
    let bytes = std::fs::read(fixture(model).join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (name, view.shape().to_vec(), values)
        })
        .collect()
}

fn string(content: &Content, key: &str) -> String {
    let value = content.metadata.get(key);
    value
        .unwrap_or_else(|| panic!("no {key}"))
        .to_string()
        .unwrap()
        .clone()
}

fn u32_of(content: &Content, key: &str) -> u32 {
    let value = content.metadata.get(key);
    value
        .unwrap_or_else(|| panic!("no {key}"))
        .to_u32()
        .unwrap()
}

/// Row `r` of a head of `d` rows in llama.cpp's order is Hugging Face's row `r / 2` (even) or
/// `d / 2 + r / 2` (odd).
fn hf_row(row: usize, d: usize) -> usize {
    let (head, r) = (row / d, row % d);
    head * d + if r % 2 == 0 { r / 2 } else { d / 2 + r / 2 }
}

/// Every exported tensor against its source, within `tol` of the source's largest value.
fn check_tensors(model: &str, ty: GgufType, tol: f32) {
    let (content, tensors) = exported(model, ty);
    let config = load_config(&fixture(model)).unwrap();
    let arch = string(&content, "general.architecture");
    let source = source(model);
    let mut matched = 0;
    for (hf, shape, values) in &source {
        let gguf = hf
            .replace("model.embed_tokens.weight", "token_embd.weight")
            .replace("model.norm.weight", "output_norm.weight")
            .replace("lm_head.weight", "output.weight")
            .replace("model.layers.", "blk.")
            .replace(".input_layernorm.", ".attn_norm.")
            .replace(".post_attention_layernorm.", ".ffn_norm.")
            .replace(".self_attn.q_proj.", ".attn_q.")
            .replace(".self_attn.k_proj.", ".attn_k.")
            .replace(".self_attn.v_proj.", ".attn_v.")
            .replace(".self_attn.o_proj.", ".attn_output.")
            .replace(".self_attn.q_norm.", ".attn_q_norm.")
            .replace(".self_attn.k_norm.", ".attn_k_norm.")
            .replace(".mlp.gate_proj.", ".ffn_gate.")
            .replace(".mlp.up_proj.", ".ffn_up.")
            .replace(".mlp.down_proj.", ".ffn_down.");
        let (_, dims, got) = tensors
            .iter()
            .find(|(n, ..)| *n == gguf)
            .unwrap_or_else(|| panic!("{model}: {gguf} ({hf}) not exported"));
        assert_eq!(
            dims, shape,
            "{gguf}: candle reads ggml's ne reversed, as [out, in]"
        );
        let cols = shape.get(1).copied().unwrap_or(1);
        let permuted = arch == "llama" && (hf.contains("q_proj") || hf.contains("k_proj"));
        let largest = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, g) in got.iter().enumerate() {
            let (row, col) = (i / cols, i % cols);
            let from = if permuted {
                hf_row(row, config.head_dim) * cols + col
            } else {
                i
            };
            let expected = values[from];
            assert!(
                (g - expected).abs() <= tol * largest,
                "{model} {ty}: {gguf}[{row}, {col}] is {g}, expected {expected}"
            );
        }
        matched += 1;
    }
    let extra = usize::from(config.rope_scaling.is_some());
    assert_eq!(
        matched + extra,
        tensors.len(),
        "{model}: every tensor is a source's"
    );
}

#[test]
fn every_tensor_is_the_source_s_in_f16_bf16_and_q8_0() {
    for model in ["llama", "qwen2", "qwen3", "mistral"] {
        check_tensors(model, GgufType::F16, 1e-3);
        check_tensors(model, GgufType::Bf16, 8e-3);
        // A block's scale is its largest value / 127: half a step is 0.4 % of it.
        check_tensors(model, GgufType::Q8_0, 5e-3);
    }
}

#[test]
fn the_metadata_and_the_tokenizer_are_llama_cpp_s() {
    let cases = [
        ("llama", "llama"),
        ("mistral", "llama"),
        ("qwen2", "qwen2"),
        ("qwen3", "qwen3"),
    ];
    for (model, arch) in cases {
        let dir = folder(model);
        let (content, tensors) = exported_from(&dir, GgufType::Q8_0);
        let config = load_config(&dir).unwrap();
        assert_eq!(string(&content, "general.architecture"), arch);
        assert_eq!(u32_of(&content, "general.file_type"), 7);
        let key = |k: &str| format!("{arch}.{k}");
        assert_eq!(u32_of(&content, &key("block_count")), 2);
        assert_eq!(u32_of(&content, &key("embedding_length")), 32);
        assert_eq!(u32_of(&content, &key("attention.head_count")), 4);
        assert_eq!(u32_of(&content, &key("attention.head_count_kv")), 2);
        assert_eq!(
            u32_of(&content, &key("rope.dimension_count")) as usize,
            config.head_dim
        );
        assert_eq!(u32_of(&content, &key("context_length")), 128);
        // 1-D tensors stay f32; matrices of whole blocks are q8_0.
        for (name, dims, _) in &tensors {
            let ty = content.tensor_infos[name].ggml_dtype;
            let expected = if dims.len() == 1 { "F32" } else { "Q8_0" };
            assert_eq!(format!("{ty:?}"), expected, "{model}: {name}");
        }
        // The tokenizer: its tokens in id order, the specials' ids.
        let tokenizer = LlmTokenizer::from_dir(&dir, &config).unwrap();
        let Value::Array(tokens) = &content.metadata["tokenizer.ggml.tokens"] else {
            panic!("tokens are an array");
        };
        assert_eq!(tokens.len(), config.vocab_size);
        for (id, token) in tokens.iter().enumerate() {
            let text = token.to_string().unwrap();
            if let Some(known) = tokenizer.token_id(text) {
                assert_eq!(known as usize, id, "{model}: {text}");
            }
        }
        // The Qwen fixtures' configs name no end token, nor BOS; LLaMA's and Mistral's do.
        match tokenizer.eos() {
            Some(eos) => assert_eq!(u32_of(&content, "tokenizer.ggml.eos_token_id"), eos),
            None => assert!(!content.metadata.contains_key("tokenizer.ggml.eos_token_id")),
        }
        if arch == "llama" {
            assert_eq!(u32_of(&content, "tokenizer.ggml.bos_token_id"), 1);
            let adds = content.metadata["tokenizer.ggml.add_bos_token"]
                .to_bool()
                .unwrap();
            assert_eq!(adds, tokenizer.encode("a", true).unwrap()[0] == 1);
        }
        assert_eq!(string(&content, "tokenizer.ggml.model"), "llama");
        std::fs::remove_dir_all(dir).ok();
    }
}

/// A byte-level BPE tokenizer (the Qwen-style chat fixture's) is written as llama.cpp's
/// `gpt2`, with its merges in order, its special tokens as control tokens, its end of turn and
/// its chat template.
#[test]
fn a_byte_level_tokenizer_is_written_with_its_merges_and_chat_template() {
    use burn::backend::Flex;
    let base = fixture("chat/qwen2");
    let config = load_config(&base).unwrap();
    let dir = scratch("byte-level");
    config
        .init::<Flex>(&Default::default())
        .save_pretrained_as(&dir, &base, burn::tensor::DType::F32)
        .unwrap();
    let (content, _) = exported_from(&dir, GgufType::F16);
    assert_eq!(string(&content, "tokenizer.ggml.model"), "gpt2");
    // No split pattern llama.cpp names: its default pre-tokeniser.
    assert_eq!(string(&content, "tokenizer.ggml.pre"), "default");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base.join("tokenizer.json")).unwrap())
            .unwrap();
    let Value::Array(merges) = &content.metadata["tokenizer.ggml.merges"] else {
        panic!("merges are an array");
    };
    let expected: Vec<String> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => s.clone(),
            pair => format!(
                "{} {}",
                pair[0].as_str().unwrap(),
                pair[1].as_str().unwrap()
            ),
        })
        .collect();
    let got: Vec<String> = merges
        .iter()
        .map(|m| m.to_string().unwrap().clone())
        .collect();
    assert_eq!(got, expected);
    let tokenizer = LlmTokenizer::from_dir(&dir, &config).unwrap();
    let end = tokenizer.token_id("<|im_end|>").unwrap();
    assert_eq!(u32_of(&content, "tokenizer.ggml.eos_token_id"), end);
    let Value::Array(types) = &content.metadata["tokenizer.ggml.token_type"] else {
        panic!("token types are an array");
    };
    assert_eq!(types[end as usize].to_i32().unwrap(), 3, "a control token");
    assert!(
        !content.metadata["tokenizer.ggml.add_bos_token"]
            .to_bool()
            .unwrap()
    );
    let template = std::fs::read_to_string(base.join("chat_template.jinja")).unwrap();
    assert_eq!(string(&content, "tokenizer.chat_template"), template);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn an_unwritable_out_or_a_folder_without_tokenizer_is_refused_in_one_line() {
    let dir = folder("llama");
    let out = dir.join("missing").join("model.gguf");
    let err = export_gguf(&dir, &out, GgufType::F16)
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.gguf") && !err.contains('\n'), "{err}");
    assert!(!out.exists());
    // The qwen2 fixture's own folder has no tokenizer.json.
    let err = export_gguf(&fixture("qwen2"), &dir.join("q.gguf"), GgufType::F16).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}
