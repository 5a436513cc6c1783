//! Fine-tuning data: the folder's tokenizer gives Python's ids, examples become sequences
//! whose loss covers the completions only, batches pad to their longest, and bad lines are
//! refused naming file and line.

use std::path::PathBuf;

use burn::backend::Flex;
use burn::data::dataloader::batcher::Batcher;
use kiln_nn::llm::{
    DataFormat, DataSet, Example, LlmError, LlmTokenizer, LmBatch, LmBatcher, LmItem, Packing,
    TokenizeOptions, Tokenized, TrainOn, load_config, tokenize,
};

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

fn read(path: &std::path::Path) -> Result<DataSet, LlmError> {
    DataSet::read(path, DataFormat::Auto)
}

fn options(seq_len: usize, packing: Packing) -> TokenizeOptions {
    TokenizeOptions {
        seq_len,
        packing,
        train_on: TrainOn::Completion,
    }
}

fn tokens(data: &DataSet, seq_len: usize, packing: Packing) -> Result<Tokenized, LlmError> {
    tokenize(data, &tokenizer(), options(seq_len, packing))
}

fn scratch(name: &str, text: &str) -> PathBuf {
    let path =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kiln-data-{name}.jsonl"));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn bad_lines_are_refused_naming_the_file_and_line() {
    let path = scratch(
        "bad",
        "{\"text\": \"ok\"}\n\n{\"prompt\": \"x\", \"response\": \n",
    );
    let err = read(&path).unwrap_err();
    assert!(matches!(err, LlmError::Data { line: 3, .. }), "{err}");
    assert!(err.to_string().contains("not valid JSON"), "{err}");
    let path = scratch("fields", "{\"prompt\": \"x\"}\n");
    let err = read(&path).unwrap_err().to_string();
    assert!(
        err.contains(":1:") && err.contains("\"completion\""),
        "{err}"
    );
    let err = read(&scratch("empty", "\n")).unwrap_err().to_string();
    assert!(err.contains("holds no example"), "{err}");
    assert!(matches!(
        read(&fixture("nowhere.jsonl")),
        Err(LlmError::Io { .. })
    ));
}

#[test]
fn a_completion_trains_itself_and_the_end_token_only() {
    let tokenizer = tokenizer();
    let example = Example::Completion {
        prompt: "what colour is the sky? ".into(),
        completion: "blue".into(),
    };
    let prompt = tokenizer.encode("what colour is the sky? ", true).unwrap();
    let response = tokenizer.encode("blue", false).unwrap();
    let path = fixture("chat.jsonl");
    let one = DataSet::from_examples(&path, vec![example.clone()]);
    let out = tokens(&one, 16, Packing::Pad).unwrap();
    let item = &out.items[0];
    let p = prompt.len();
    // Not padded: the batcher pads each batch to its longest.
    assert_eq!(item.tokens.len(), p + response.len() + 1);
    assert_eq!(&item.tokens[..p], &prompt[..]);
    assert_eq!(&item.tokens[p..p + response.len()], &response[..]);
    assert_eq!(
        item.tokens[p + response.len()],
        2,
        "the end token follows the response"
    );
    // Target i is token i + 1: the response's tokens and the end token, nothing else.
    let trained: Vec<usize> = (0..item.trained.len())
        .filter(|&i| item.trained[i])
        .collect();
    let expected: Vec<usize> = (p - 1..p + response.len()).collect();
    assert_eq!(trained, expected);
    assert_eq!(out.trained_tokens, response.len() + 1);
    assert_eq!(out.truncated, 0);
    // Every token but the first, when asked.
    let all = tokenize(
        &one,
        &tokenizer,
        TokenizeOptions {
            train_on: TrainOn::All,
            ..options(16, Packing::Pad)
        },
    )
    .unwrap();
    assert_eq!(all.trained_tokens, item.trained.len());

    // A sequence too short for the whole answer: cut and counted.
    let short = tokens(&one, p, Packing::Pad).unwrap();
    assert_eq!((short.truncated, short.trained_tokens), (1, 1));
    // A prompt that leaves no room for the response: refused, naming the line.
    let two = DataSet::from_examples(&path, vec![example.clone(), example]);
    let err = tokens(&two, p - 1, Packing::Pad).unwrap_err().to_string();
    assert!(
        err.contains("chat.jsonl:1:") && err.contains("--seq-len"),
        "{err}"
    );
}

#[test]
fn a_batch_pads_to_its_longest_rounded_to_eight_within_the_limit() {
    let data = read(&fixture("chat.jsonl")).unwrap();
    let items = tokens(&data, 24, Packing::Pad).unwrap().items;
    let lens: Vec<usize> = items.iter().map(|i| i.trained.len()).collect();
    let longest = *lens.iter().max().unwrap();
    assert!(lens.iter().any(|&l| l < longest), "{lens:?}");
    let batch: LmBatch<Flex> = LmBatcher::new(24).batch(items.clone(), &Default::default());
    let [n, seq] = batch.inputs.dims();
    assert_eq!((n, seq), (items.len(), longest.div_ceil(8) * 8));
    // Every trained target is where the item put it; the pads are not trained.
    let mask = batch.mask.into_data().to_vec::<f32>().unwrap();
    let targets = batch
        .targets
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .unwrap();
    for (row, item) in items.iter().enumerate() {
        for i in 0..seq {
            let trained = item.trained.get(i).copied().unwrap_or(false);
            assert_eq!(mask[row * seq + i], f32::from(u8::from(trained)));
            if i < item.trained.len() {
                assert_eq!(targets[row * seq + i], i64::from(item.tokens[i + 1]));
            }
        }
    }
    // Rounding never goes past the run's limit.
    assert_eq!(LmBatcher::new(longest).padded_len(longest), longest);
}

#[test]
fn wrapped_packing_cuts_the_whole_stream_into_full_sequences() {
    let tokenizer = tokenizer();
    let path = fixture("chat.jsonl");
    let examples = read(&path).unwrap();
    assert_eq!(examples.len(), 34);
    let padded = tokenize(&examples, &tokenizer, options(24, Packing::Pad)).unwrap();
    let packed = tokenize(&examples, &tokenizer, options(24, Packing::Wrapped)).unwrap();
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

#[test]
fn best_fit_packing_holds_every_example_once_within_the_length() {
    let tokenizer = tokenizer();
    let examples = read(&fixture("chat.jsonl")).unwrap();
    let padded = tokenize(&examples, &tokenizer, options(48, Packing::Pad)).unwrap();
    let packed = tokenize(&examples, &tokenizer, options(48, Packing::Bfd)).unwrap();
    assert_eq!(packed.trained_tokens, padded.trained_tokens);
    assert_eq!(packed.truncated, padded.truncated);
    let held: usize = packed.items.iter().map(LmItem::examples).sum();
    assert_eq!(held, examples.len());
    assert!(
        packed.items.len() * 3 < examples.len(),
        "{}",
        packed.items.len()
    );
    // Each row holds whole examples, as tokenised alone, within --seq-len + 1 tokens.
    let mut alone: Vec<&[u32]> = padded.items.iter().map(|i| i.tokens.as_slice()).collect();
    for item in &packed.items {
        assert!(item.tokens.len() <= 49);
        let mut bounds = item.starts.clone();
        bounds.push(item.tokens.len());
        if item.starts.is_empty() {
            bounds = vec![0, item.tokens.len()];
        }
        for pair in bounds.windows(2) {
            let example = &item.tokens[pair[0]..pair[1]];
            let found = alone.iter().position(|a| *a == example);
            alone.swap_remove(found.expect("a packed example is one of the data's"));
        }
    }
    assert!(alone.is_empty());
}

/// Each token's cross-entropy against its target, `[batch][position]`.
fn token_losses(model: &kiln_nn::llm::CausalLm<Flex>, batch: &LmBatch<Flex>) -> Vec<Vec<f32>> {
    use burn::tensor::activation::log_softmax;
    let logits = model.forward_packed(batch.inputs.clone(), batch.packed.as_ref());
    let [n, seq, _] = logits.dims();
    let logp = log_softmax(logits, 2).gather(2, batch.targets.clone().unsqueeze_dim(2));
    let flat = logp.into_data().to_vec::<f32>().unwrap();
    flat.chunks(seq)
        .map(|row| row.iter().map(|l| -l).collect())
        .take(n)
        .collect()
}

#[test]
fn a_packed_example_has_the_losses_it_has_alone() {
    let device = Default::default();
    let tokenizer = tokenizer();
    let examples = read(&fixture("chat.jsonl")).unwrap();
    let packed = tokenize(&examples, &tokenizer, options(64, Packing::Bfd)).unwrap();
    let (_, model) = kiln_nn::llm::load::<Flex>(&fixture("llama"), &device).unwrap();
    let batcher = LmBatcher::new(64);
    let rows = &packed.items[..3];
    let batch: LmBatch<Flex> = batcher.batch(rows.to_vec(), &device);
    let losses = token_losses(&model, &batch);
    let mask = batch.mask.clone().into_data().to_vec::<f32>().unwrap();
    let seq = batch.inputs.dims()[1];
    // The same rows as one sequence each, attending across their examples.
    let mut crossed = batch.clone();
    crossed.packed = None;
    let crossed = token_losses(&model, &crossed);
    let (mut compared, mut moved) = (0, 0);
    for (r, item) in rows.iter().enumerate() {
        let mut bounds = item.starts.clone();
        bounds.push(item.tokens.len());
        for pair in bounds.windows(2) {
            let (start, end) = (pair[0], pair[1]);
            let example = LmItem::from_stream(
                &item.tokens[start..end]
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| (t, i > 0 && item.trained[start + i - 1]))
                    .collect::<Vec<_>>(),
            );
            let alone: LmBatch<Flex> = batcher.batch(vec![example.clone()], &device);
            let alone_losses = &token_losses(&model, &alone)[0];
            let alone_mask = alone.mask.into_data().to_vec::<f32>().unwrap();
            for i in 0..end - start - 1 {
                let got = losses[r][start + i];
                assert!(
                    (got - alone_losses[i]).abs() < 1e-4,
                    "row {r}, example at {start}, target {i}: {got} packed, {} alone",
                    alone_losses[i]
                );
                assert_eq!(mask[r * seq + start + i], alone_mask[i]);
                compared += 1;
                if start > 0 && (crossed[r][start + i] - alone_losses[i]).abs() > 1e-3 {
                    moved += 1;
                }
            }
            // The last input's target is the next example's first token: never trained.
            if end < item.tokens.len() {
                assert_eq!(mask[r * seq + end - 1], 0.0);
            }
        }
    }
    assert!(compared > 60, "{compared}");
    // Attending across examples changes the later examples' losses.
    assert!(moved > 10, "{moved}");
}
