//! Examples into token sequences and the targets their loss counts: text as it is, prompts and
//! completions as TRL joins them, conversations through the model's chat template.

use super::{DataSet, Example};
use crate::llm::{LlmError, LlmTokenizer, LmItem};

/// How examples become sequences of at most `seq_len + 1` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Packing {
    /// One example per sequence (a batch is padded to its longest; pads are never trained); a
    /// longer example's end is cut, and one whose prompt alone fills the sequence is refused.
    #[default]
    Pad,
    /// Whole examples packed into sequences best-fit-decreasing (TRL's default `bfd`): the
    /// longest first, each into the fullest sequence it still fits. Each example attends only
    /// to itself, at positions counted from its own start ([`LmItem::packed`]), so it trains
    /// as it would alone; a longer example's end is cut, as with [`Packing::Pad`]. Little
    /// padding is computed.
    #[serde(alias = "pack")]
    Bfd,
    /// Examples concatenated and cut into full sequences: an example may span two, and a
    /// sequence attends across examples (TRL's `wrapped`). No padding computed.
    Wrapped,
}

/// Which tokens the loss counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainOn {
    /// The completion, or the assistant turns of a conversation (with their end-of-turn
    /// tokens): TRL's `completion_only_loss` and `assistant_only_loss`. Text trains every
    /// token.
    #[default]
    Completion,
    /// Every token but the first.
    All,
}

/// How [`tokenize`] cuts and masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenizeOptions {
    /// The most tokens a sequence's inputs hold.
    pub seq_len: usize,
    /// One example per sequence, or packed.
    pub packing: Packing,
    /// What is trained.
    pub train_on: TrainOn,
}

/// The sequences of a data set.
#[derive(Debug, Clone)]
pub struct Tokenized {
    /// The sequences, each `seq_len + 1` tokens at most.
    pub items: Vec<LmItem>,
    /// Examples whose end was cut to fit ([`Packing::Pad`], [`Packing::Bfd`]).
    pub truncated: usize,
    /// Tokens that count in the loss, over all sequences.
    pub trained_tokens: usize,
    /// Input tokens over all sequences, pads not counted.
    pub tokens: usize,
}

/// Tokenises every example of `data`:
/// - text: `<s> text </s>`, every token trained;
/// - a completion: `<s> prompt completion </s>`, the completion and the end token trained
///   (the prompt and completion encoded apart, as before Kiln read templates);
/// - a conversation: the chat template's text, encoded as transformers encodes it (no special
///   tokens added: the template writes them), the assistant turns' tokens trained
///   ([`crate::llm::ChatTemplate::assistant_spans`]).
///
/// [`TrainOn::All`] trains every token instead. No sequence's first token is a target.
///
/// # Errors
/// [`LlmError::Data`] / [`LlmError::DataRow`] naming the example: a conversation when the
/// tokenizer has no chat template, one the template refuses, or a prompt that leaves no room
/// for its completion within `seq_len` (unless [`Packing::Wrapped`]); [`LlmError::Tokenizer`]
/// from the tokenizer.
pub fn tokenize(
    data: &DataSet,
    tokenizer: &LlmTokenizer,
    options: TokenizeOptions,
) -> Result<Tokenized, LlmError> {
    let TokenizeOptions {
        seq_len,
        packing,
        train_on,
    } = options;
    let mut streams = Vec::with_capacity(data.len());
    for (i, example) in data.examples().iter().enumerate() {
        let mut stream = encode(example, tokenizer).map_err(|e| match e {
            Refusal::Example(reason) => data.error(i, reason),
            Refusal::Other(e) => e,
        })?;
        if train_on == TrainOn::All {
            stream.iter_mut().for_each(|t| t.1 = true);
        }
        // An example's first token (`<s>`) is never a target, not even after the example
        // before it in a packed sequence.
        if let Some(first) = stream.first_mut() {
            first.1 = false;
        }
        streams.push(stream);
    }
    let mut out = Tokenized {
        items: Vec::new(),
        truncated: 0,
        trained_tokens: 0,
        tokens: 0,
    };
    match packing {
        Packing::Pad | Packing::Bfd => {
            for (i, stream) in streams.iter_mut().enumerate() {
                // A target at position i is token i + 1: the first trained token must be at
                // most at index seq_len.
                let first = stream.iter().position(|&(_, trained)| trained);
                if let Some(first) = first.filter(|&f| f > seq_len) {
                    return Err(data.error(
                        i,
                        format!(
                            "the prompt is {first} tokens, which leaves no room for the \
                             completion within --seq-len {seq_len}; raise --seq-len or shorten \
                             the prompt"
                        ),
                    ));
                }
                if stream.len() > seq_len + 1 {
                    stream.truncate(seq_len + 1);
                    out.truncated += 1;
                }
            }
            if packing == Packing::Pad {
                out.items = streams.iter().map(|s| LmItem::from_stream(s)).collect();
            } else {
                let lengths: Vec<usize> = streams.iter().map(Vec::len).collect();
                out.items = best_fit_decreasing(&lengths, seq_len + 1)
                    .into_iter()
                    .map(|bin| LmItem::packed(bin.into_iter().map(|i| streams[i].as_slice())))
                    .collect();
            }
        }
        Packing::Wrapped => {
            let all: Vec<(u32, bool)> = streams.into_iter().flatten().collect();
            // Windows overlap by one token: the last input's target is the next window's
            // first input.
            let mut start = 0;
            while start + 1 < all.len() {
                let window = &all[start..(start + seq_len + 1).min(all.len())];
                out.items.push(LmItem::from_stream(window));
                start += seq_len;
            }
        }
    }
    for item in &out.items {
        out.trained_tokens += item.trained.iter().filter(|&&t| t).count();
        out.tokens += item.trained.len();
    }
    Ok(out)
}

/// The indices of items of `lengths` (each at most `capacity`) in bins of `capacity`,
/// best-fit-decreasing: the longest first (ties in their order), each into the bin it fills
/// most closely, a new bin when none has room. Bins in the order they were opened, each's
/// items in the order they went in.
fn best_fit_decreasing(lengths: &[usize], capacity: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    let mut bins: Vec<Vec<usize>> = Vec::new();
    // (room left, bin): the first entry with room ≥ a length is the best fit.
    let mut room = std::collections::BTreeSet::<(usize, usize)>::new();
    for i in order {
        let len = lengths[i];
        debug_assert!(len <= capacity, "items are cut to the capacity first");
        let (left, bin) = match room.range((len, 0)..).next().copied() {
            Some(entry) => {
                room.remove(&entry);
                entry
            }
            None => {
                bins.push(Vec::new());
                (capacity, bins.len() - 1)
            }
        };
        bins[bin].push(i);
        room.insert((left - len, bin));
    }
    bins
}

/// Why an example could not be encoded.
enum Refusal {
    /// Something about the example, for the caller to place.
    Example(String),
    /// Anything else.
    Other(LlmError),
}

impl From<LlmError> for Refusal {
    fn from(e: LlmError) -> Self {
        Self::Other(e)
    }
}

/// `example`'s tokens, each with whether the loss counts it.
fn encode(example: &Example, tokenizer: &LlmTokenizer) -> Result<Vec<(u32, bool)>, Refusal> {
    let mut stream: Vec<(u32, bool)> = Vec::new();
    match example {
        Example::Text(text) => {
            let ids = tokenizer.encode(text, true)?;
            stream.extend(ids.into_iter().map(|t| (t, true)));
            stream.extend(tokenizer.eos().map(|t| (t, true)));
        }
        Example::Completion { prompt, completion } => {
            let prompt = tokenizer.encode(prompt, true)?;
            stream.extend(prompt.into_iter().map(|t| (t, false)));
            let completion = tokenizer.encode(completion, false)?;
            stream.extend(completion.into_iter().map(|t| (t, true)));
            stream.extend(tokenizer.eos().map(|t| (t, true)));
        }
        Example::Conversation {
            messages,
            trained_from,
        } => {
            let Some(template) = tokenizer.chat_template() else {
                return Err(Refusal::Example(
                    "a conversation needs the model's chat template, and the model folder has \
                     none (no chat_template.jinja, no chat_template in tokenizer_config.json); \
                     give one with --chat-template FILE"
                        .into(),
                ));
            };
            let (text, spans) = template
                .assistant_spans(messages, *trained_from)
                .map_err(|e| Refusal::Example(e.to_string()))?;
            let (ids, offsets) = tokenizer.encode_with_offsets(&text)?;
            stream.extend(ids.into_iter().zip(offsets).map(|(id, (start, _))| {
                let trained = spans.iter().any(|span| span.contains(&start));
                (id, trained)
            }));
        }
    }
    Ok(stream)
}
