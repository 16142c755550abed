//! Request validation: from OpenAI's fields to what a backend runs.
//!
//! A body is parsed once into a [`Job`] (its endpoint, the fields every backend reads, the
//! raw JSON that upstreams and the cache key read). The local engine's side of validation,
//! [`engine_request`], turns a job into token ids and sampling parameters; the offline
//! cascade evaluation (`frugal eval-route`) renders and tokenizes through the same
//! [`prompt_tokens`], so both add BOS and apply chat templates the same way.

use std::sync::Arc;

use axum::body::Bytes;
use serde_json::Value;

use frugal_engine::prompt::{self, PromptError};
use frugal_engine::sampling::SamplingParams;
use frugal_engine::scheduler::{Priority, Request};
use frugal_engine::template::{ChatTemplate, Message};
use frugal_engine::tokenizer::Tokenizer;

use crate::http::api::{self, ChatMessage, ChatRequest, Common, CompletionRequest};
use crate::http::error::ApiError;

/// Largest `max_tokens` a request gets when it names none.
pub const DEFAULT_MAX_TOKENS: usize = 512;
/// `top_logprobs` at most, as OpenAI allows.
const MAX_TOP_LOGPROBS: i64 = 20;
/// Alternatives (`n`) an upstream request may ask for at most.
const MAX_N: i64 = 128;

/// The endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Text,
}

impl Kind {
    /// The endpoint below `/v1`.
    pub fn path(self) -> &'static str {
        match self {
            Kind::Chat => "chat/completions",
            Kind::Text => "completions",
        }
    }

    pub fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }

    pub fn id_prefix(self) -> &'static str {
        match self {
            Kind::Chat => "chatcmpl",
            Kind::Text => "cmpl",
        }
    }
}

/// What the request asks the model: chat messages, or a raw prompt.
#[derive(Debug, Clone)]
pub enum Input {
    Chat(Vec<ChatMessage>),
    Prompt(Vec<String>),
}

/// A parsed request, before any backend is chosen.
#[derive(Debug, Clone)]
pub struct Job {
    pub kind: Kind,
    /// The body as it came (upstreams get it, with their model name; the cache key reads it).
    pub body: Value,
    pub common: Common,
    /// Token logprobs wanted, with this many alternatives.
    pub top: Option<usize>,
    pub input: Input,
    /// The batch job this request is a line of (set by the batch runner, never by a
    /// client): it is billed to the job and yields to interactive requests.
    pub batch: Option<Arc<str>>,
    /// A shadow's call (`request::shadow`): it too yields to interactive requests.
    pub shadow: bool,
}

impl Job {
    /// Parses a `/v1/chat/completions` body.
    pub fn chat(body: &Bytes) -> Result<Job, ApiError> {
        let (value, req): (Value, ChatRequest) = parse(body)?;
        if req.messages.is_empty() {
            return Err(ApiError::InvalidParam {
                param: "messages",
                message: "messages must not be empty".into(),
            });
        }
        let top = match (req.logprobs, req.top_logprobs) {
            (false, Some(_)) => {
                return Err(ApiError::InvalidParam {
                    param: "top_logprobs",
                    message: "top_logprobs needs logprobs: true".into(),
                });
            }
            (false, None) => None,
            (true, n) => Some(check_top(n.unwrap_or(0), "top_logprobs")?),
        };
        Job::checked(
            Kind::Chat,
            value,
            req.common,
            top,
            Input::Chat(req.messages),
        )
    }

    /// Parses a `/v1/completions` body.
    pub fn completion(body: &Bytes) -> Result<Job, ApiError> {
        let (value, req): (Value, CompletionRequest) = parse(body)?;
        let top = req.logprobs.map(|n| check_top(n, "logprobs")).transpose()?;
        let prompts = req.prompt.into_vec();
        Job::checked(Kind::Text, value, req.common, top, Input::Prompt(prompts))
    }

    /// Checks what every backend relies on: the counts that bound a request's cost.
    fn checked(
        kind: Kind,
        body: Value,
        common: Common,
        top: Option<usize>,
        input: Input,
    ) -> Result<Job, ApiError> {
        if let Some(n) = common.max_completion_tokens.or(common.max_tokens)
            && n < 1
        {
            return Err(ApiError::InvalidParam {
                param: "max_tokens",
                message: format!("max_tokens must be at least 1, got {n}"),
            });
        }
        if let Some(n) = common.n
            && !(1..=MAX_N).contains(&n)
        {
            return Err(ApiError::InvalidParam {
                param: "n",
                message: format!("n must be between 1 and {MAX_N}, got {n}"),
            });
        }
        Ok(Job {
            kind,
            body,
            common,
            top,
            input,
            batch: None,
            shadow: false,
        })
    }

    /// The model the request names; `None` for the default.
    pub fn model(&self) -> Option<&str> {
        self.common.model.as_deref().filter(|m| *m != "default")
    }

    /// `max_tokens` as asked (either spelling).
    pub fn max_tokens(&self) -> Option<u64> {
        self.common
            .max_completion_tokens
            .or(self.common.max_tokens)
            .map(|n| n.max(1) as u64)
    }

    /// Alternatives asked for.
    pub fn n(&self) -> u64 {
        self.common.n.map_or(1, |n| n.max(1) as u64)
    }

    /// Bytes the request sends to a model: an upper bound of its prompt tokens on any
    /// byte-level tokenizer. Every part counts: text, and as written (JSON) each part of
    /// another kind (an image's URL or base64 data, audio, a file), each message's other
    /// fields (tool calls and results) and the tools offered; an image a model reads as
    /// tiles costs no more tokens than its bytes.
    pub fn prompt_bytes(&self) -> u64 {
        let text: usize = match &self.input {
            Input::Chat(messages) => {
                messages
                    .iter()
                    .map(|m| m.role.len() + m.text_len() + 8)
                    .sum::<usize>()
                    + beyond_text(&self.body)
            }
            Input::Prompt(p) => p.iter().map(String::len).sum(),
        };
        text as u64
    }
}

/// What a chat body sends besides its messages' roles and text parts: the JSON of every
/// other content part and message field, and of the tools, functions and response format.
fn beyond_text(body: &Value) -> usize {
    let messages = body["messages"].as_array().map_or(&[][..], Vec::as_slice);
    let in_messages: usize = messages
        .iter()
        .filter_map(Value::as_object)
        .flat_map(|m| m.iter())
        .map(|(field, v)| match (field.as_str(), v) {
            ("role", _) | ("content", Value::String(_) | Value::Null) => 0,
            ("content", Value::Array(parts)) => parts
                .iter()
                .filter(|p| !(p["type"] == "text" && p["text"].is_string()))
                .map(json_len)
                .sum(),
            (_, v) => field.len() + json_len(v),
        })
        .sum();
    let offered: usize = ["tools", "functions", "response_format"]
        .iter()
        .filter_map(|k| body.get(*k))
        .map(json_len)
        .sum();
    in_messages + offered
}

/// The length of `v` written as JSON, counted without writing it anywhere.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    // Writing to memory that only counts cannot fail.
    let _ = serde_json::to_writer(&mut n, v);
    n.0
}

/// The body as JSON (the cache key reads it) and as the endpoint's request type.
fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<(Value, T), ApiError> {
    let invalid = |e: serde_json::Error| ApiError::BadRequest(format!("invalid request body: {e}"));
    let value: Value = serde_json::from_slice(body).map_err(invalid)?;
    let typed = T::deserialize(&value).map_err(invalid)?;
    Ok((value, typed))
}

fn check_top(n: i64, param: &'static str) -> Result<usize, ApiError> {
    if (0..=MAX_TOP_LOGPROBS).contains(&n) {
        Ok(n as usize)
    } else {
        Err(ApiError::InvalidParam {
            param,
            message: format!("{param} must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
        })
    }
}

/// The chat messages as the template reads them.
pub fn messages(messages: &[ChatMessage]) -> Result<Vec<Message>, ApiError> {
    messages
        .iter()
        .map(|m| {
            Ok(Message {
                role: m.role.clone(),
                content: m.text()?,
            })
        })
        .collect()
}

/// The prompt's token ids on a local model: a chat rendered with the model's template (what
/// users typed is text: a `<|im_start|>` in a message is not a control token), or a raw
/// prompt (the user owns all of it, specials included, as llama.cpp's server reads it),
/// with BOS where the tokenizer wants one.
pub fn prompt_tokens(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    input: &Input,
) -> Result<Vec<u32>, ApiError> {
    let tokens = match input {
        Input::Chat(m) => prompt::encode_chat(tokenizer, template, &messages(m)?, true),
        Input::Prompt(p) => match p.as_slice() {
            [one] => prompt::encode_prompt(tokenizer, one),
            _ => {
                return Err(ApiError::InvalidParam {
                    param: "prompt",
                    message: "give one prompt per request".into(),
                });
            }
        },
    };
    tokens.map_err(|e| match e {
        PromptError::Tokenize(e) => {
            ApiError::BadRequest(format!("cannot tokenize the prompt: {e}"))
        }
        e @ PromptError::SpecialTokenInRole { .. } => ApiError::InvalidParam {
            param: "messages",
            message: e.to_string(),
        },
        e => ApiError::BadRequest(format!("cannot apply the chat template: {e}")),
    })
}

/// What the local engine runs for a job: the engine request and the stop sequences.
pub struct EngineRun {
    pub request: Request,
    pub stops: Vec<String>,
}

/// Validates `job` for a local model whose context holds `ctx` tokens.
pub fn engine_request(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    stop_tokens: &[u32],
    ctx: usize,
    job: &Job,
) -> Result<EngineRun, ApiError> {
    let c = &job.common;
    if job.n() != 1 {
        return Err(ApiError::InvalidParam {
            param: "n",
            message: "only n = 1 is supported".into(),
        });
    }
    for (name, v) in [
        ("presence_penalty", c.presence_penalty),
        ("frequency_penalty", c.frequency_penalty),
    ] {
        if v.is_some_and(|v| v != 0.0) {
            return Err(ApiError::InvalidParam {
                param: if name == "presence_penalty" {
                    "presence_penalty"
                } else {
                    "frequency_penalty"
                },
                message: format!("{name} is not supported; leave it at 0"),
            });
        }
    }
    let tokens = prompt_tokens(tokenizer, template, &job.input)?;
    if tokens.len() >= ctx {
        return Err(ApiError::ContextLength(format!(
            "the prompt is {} tokens; this model's context holds {ctx} tokens",
            tokens.len()
        )));
    }
    let room = ctx - tokens.len();
    let max_tokens = match job.max_tokens() {
        None => room.min(DEFAULT_MAX_TOKENS),
        Some(n) if n > room as u64 => {
            return Err(ApiError::ContextLength(format!(
                "max_tokens {n} plus the prompt's {} tokens exceeds the context of {ctx} tokens (at most {room} for this prompt)",
                tokens.len()
            )));
        }
        Some(n) => n as usize,
    };
    let temperature = c.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::InvalidParam {
            param: "temperature",
            message: format!("temperature must be between 0 and 2, got {temperature}"),
        });
    }
    let top_p = c.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::InvalidParam {
            param: "top_p",
            message: format!("top_p must be in (0, 1], got {top_p}"),
        });
    }
    let top_k = match c.top_k {
        Some(k) if k < 0 => {
            return Err(ApiError::InvalidParam {
                param: "top_k",
                message: format!("top_k must be >= 0, got {k}"),
            });
        }
        k => k.unwrap_or(0) as usize,
    };
    let stops = c
        .stop
        .clone()
        .map(api::OneOrMany::into_vec)
        .unwrap_or_default();
    if stops.len() > 4 || stops.iter().any(String::is_empty) {
        return Err(ApiError::InvalidParam {
            param: "stop",
            message: "stop takes up to 4 non-empty sequences".into(),
        });
    }
    Ok(EngineRun {
        request: Request {
            prompt: tokens,
            max_tokens,
            sampling: SamplingParams {
                temperature,
                top_p,
                top_k,
                seed: c.seed.map(|s| s as u64),
                top_logprobs: job.top.unwrap_or(0),
            },
            stop_tokens: stop_tokens.to_vec(),
            ignore_eos: c.ignore_eos,
            // A batch job's line, or a shadow, yields to interactive requests in the engine.
            priority: if job.batch.is_some() || job.shadow {
                Priority::Batch
            } else {
                Priority::Interactive
            },
        },
        stops,
    })
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn bytes(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn bad_requests_are_refused_naming_the_field() {
        let param = |r: Result<Job, ApiError>| match r {
            Err(ApiError::InvalidParam { param, .. }) => param,
            Err(e) => panic!("{e}"),
            Ok(_) => "accepted",
        };
        assert_eq!(param(Job::chat(&bytes(r#"{"messages":[]}"#))), "messages");
        let chat = |extra: &str| {
            Job::chat(&bytes(&format!(
                r#"{{"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#
            )))
        };
        assert_eq!(param(chat(r#","top_logprobs":2"#)), "top_logprobs");
        assert_eq!(
            param(chat(r#","logprobs":true,"top_logprobs":21"#)),
            "top_logprobs"
        );
        assert_eq!(param(chat(r#","max_tokens":0"#)), "max_tokens");
        assert_eq!(param(chat(r#","n":1000"#)), "n");
        assert_eq!(param(chat(r#","n":0"#)), "n");
        assert_eq!(param(chat(r#","n":4,"max_tokens":9"#)), "accepted");
        assert!(matches!(
            Job::chat(&bytes("{not json")),
            Err(ApiError::BadRequest(_))
        ));
        let job = Job::completion(&bytes(
            r#"{"prompt":"abc","max_completion_tokens":7,"n":3}"#,
        ))
        .unwrap();
        assert_eq!(
            (job.max_tokens(), job.n(), job.prompt_bytes()),
            (Some(7), 3, 3)
        );
        assert_eq!(job.model(), None);
    }

    /// Issue 31: an image part counted 0 bytes, so a prompt of megabytes held nothing of a
    /// budget.
    #[test]
    fn every_part_of_a_message_counts_toward_the_prompt() {
        let text = Job::chat(&bytes(
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"what is this"}]}]}"#,
        ))
        .unwrap();
        assert_eq!(text.prompt_bytes(), 4 + 12 + 8);
        let image = "A".repeat(100_000);
        let job = Job::chat(&bytes(&format!(
            r#"{{"messages":[{{"role":"user","content":[{{"type":"text","text":"what is this"}},{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{image}"}}}}]}}]}}"#
        )))
        .unwrap();
        assert!(job.prompt_bytes() > 100_000 + 24, "{}", job.prompt_bytes());
        let audio = Job::chat(&bytes(
            r#"{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGRiQAAABXQVZF","format":"wav"}}]}]}"#,
        ))
        .unwrap();
        assert!(
            audio.prompt_bytes() > 4 + 8 + 16,
            "{}",
            audio.prompt_bytes()
        );
        // A tool call and its result, and the tools offered.
        let tools = Job::chat(&bytes(
            r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}"#,
        ))
        .unwrap();
        assert!(tools.prompt_bytes() > 150, "{}", tools.prompt_bytes());
    }
}
