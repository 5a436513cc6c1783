//! Generation with a key/value cache computes what the full forward pass computes, one
//! position at a time; greedy decoding follows the argmax; top-p draws are seeded.

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_nn::llm::{CausalLm, Sampling, load, load_4bit};
use kiln_nn::lora::QuantConfig;

type B = Flex;

mod common;
use common::{fixture, max_abs_diff};

fn tokens(ids: &[u32]) -> Tensor<B, 2, Int> {
    let ids: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
    let n = ids.len();
    Tensor::from_data(TensorData::new(ids, [1, n]), &Default::default())
}

fn logits(t: Tensor<B, 3>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

/// The cached pass over a prompt, then a chunk, then single tokens gives the full pass's
/// logits.
fn cached_equals_full(model: &CausalLm<B>) {
    let sequence = [1u32, 5, 9, 14, 2, 77, 31, 8, 60, 3];
    let full = model.forward(tokens(&sequence));
    let vocab = full.dims()[2];
    let mut cache = model.new_cache();
    let prompt = model.forward_cached(tokens(&sequence[..4]), &mut cache);
    let diff = max_abs_diff(&logits(prompt), &logits(full.clone().narrow(1, 0, 4)));
    assert!(diff < 1e-5, "prompt: {diff}");
    // A chunk of several positions after cached ones: its queries are the last of the keys.
    let chunk = model.forward_cached(tokens(&sequence[4..7]), &mut cache);
    let diff = max_abs_diff(&logits(chunk), &logits(full.clone().narrow(1, 4, 3)));
    assert!(diff < 1e-5, "positions 4..7: {diff}");
    for (i, &token) in sequence.iter().enumerate().skip(7) {
        let step = model.forward_cached(tokens(&[token]), &mut cache);
        let expected = full.clone().narrow(1, i, 1).reshape([1, 1, vocab]);
        let diff = max_abs_diff(&logits(step), &logits(expected));
        assert!(diff < 1e-5, "position {i}: {diff}");
    }
    assert_eq!(cache.len(), sequence.len());
}

/// Greedy decoding without a cache: the whole sequence again for every token.
fn greedy_uncached(model: &CausalLm<B>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        let out = model.forward(tokens(&seq));
        let [_, len, vocab] = out.dims();
        let last = logits(out.narrow(1, len - 1, 1).reshape([1, 1, vocab]));
        let best = last
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0;
        seq.push(best as u32);
    }
    seq[prompt.len()..].to_vec()
}

#[test]
fn the_cache_gives_the_full_pass_s_logits_for_gqa_biases_and_4_bits() {
    let device = Default::default();
    // Mistral's sliding window (4) is shorter than the sequence: cached keys fall out of it.
    for folder in ["llama", "qwen2", "mistral"] {
        let (_, model) = load::<B>(&fixture(folder), &device).unwrap();
        cached_equals_full(&model);
        let (_, four) = load_4bit::<B>(&fixture(folder), &device, &QuantConfig::new()).unwrap();
        cached_equals_full(&four);
    }
}

#[test]
fn greedy_generation_follows_the_argmax_and_stops_at_the_end_token() {
    let (_, model) = load::<B>(&fixture("llama"), &Default::default()).unwrap();
    let prompt = [1u32, 40, 21, 7];
    let greedy = Sampling {
        max_new_tokens: 12,
        ..Sampling::default()
    };
    let ours = model.generate(&prompt, &greedy, |_| false);
    assert_eq!(ours, greedy_uncached(&model, &prompt, 12));
    // Stopping at a token: generation ends with it.
    let stop = ours[5];
    let first = ours.iter().position(|&t| t == stop).unwrap();
    let stopped = model.generate(&prompt, &greedy, |t| t == stop);
    assert_eq!(stopped, ours[..=first].to_vec());
}

#[test]
fn top_p_and_top_k_sampling_are_seeded_and_a_tiny_nucleus_or_one_token_is_greedy() {
    let (_, model) = load::<B>(&fixture("llama"), &Default::default()).unwrap();
    let prompt = [1u32, 40, 21, 7];
    let sampled_k = |seed, top_p, top_k| {
        let sampling = Sampling {
            max_new_tokens: 16,
            temperature: 1.0,
            top_p,
            top_k,
            seed,
        };
        model.generate(&prompt, &sampling, |_| false)
    };
    let sampled = |seed, top_p| sampled_k(seed, top_p, 0);
    assert_eq!(sampled(7, 0.9), sampled(7, 0.9));
    assert_ne!(
        sampled(7, 0.9),
        sampled(8, 0.9),
        "different seeds draw differently"
    );
    let greedy = model.generate(
        &prompt,
        &Sampling {
            max_new_tokens: 16,
            ..Sampling::default()
        },
        |_| false,
    );
    assert_eq!(sampled(7, 1e-6), greedy);
    // Top-k: one token is greedy; a few draw among them, not as the whole vocabulary does.
    assert_eq!(sampled_k(7, 1.0, 1), greedy);
    assert_ne!(sampled_k(7, 1.0, 3), sampled(7, 1.0));
}
