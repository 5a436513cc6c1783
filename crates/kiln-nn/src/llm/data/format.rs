//! The shapes of a fine-tuning example, as TRL, Alpaca and the Hub's chat sets write them, and
//! how one row (a JSON object) becomes an [`Example`].

use serde_json::Value;

use crate::llm::{Message, Role};

/// One example of a data set.
#[derive(Debug, Clone, PartialEq)]
pub enum Example {
    /// Plain text: every token is trained.
    Text(String),
    /// A prompt and its completion as plain text (TRL's standard prompt-completion; `response`
    /// is read as `completion`): the prompt is not trained, the completion and the end token
    /// are. No chat template is applied, as TRL applies none to text.
    Completion {
        /// What the model is given.
        prompt: String,
        /// What it should answer.
        completion: String,
    },
    /// A conversation, rendered by the model's chat template: `messages`, a conversational
    /// prompt-completion (the prompt's turns, then the completion's), or an Alpaca row (the
    /// instruction and input as the user's turn, the output as the assistant's).
    Conversation {
        /// The turns.
        messages: Vec<Message>,
        /// The first turn that may be trained: the assistant turns from here on are (the
        /// completion's first turn, or 0).
        trained_from: usize,
    },
}

/// Which shape the rows of a data file have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataFormat {
    /// Told by each row's keys; a row that fits two shapes is refused (name one instead).
    #[default]
    Auto,
    /// `text`.
    Text,
    /// `prompt` and `completion` (or `response`): strings, or lists of messages.
    PromptCompletion,
    /// `messages`: a list of `{role, content}`.
    Messages,
    /// `instruction`, `input` (may be empty or absent) and `output`.
    Alpaca,
}

impl DataFormat {
    /// The shapes whose keys `row` has.
    fn matching(row: &serde_json::Map<String, Value>) -> Vec<Self> {
        let has = |key: &str| row.contains_key(key);
        let mut found = Vec::new();
        if has("text") {
            found.push(Self::Text);
        }
        if has("prompt") && (has("completion") || has("response")) {
            found.push(Self::PromptCompletion);
        }
        if has("messages") {
            found.push(Self::Messages);
        }
        if has("instruction") && has("output") {
            found.push(Self::Alpaca);
        }
        found
    }
}

impl std::fmt::Display for DataFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Text => "text",
            Self::PromptCompletion => "prompt_completion",
            Self::Messages => "messages",
            Self::Alpaca => "alpaca",
        })
    }
}

const SHAPES: &str = "{\"text\": ..}, {\"prompt\": .., \"completion\": ..}, {\"messages\": \
                      [{\"role\": .., \"content\": ..}, ..]} or {\"instruction\": .., \"input\": \
                      .., \"output\": ..}";

/// The example of `row` in `format`; the error says what is wrong, for the caller to place.
pub(super) fn example(row: &Value, format: DataFormat) -> Result<Example, String> {
    let Some(object) = row.as_object() else {
        return Err(format!("expected a JSON object: {SHAPES}"));
    };
    let format = match format {
        DataFormat::Auto => match DataFormat::matching(object).as_slice() {
            [one] => *one,
            [] => return Err(format!("has none of the keys of {SHAPES}")),
            several => {
                let names: Vec<String> = several.iter().map(ToString::to_string).collect();
                return Err(format!(
                    "fits several shapes ({}); say which with --data-format",
                    names.join(", ")
                ));
            }
        },
        chosen => chosen,
    };
    let string = |key: &str| -> Result<&str, String> {
        match object.get(key) {
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(format!("\"{key}\" is not a string")),
            None => Err(format!("has no \"{key}\" (--data-format {format})")),
        }
    };
    let example = match format {
        DataFormat::Auto => unreachable!("resolved above"),
        DataFormat::Text => Example::Text(string("text")?.to_string()),
        DataFormat::PromptCompletion => {
            let key = if object.contains_key("completion") {
                "completion"
            } else {
                "response"
            };
            match (object.get("prompt"), object.get(key)) {
                (Some(Value::String(prompt)), Some(Value::String(completion))) => {
                    Example::Completion {
                        prompt: prompt.clone(),
                        completion: completion.clone(),
                    }
                }
                (Some(Value::Array(prompt)), Some(Value::Array(completion))) => {
                    let mut messages = messages(prompt, "prompt")?;
                    let trained_from = messages.len();
                    messages.extend(messages_at(completion, key, trained_from)?);
                    Example::Conversation {
                        messages,
                        trained_from,
                    }
                }
                _ => {
                    return Err(format!(
                        "\"prompt\" and \"{key}\" must both be strings, or both lists of messages"
                    ));
                }
            }
        }
        DataFormat::Messages => match object.get("messages") {
            Some(Value::Array(list)) => Example::Conversation {
                messages: messages(list, "messages")?,
                trained_from: 0,
            },
            _ => return Err("\"messages\" is not a list of {\"role\", \"content\"}".into()),
        },
        DataFormat::Alpaca => {
            let instruction = string("instruction")?;
            let input = match object.get("input") {
                None | Some(Value::Null) => "",
                Some(Value::String(s)) => s,
                Some(_) => return Err("\"input\" is not a string".into()),
            };
            // Alpaca's own prompt puts the input after the instruction, on lines of its own.
            let user = match input.trim().is_empty() {
                true => instruction.to_string(),
                false => format!("{instruction}\n\n{input}"),
            };
            Example::Conversation {
                messages: vec![
                    Message {
                        role: Role::User,
                        content: user,
                    },
                    Message {
                        role: Role::Assistant,
                        content: string("output")?.to_string(),
                    },
                ],
                trained_from: 0,
            }
        }
    };
    check(&example)?;
    Ok(example)
}

/// Refuses examples that would train nothing.
fn check(example: &Example) -> Result<(), String> {
    match example {
        Example::Text(text) if text.is_empty() => {
            Err("the example is empty: it would train nothing but an end token".into())
        }
        Example::Completion { completion, .. } if completion.is_empty() => {
            Err("the completion is empty: it would train nothing but an end token".into())
        }
        Example::Conversation {
            messages,
            trained_from,
        } if !messages[*trained_from..]
            .iter()
            .any(|m| m.role == Role::Assistant) =>
        {
            Err("has no assistant turn to train".into())
        }
        _ => Ok(()),
    }
}

fn messages(list: &[Value], key: &str) -> Result<Vec<Message>, String> {
    messages_at(list, key, 0)
}

/// The messages of `list` (the value of `key`), numbered from `first` in errors.
fn messages_at(list: &[Value], key: &str, first: usize) -> Result<Vec<Message>, String> {
    if list.is_empty() {
        return Err(format!("\"{key}\" is an empty list"));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = || format!("\"{key}\" message {}", first + i + 1);
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{}: expected {{\"role\": .., \"content\": ..}}", at()))?;
            let role = Role::parse(role).ok_or_else(|| {
                format!(
                    "{}: unknown role \"{role}\"; Kiln trains on system, user and assistant \
                     turns",
                    at()
                )
            })?;
            let content = match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(_) => {
                    return Err(format!(
                        "{}: \"content\" is not a string (images and tool calls are not read)",
                        at()
                    ));
                }
                None => return Err(format!("{}: has no \"content\"", at())),
            };
            Ok(Message { role, content })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_shape_is_read_and_ambiguity_is_refused() {
        let auto = DataFormat::Auto;
        assert_eq!(
            example(&json!({"text": "a"}), auto),
            Ok(Example::Text("a".into()))
        );
        let completion = Example::Completion {
            prompt: "p".into(),
            completion: "c".into(),
        };
        assert_eq!(
            example(&json!({"prompt": "p", "completion": "c"}), auto),
            Ok(completion.clone())
        );
        assert_eq!(
            example(&json!({"prompt": "p", "response": "c"}), auto),
            Ok(completion)
        );
        let Ok(Example::Conversation {
            messages,
            trained_from,
        }) = example(
            &json!({"prompt": [{"role": "user", "content": "q"}],
                    "completion": [{"role": "assistant", "content": "a"}]}),
            auto,
        )
        else {
            panic!("a conversational prompt-completion");
        };
        assert_eq!((messages.len(), trained_from), (2, 1));
        let Ok(Example::Conversation { messages, .. }) = example(
            &json!({"instruction": "do", "input": "this", "output": "done"}),
            auto,
        ) else {
            panic!("alpaca");
        };
        assert_eq!(messages[0].content, "do\n\nthis");
        let err = example(
            &json!({"text": "a", "prompt": "p", "completion": "c"}),
            auto,
        );
        assert!(err.unwrap_err().contains("--data-format"));
        assert_eq!(
            example(
                &json!({"text": "a", "prompt": "p", "completion": "c"}),
                DataFormat::Text
            ),
            Ok(Example::Text("a".into()))
        );
    }

    #[test]
    fn bad_messages_are_named() {
        let row = json!({"messages": [{"role": "user", "content": "q"},
                                      {"role": "tool", "content": "x"}]});
        let err = example(&row, DataFormat::Auto).unwrap_err();
        assert!(
            err.contains("message 2") && err.contains("\"tool\""),
            "{err}"
        );
        let row = json!({"messages": [{"role": "user", "content": "q"}]});
        assert!(
            example(&row, DataFormat::Auto)
                .unwrap_err()
                .contains("no assistant turn")
        );
        let row = json!({"messages": [{"role": "user", "content": [{"type": "image"}]}]});
        assert!(
            example(&row, DataFormat::Auto)
                .unwrap_err()
                .contains("not a string")
        );
    }
}
