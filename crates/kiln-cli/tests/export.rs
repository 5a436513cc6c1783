//! `kiln export`: a PEFT adapter merged into a Hugging Face folder that generates as the base
//! with the adapter does; GGUF files of it and of the base (the adapter changes them); and
//! one-line errors before anything is written.

mod common;

use common::{assert_one_line_error, fixture, scratch, succeed};

#[test]
fn a_merged_export_generates_as_the_adapter_does_and_exports_to_gguf() {
    let out = scratch("merged");
    let (model, adapter) = (fixture("llama"), fixture("llama-peft"));
    // Named as the base's folder, as the GGUF of an adapter's merge is named.
    let merged = out.join("merged").join("llama");
    succeed(&[
        "export",
        "merged",
        "--model",
        &model,
        "--adapter",
        &adapter,
        "--out",
        merged.to_str().unwrap(),
        "--dtype",
        "f32",
    ]);
    assert!(merged.join("tokenizer.json").is_file());
    let generate = |extra: &[&str]| {
        let args = [
            &["generate", "--prompt", "the cat", "--max-new-tokens", "8"][..],
            extra,
        ];
        succeed(&args.concat())
    };
    let tuned = generate(&["--model", &model, "--adapter", &adapter]);
    assert_eq!(generate(&["--model", merged.to_str().unwrap()]), tuned);
    assert_ne!(
        generate(&["--model", &model]),
        tuned,
        "the adapter changed nothing"
    );
    // GGUF: of the base, of the base with the adapter merged on the way, of the merged folder.
    let gguf = |name: &str, extra: &[&str]| {
        let file = out.join(name);
        let args = [
            &[
                "export",
                "gguf",
                "--out",
                file.to_str().unwrap(),
                "--type",
                "q8_0",
            ][..],
            extra,
        ];
        succeed(&args.concat());
        std::fs::read(file).unwrap()
    };
    let base = gguf("base.gguf", &["--model", &model]);
    let with_adapter = gguf("tuned.gguf", &["--model", &model, "--adapter", &adapter]);
    let from_merged = gguf("merged.gguf", &["--model", merged.to_str().unwrap()]);
    assert_ne!(base, with_adapter);
    // Merged on the way or beforehand: the same file, byte for byte.
    assert!(
        with_adapter == from_merged,
        "the two merges' GGUF files differ"
    );
    // The merge's scratch folder is gone.
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 4, "{left:?}");
    std::fs::remove_dir_all(out).ok();
}

#[test]
fn bad_exports_are_refused_in_one_line() {
    let out = scratch("bad");
    let file = out.join("m.gguf");
    let file = file.to_str().unwrap();
    let llama = fixture("llama");
    assert_one_line_error(
        &[
            "export", "gguf", "--model", &llama, "--out", file, "--type", "q4_k",
        ],
        "invalid value 'q4_k' for '--type",
    );
    // The Qwen2 fixture has no tokenizer.json: a GGUF needs the vocabulary.
    assert_one_line_error(
        &[
            "export",
            "gguf",
            "--model",
            &fixture("qwen2"),
            "--out",
            file,
        ],
        "tokenizer.json: not found",
    );
    let blocked = out.join("blocked");
    std::fs::write(&blocked, b"a file").unwrap();
    let inside = blocked.join("m.gguf");
    assert_one_line_error(
        &[
            "export",
            "gguf",
            "--model",
            &llama,
            "--out",
            inside.to_str().unwrap(),
        ],
        "--out",
    );
    assert_one_line_error(
        &[
            "export",
            "merged",
            "--model",
            &llama,
            "--adapter",
            &out.display().to_string(),
            "--out",
            out.join("m").to_str().unwrap(),
        ],
        "adapter_config.json",
    );
    assert!(!std::path::Path::new(file).exists());
    std::fs::remove_dir_all(out).ok();
}
