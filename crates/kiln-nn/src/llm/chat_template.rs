//! A model's chat template: the Jinja program in `chat_template.jinja` or
//! `tokenizer_config.json` that turns a conversation into the text the model was tuned on,
//! rendered as transformers renders it (`apply_chat_template`), by `minijinja`.
//!
//! transformers compiles templates with `trim_blocks` and `lstrip_blocks`, the loop controls,
//! a `raise_exception` function and Python's string and dict methods; the same here
//! (`minijinja_contrib::pycompat` for the methods). Its `{% generation %}` marks (for its
//! assistant mask) are dropped: Kiln finds the assistant turns by rendering the conversation
//! turn by turn ([`ChatTemplate::assistant_spans`]), which needs no marks.

use std::path::{Path, PathBuf};

use minijinja::{Environment, Error, ErrorKind, Value, context};
use serde::Serialize;

use super::LlmError;

const NAME: &str = "chat_template";
/// Bounds the work one rendering may do, so that a template that recurses without end fails
/// instead of hanging the run; real templates use a few thousand units per conversation.
const FUEL: u64 = 50_000_000;

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: Role,
    /// The turn's text.
    pub content: String,
}

/// Who speaks a [`Message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions for the whole conversation.
    System,
    /// The user's turn.
    User,
    /// The model's turn: what fine-tuning trains.
    Assistant,
}

impl Role {
    /// The role named `name`, as chat data spells it.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "system" => Some(Self::System),
            "user" => Some(Self::User),
            "assistant" => Some(Self::Assistant),
            _ => None,
        }
    }
}

/// The special tokens a template may write (`bos_token`, `eos_token`, …), as
/// `tokenizer_config.json` names them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SpecialTokens {
    /// The beginning-of-sequence token's text.
    pub bos_token: Option<String>,
    /// The end-of-sequence token's text: for an instruct model, usually its end of turn.
    pub eos_token: Option<String>,
    /// The padding token's text.
    pub pad_token: Option<String>,
    /// The unknown token's text.
    pub unk_token: Option<String>,
}

/// A compiled chat template.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    path: PathBuf,
    special: SpecialTokens,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("path", &self.path)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`, read from `path` (named in errors), for a tokenizer whose special
    /// tokens are `special`.
    ///
    /// # Errors
    /// [`LlmError::ChatTemplate`] naming the line of a syntax error.
    pub fn new(source: &str, path: &Path, special: SpecialTokens) -> Result<Self, LlmError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("strftime_now", |format: String| -> Result<String, Error> {
            super::strftime::strftime_now(&format)
                .map_err(|message| Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(NAME, without_generation_marks(source))
            .map_err(|e| template_error(path, &e))?;
        Ok(Self {
            env,
            path: path.to_path_buf(),
            special,
        })
    }

    /// The file the template was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The text of `messages`, followed by the opening of an assistant turn when
    /// `add_generation_prompt` (what a prompt for generation ends with).
    ///
    /// # Errors
    /// [`LlmError::ChatTemplate`] naming the template's line that failed, with the
    /// template's own message for a `raise_exception` (roles that do not alternate, say).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, LlmError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| template_error(&self.path, &e))?;
        let s = &self.special;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => s.bos_token,
                eos_token => s.eos_token,
                pad_token => s.pad_token,
                unk_token => s.unk_token,
            })
            .map_err(|e| template_error(&self.path, &e))
    }

    /// The rendered conversation and the byte ranges of it that the assistant turns at or after
    /// `from` add: for each such turn `i`, what the conversation through turn `i` renders to
    /// beyond the conversation before it with a generation prompt. That is the turn's text and
    /// its end-of-turn tokens, without the header the generation prompt already wrote.
    ///
    /// # Errors
    /// [`LlmError::ChatTemplate`] when rendering fails, or when the template renders earlier
    /// turns differently once later ones follow (Qwen3's drops past reasoning, for one), so
    /// that a turn's text cannot be found in the whole.
    pub fn assistant_spans(
        &self,
        messages: &[Message],
        from: usize,
    ) -> Result<(String, Vec<std::ops::Range<usize>>), LlmError> {
        let whole = self.render(messages, false)?;
        let mut spans = Vec::new();
        for (i, message) in messages.iter().enumerate().skip(from) {
            if message.role != Role::Assistant {
                continue;
            }
            let before = self.render(&messages[..i], true)?;
            let through = self.render(&messages[..=i], false)?;
            if !through.starts_with(&before) || !whole.starts_with(&through) {
                return Err(LlmError::ChatTemplate {
                    path: self.path.display().to_string(),
                    reason: format!(
                        "renders turn {} differently once later turns follow, so its tokens \
                         cannot be told apart; train on every token (--train-on all) or give a \
                         template that renders each turn the same (--chat-template FILE)",
                        i + 1
                    ),
                });
            }
            spans.push(before.len()..through.len());
        }
        Ok((whole, spans))
    }
}

/// `source` without transformers' `{% generation %}` / `{% endgeneration %}` marks (with any
/// whitespace control), which only transformers' own assistant mask reads.
fn without_generation_marks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        let Some(close) = rest[open..].find("%}") else {
            break;
        };
        let tag = &rest[open + 2..open + close];
        let word = tag.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..open]);
        if word != "generation" && word != "endgeneration" {
            out.push_str(&rest[open..open + close + 2]);
        }
        rest = &rest[open + close + 2..];
    }
    out.push_str(rest);
    out
}

fn template_error(path: &Path, e: &Error) -> LlmError {
    let line = e
        .line()
        .map(|l| format!(" at line {l}"))
        .unwrap_or_default();
    let detail = e
        .detail()
        .map_or_else(|| e.kind().to_string(), str::to_string);
    LlmError::ChatTemplate {
        path: path.display().to_string(),
        reason: format!("the chat template fails{line}: {detail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chatml() -> ChatTemplate {
        let source = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim \
                      }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>\
                      assistant\n{% endif %}";
        ChatTemplate::new(source, Path::new("t.jinja"), SpecialTokens::default()).unwrap()
    }

    fn msg(role: Role, content: &str) -> Message {
        Message {
            role,
            content: content.into(),
        }
    }

    #[test]
    fn spans_cover_each_assistant_turn_and_its_end() {
        let messages = [
            msg(Role::User, "hi"),
            msg(Role::Assistant, "hello"),
            msg(Role::User, "bye"),
            msg(Role::Assistant, "ciao"),
        ];
        let (text, spans) = chatml().assistant_spans(&messages, 0).unwrap();
        let got: Vec<&str> = spans.iter().map(|r| &text[r.clone()]).collect();
        assert_eq!(got, ["hello<|im_end|>\n", "ciao<|im_end|>\n"]);
        let (_, later) = chatml().assistant_spans(&messages, 2).unwrap();
        assert_eq!(later, spans[1..]);
    }

    #[test]
    fn generation_marks_are_dropped_and_errors_name_the_line() {
        assert_eq!(
            without_generation_marks("a{%- generation %}b{% endgeneration -%}c{% if x %}"),
            "abc{% if x %}"
        );
        let source = "line one\n{{ raise_exception('roles must alternate') }}";
        let t = ChatTemplate::new(source, Path::new("t.jinja"), SpecialTokens::default()).unwrap();
        let e = t.render(&[], false).unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("roles must alternate"),
            "{e}"
        );
        let e = ChatTemplate::new("{% for %}", Path::new("t.jinja"), SpecialTokens::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1"), "{e}");
    }

    #[test]
    fn llama_3_s_date_comes_from_strftime_now_as_in_transformers() {
        // LLaMA 3.1's and 3.2's templates: today's date where `strftime_now` is defined.
        let source = "{%- if strftime_now is defined %}{%- set date = strftime_now(\"%d %b %Y\") \
                      %}{%- else %}{%- set date = \"26 Jul 2024\" %}{%- endif %}Today: {{ date }}";
        let template =
            ChatTemplate::new(source, Path::new("t.jinja"), SpecialTokens::default()).unwrap();
        let today = super::super::strftime::strftime_now("%d %b %Y").unwrap();
        assert_eq!(
            template.render(&[], false).unwrap(),
            format!("Today: {today}")
        );
        let bad = "{{ strftime_now('%Q') }}";
        let template =
            ChatTemplate::new(bad, Path::new("t.jinja"), SpecialTokens::default()).unwrap();
        assert!(
            template
                .render(&[], false)
                .unwrap_err()
                .to_string()
                .contains("%Q")
        );
    }

    #[test]
    fn templates_that_recurse_without_end_fail() {
        let source = "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}";
        let t = ChatTemplate::new(source, Path::new("t.jinja"), SpecialTokens::default()).unwrap();
        assert!(t.render(&[], false).is_err());
    }
}
