//! Chat templates and conversational data against transformers: the text and ids of
//! `apply_chat_template` for LLaMA 3's and Qwen2's templates on multi-turn conversations (the
//! fixture `chat/expected.json`, written by transformers), the assistant tokens trained, and
//! the data shapes read from JSON Lines and Parquet.

use std::path::{Path, PathBuf};

use kiln_nn::llm::{
    DataFormat, DataSet, Example, LlmTokenizer, Message, Packing, Role, TokenizeOptions, TrainOn,
    load_config, tokenize,
};
use serde_json::Value;

mod common;
use common::fixture;

fn tokenizer(name: &str) -> LlmTokenizer {
    let dir = fixture(&format!("chat/{name}"));
    LlmTokenizer::from_dir(&dir, &load_config(&dir).unwrap()).unwrap()
}

fn cases(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(fixture("chat/expected.json")).unwrap();
    let all: Value = serde_json::from_str(&text).unwrap();
    all[name].as_array().unwrap().clone()
}

fn messages(case: &Value) -> Vec<Message> {
    case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| Message {
            role: Role::parse(m["role"].as_str().unwrap()).unwrap(),
            content: m["content"].as_str().unwrap().into(),
        })
        .collect()
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn options(train_on: TrainOn) -> TokenizeOptions {
    TokenizeOptions {
        seq_len: 512,
        packing: Packing::Pad,
        train_on,
    }
}

fn scratch(name: &str, text: &str) -> PathBuf {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kiln-chat-{name}"));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn templates_render_and_tokenise_as_transformers_does() {
    for name in ["llama3", "qwen2"] {
        let tokenizer = tokenizer(name);
        let template = tokenizer.chat_template().expect("the folder's template");
        // LLaMA 3's is inside tokenizer_config.json, Qwen2's in chat_template.jinja.
        let file = template.path().file_name().unwrap().to_str().unwrap();
        let expected_file = match name {
            "llama3" => "tokenizer_config.json",
            _ => "chat_template.jinja",
        };
        assert_eq!(file, expected_file);
        // The end of a turn ends a sequence: tokenizer_config.json's eos_token.
        let eos = tokenizer.token_id(["<|eot_id|>", "<|im_end|>"][usize::from(name == "qwen2")]);
        assert_eq!(tokenizer.eos(), eos);
        for case in cases(name) {
            let messages = messages(&case);
            let text = template.render(&messages, false).unwrap();
            assert_eq!(text, case["text"].as_str().unwrap(), "{name}");
            let prompt = &messages[..messages.len() - 1];
            let prompt_text = template.render(prompt, true).unwrap();
            assert_eq!(prompt_text, case["prompt_text"].as_str().unwrap(), "{name}");
            let (got, _) = tokenizer.encode_with_offsets(&prompt_text).unwrap();
            assert_eq!(got, ids(&case["prompt_ids"]), "{name}: generation prompt");

            // The sequence trains exactly the assistant tokens (target i is token i + 1).
            let path = Path::new("conversation.jsonl");
            let data = DataSet::from_examples(
                path,
                vec![Example::Conversation {
                    messages: messages.clone(),
                    trained_from: 0,
                }],
            );
            let out = tokenize(&data, &tokenizer, options(TrainOn::Completion)).unwrap();
            let item = &out.items[0];
            assert_eq!(item.tokens, ids(&case["ids"]), "{name}: {text}");
            let mask: Vec<bool> = case["assistant_mask"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_u64() == Some(1))
                .collect();
            assert_eq!(item.trained, mask[1..], "{name}: {text}");
            // The last assistant turn's end-of-turn token is trained: the model learns to stop.
            let eot = item
                .tokens
                .iter()
                .rposition(|&t| Some(t) == tokenizer.eos());
            assert!(item.trained[eot.unwrap() - 1], "{name}: {text}");

            // A conversational prompt-completion trains the completion's turn only.
            let last = messages.len() - 1;
            let data = DataSet::from_examples(
                path,
                vec![Example::Conversation {
                    messages: messages.clone(),
                    trained_from: last,
                }],
            );
            let out = tokenize(&data, &tokenizer, options(TrainOn::Completion)).unwrap();
            let prompt_len = ids(&case["prompt_ids"]).len();
            let trained: Vec<usize> = (0..item.trained.len())
                .filter(|&i| out.items[0].trained[i])
                .collect();
            assert_eq!(trained.first(), Some(&(prompt_len - 1)), "{name}");
            assert!(trained.len() < mask.iter().filter(|&&m| m).count() || last == 1);
        }
    }
}

#[test]
fn chat_data_reads_from_json_lines_and_parquet_alike() {
    let rows: Vec<String> = cases("qwen2")
        .iter()
        .map(|case| serde_json::json!({ "messages": case["messages"] }).to_string())
        .collect();
    let jsonl = scratch("messages.jsonl", &rows.join("\n"));
    let from_json = DataSet::read(&jsonl, DataFormat::Auto).unwrap();
    let from_parquet = DataSet::read(&fixture("chat/messages.parquet"), DataFormat::Auto).unwrap();
    assert_eq!(from_json.len(), 3);
    assert_eq!(from_parquet.examples(), from_json.examples());
    let tokenizer = tokenizer("qwen2");
    let a = tokenize(&from_json, &tokenizer, options(TrainOn::Completion)).unwrap();
    let b = tokenize(&from_parquet, &tokenizer, options(TrainOn::All)).unwrap();
    assert_eq!(a.items.len(), b.items.len());
    assert!(a.trained_tokens < b.trained_tokens);
    std::fs::remove_file(jsonl).ok();
}

#[test]
fn bad_conversations_are_refused_naming_the_row() {
    // A row that breaks the template's own rule: its message and the row.
    let mistral = scratch(
        "mistral.jinja",
        "{{ bos_token }}{% for message in messages %}\n{% if (message['role'] == 'user') != \
         (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate \
         user/assistant/user/assistant/...') }}{% endif %}{{ message['content'] }}{% endfor %}",
    );
    let tokenizer = tokenizer("qwen2").with_chat_template(&mistral).unwrap();
    let data = scratch(
        "alternate.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \
         \"content\": \"b\"}]}\n{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, \
         {\"role\": \"user\", \"content\": \"b\"}, {\"role\": \"assistant\", \"content\": \
         \"c\"}]}\n",
    );
    let data = DataSet::read(&data, DataFormat::Auto).unwrap();
    let err = tokenize(&data, &tokenizer, options(TrainOn::Completion))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(":2:") && err.contains("line 2") && err.contains("must alternate"),
        "{err}"
    );
    assert!(!err.contains('\n'), "one line: {err}");

    // Conversations need a template: the llama fixture's folder has none.
    let dir = fixture("llama");
    let plain = LlmTokenizer::from_dir(&dir, &load_config(&dir).unwrap()).unwrap();
    assert!(plain.chat_template().is_none());
    let err = tokenize(&data, &plain, options(TrainOn::Completion))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(":1:") && err.contains("--chat-template"),
        "{err}"
    );

    // An unknown role, named with its row and message.
    let data = scratch(
        "tool.json",
        "[{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \
         \"content\": \"b\"}]}, {\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}]",
    );
    let err = DataSet::read(&data, DataFormat::Auto)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("row 2") && err.contains("message 1") && err.contains("\"tool\""),
        "{err}"
    );
}
