//! `kiln generate`: text from a Hugging Face model folder, with fine-tuned adapters when given,
//! greedy or top-p sampled, one cached position per token.

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use kiln_nn::llm::{LlmTokenizer, Message, Role, Sampling, load, load_4bit, load_config};
use kiln_nn::lora::QuantConfig;
use kiln_nn::tensor_parallel::ShardedBackend;

use crate::backend::{BackendKind, Job, Placement, dispatch};

/// Flags of `kiln generate`.
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// The Hugging Face model folder (config.json, weights, tokenizer.json), or a Hub name
    /// (org/name[@revision]) downloaded into the Hugging Face cache.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// LoRA adapters in PEFT's layout (what kiln finetune writes) to apply.
    #[arg(long, value_name = "DIR")]
    adapter: Option<PathBuf>,
    /// Hold the base's projections in 4 bits (NF4), as QLoRA fine-tuning did.
    #[arg(long)]
    load_in_4bit: bool,
    /// The text to continue (tokenised with the special tokens the tokenizer adds, such as a
    /// beginning-of-sequence token), or with --chat the user's message.
    #[arg(long)]
    prompt: String,
    /// Ask as a chat: --prompt is the user's turn, rendered by the model's chat template with
    /// the opening of the assistant's turn, and the answer ends at the end-of-turn token.
    #[arg(long)]
    chat: bool,
    /// With --chat, a system message before the user's turn.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// With --chat, a Jinja chat template to use instead of the model folder's.
    #[arg(long, value_name = "FILE", requires = "chat")]
    chat_template: Option<PathBuf>,
    /// Tokens to generate at most (fewer when the model ends its answer with an
    /// end-of-sequence token of its config.json).
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// 0 is greedy; above 0, sample from the logits divided by it.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Nucleus sampling: draw among the most likely tokens holding this much probability.
    #[arg(long, default_value_t = 0.9, allow_negative_numbers = true)]
    top_p: f32,
    /// Draw among the K most likely tokens only, before the nucleus (transformers' default
    /// is 50); 0 keeps every token.
    #[arg(long, default_value_t = 50)]
    top_k: usize,
    /// Seed of the draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    backend: BackendKind,
}

/// A sampling setting that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// A temperature below zero or not a number.
    #[error("--temperature must be 0 (greedy) or positive, got {0}")]
    Temperature(f32),
    /// A nucleus outside (0, 1].
    #[error("--top-p must be in (0, 1], got {0}")]
    TopP(f32),
    /// Nothing to generate.
    #[error("--max-new-tokens must be at least 1")]
    NoTokens,
    /// A chat asked of a model folder without a chat template.
    #[error(
        "--chat needs a chat template, and the model folder has none (no chat_template.jinja, \
         no chat_template in tokenizer_config.json); give --chat-template FILE, or drop --chat \
         to continue --prompt as plain text"
    )]
    NoChatTemplate,
    /// A prompt that encodes to no token.
    #[error("--prompt encodes to no token; give some text to continue")]
    EmptyPrompt,
    /// More positions than the model was trained for.
    #[error(
        "the prompt's {prompt} tokens and --max-new-tokens {new} exceed the model's \
         max_position_embeddings ({max}); shorten the prompt or lower --max-new-tokens"
    )]
    TooLong {
        /// Tokens of the prompt.
        prompt: usize,
        /// Tokens asked for.
        new: usize,
        /// The model's positions.
        max: usize,
    },
}

/// Runs `kiln generate`.
///
/// # Errors
/// Invalid flags, an unreadable model folder or adapter.
pub fn run(args: GenerateArgs) -> Result<(), Box<dyn std::error::Error>> {
    if !(args.temperature >= 0.0 && args.temperature.is_finite()) {
        return Err(GenerateError::Temperature(args.temperature).into());
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        return Err(GenerateError::TopP(args.top_p).into());
    }
    if args.max_new_tokens == 0 {
        return Err(GenerateError::NoTokens.into());
    }
    let backend = args.backend;
    let text = dispatch(backend, &Placement::Ranks(1), GenerateJob(args))?;
    println!("{text}");
    Ok(())
}

/// The ids of a chat's prompt: the system message (if any) and the user's, rendered by the
/// chat template with the opening of the assistant's turn, encoded with no special token
/// added (the template writes them), as transformers' `apply_chat_template` does.
fn chat_prompt(
    tokenizer: &LlmTokenizer,
    system: Option<&str>,
    user: &str,
) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let template = tokenizer
        .chat_template()
        .ok_or(GenerateError::NoChatTemplate)?;
    let message = |role, content: &str| Message {
        role,
        content: content.to_string(),
    };
    let mut messages: Vec<Message> = system
        .map(|s| message(Role::System, s))
        .into_iter()
        .collect();
    messages.push(message(Role::User, user));
    let text = template.render(&messages, true)?;
    Ok(tokenizer.encode_with_offsets(&text)?.0)
}

struct GenerateJob(GenerateArgs);

impl Job for GenerateJob {
    type Output = String;

    fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<String, Box<dyn std::error::Error>> {
        type I<B> = <B as AutodiffBackend>::InnerBackend;
        let args = self.0;
        let device = &devices[0];
        // A Hub name is the Hugging Face cache's snapshot of it.
        let dir = crate::hub::resolve(&args.model)?;
        let config = load_config(&dir)?;
        let mut tokenizer = LlmTokenizer::from_dir(&dir, &config)?;
        if let Some(template) = &args.chat_template {
            tokenizer = tokenizer.with_chat_template(template)?;
        }
        // The prompt is checked before the model is loaded.
        let prompt = match args.chat {
            true => chat_prompt(&tokenizer, args.system.as_deref(), &args.prompt)?,
            false => tokenizer.encode(&args.prompt, true)?,
        };
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt.into());
        }
        if prompt.len().saturating_add(args.max_new_tokens) > config.max_position_embeddings {
            return Err(GenerateError::TooLong {
                prompt: prompt.len(),
                new: args.max_new_tokens,
                max: config.max_position_embeddings,
            }
            .into());
        }
        let (_, mut model) = if args.load_in_4bit {
            load_4bit::<I<B>>(&dir, device, &QuantConfig::new())?
        } else {
            load::<I<B>>(&dir, device)?
        };
        if let Some(adapter) = &args.adapter {
            kiln_nn::llm::check_peft_base(adapter, &dir);
            model = model.load_peft(adapter)?.0;
        }
        let sampling = Sampling {
            max_new_tokens: args.max_new_tokens,
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            seed: args.seed,
        };
        let started = Instant::now();
        let tokens = model.generate(&prompt, &sampling, |t| tokenizer.is_eos(t));
        tracing::info!(
            "{} prompt tokens, {} generated in {:.2} s",
            prompt.len(),
            tokens.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(tokenizer.decode(&tokens)?)
    }
}
