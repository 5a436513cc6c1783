//! Fine-tuning data: the folder's tokenizer gives Python's ids, JSONL lines become sequences
//! whose loss covers the responses only, and bad lines are refused naming file and line.

use std::path::PathBuf;

use kiln_nn::llm::{Example, LlmError, LlmTokenizer, Packing, load_config, read_jsonl, tokenize};

mod common;
use common::fixture;

fn tokenizer() -> LlmTokenizer {
    let dir = fixture("llama");
    LlmTokenizer::from_dir(&dir, &load_config(&dir).unwrap()).unwrap()
}

#[test]
fn the_tokenizer_encodes_and_decodes_as_python_does() {
    let tokenizer = tokenizer();
    let text = std::fs::read_to_string(fixture("llama/tokenizer_expected.json")).unwrap();
    let cases: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(cases.len(), 4);
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect()
    };
    for case in &cases {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            tokenizer.encode(text, true).unwrap(),
            ids(&case["ids"]),
            "{text}"
        );
        let plain = tokenizer.encode(text, false).unwrap();
        assert_eq!(plain, ids(&case["ids_plain"]), "{text}");
        assert_eq!(
            tokenizer.decode(&plain).unwrap(),
            case["decoded"].as_str().unwrap()
        );
    }
    assert_eq!(tokenizer.eos(), Some(2));
}

fn scratch(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("kiln-data-{}-{name}.jsonl", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn bad_lines_are_refused_naming_the_file_and_line() {
    let path = scratch(
        "bad",
        "{\"text\": \"ok\"}\n\n{\"prompt\": \"x\", \"response\": \n",
    );
    let err = read_jsonl(&path).unwrap_err();
    assert!(matches!(err, LlmError::Data { line: 3, .. }), "{err}");
    assert!(err.to_string().contains("not valid JSON"), "{err}");
    let path = scratch("fields", "{\"prompt\": \"x\"}\n");
    let err = read_jsonl(&path).unwrap_err().to_string();
    assert!(err.contains(":1:") && err.contains("\"response\""), "{err}");
    let err = read_jsonl(&scratch("empty", "\n")).unwrap_err().to_string();
    assert!(err.contains("holds no example"), "{err}");
    assert!(matches!(
        read_jsonl(&fixture("nowhere.jsonl")),
        Err(LlmError::Io { .. })
    ));
}

#[test]
fn a_chat_example_trains_its_response_and_end_token_only() {
    let tokenizer = tokenizer();
    let example = Example::Chat {
        prompt: "what colour is the sky? ".into(),
        response: "blue".into(),
    };
    let prompt = tokenizer.encode("what colour is the sky? ", true).unwrap();
    let response = tokenizer.encode("blue", false).unwrap();
    let path = fixture("chat.jsonl");
    let out = tokenize(
        std::slice::from_ref(&example),
        &tokenizer,
        16,
        Packing::Pad,
        &path,
    )
    .unwrap();
    let item = &out.items[0];
    assert_eq!(item.tokens.len(), 17);
    let p = prompt.len();
    assert_eq!(&item.tokens[..p], &prompt[..]);
    assert_eq!(&item.tokens[p..p + response.len()], &response[..]);
    assert_eq!(
        item.tokens[p + response.len()],
        2,
        "the end token follows the response"
    );
    // Target i is token i + 1: the response's tokens and the end token, nothing else.
    let trained: Vec<usize> = (0..16).filter(|&i| item.trained[i]).collect();
    let expected: Vec<usize> = (p - 1..p + response.len()).collect();
    assert_eq!(trained, expected);
    assert_eq!(out.trained_tokens, response.len() + 1);
    assert_eq!(out.truncated, 0);

    // A sequence too short for the whole answer: cut and counted.
    let short = tokenize(
        std::slice::from_ref(&example),
        &tokenizer,
        p,
        Packing::Pad,
        &path,
    )
    .unwrap();
    assert_eq!((short.truncated, short.trained_tokens), (1, 1));
    // A prompt that leaves no room for the response: refused, naming the line.
    let err = tokenize(
        &[example.clone(), example],
        &tokenizer,
        p - 1,
        Packing::Pad,
        &path,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("chat.jsonl:1:") && err.contains("--seq-len"),
        "{err}"
    );
}

#[test]
fn packing_cuts_the_whole_stream_into_full_sequences() {
    let tokenizer = tokenizer();
    let path = fixture("chat.jsonl");
    let examples = read_jsonl(&path).unwrap();
    assert_eq!(examples.len(), 34);
    let padded = tokenize(&examples, &tokenizer, 24, Packing::Pad, &path).unwrap();
    let packed = tokenize(&examples, &tokenizer, 24, Packing::Pack, &path).unwrap();
    assert_eq!(padded.items.len(), 34);
    assert!(packed.items.len() < padded.items.len());
    // Nothing cut when padding to 24, and packing trains the same tokens: every trained
    // token of the stream is a target exactly once.
    assert_eq!(padded.truncated, 0);
    assert_eq!(packed.trained_tokens, padded.trained_tokens);
    // Consecutive windows overlap by one token.
    for pair in packed.items.windows(2) {
        assert_eq!(pair[0].tokens[24], pair[1].tokens[0]);
    }
}
