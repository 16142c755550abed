//! OpenAI's request and response shapes, as far as frugal serves them. Unknown request
//! fields are ignored, as OpenAI-compatible servers do; known ones are validated.

use serde::{Deserialize, Serialize};

use crate::http::error::ApiError;

/// A string or a list of strings (`stop`, `prompt`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// Message content: a string, or parts of which the text ones are joined.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling fields both endpoints share.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<OneOrMany>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// vLLM's and llama.cpp's extension: generate max_tokens whatever the model says.
    #[serde(default)]
    pub ignore_eos: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<i64>,
    #[serde(flatten)]
    pub common: Common,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: OneOrMany,
    /// Completions take the number of alternatives here.
    pub logprobs: Option<i64>,
    #[serde(flatten)]
    pub common: Common,
}

impl ChatMessage {
    /// The length of its text parts, counted without joining them (parts of other kinds
    /// are counted from the body: [`crate::http::validate::Job::prompt_bytes`]).
    pub fn text_len(&self) -> usize {
        match &self.content {
            None => 0,
            Some(Content::Text(t)) => t.len(),
            Some(Content::Parts(parts)) => parts
                .iter()
                .filter_map(|p| match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => Some(t.len()),
                    _ => None,
                })
                .sum(),
        }
    }

    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => parts
                .iter()
                .map(|p| match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => Ok(t.as_str()),
                    (kind, _) => Err(ApiError::InvalidParam {
                        param: "messages",
                        message: format!(
                            "content parts of type `{kind}` are not supported by this model"
                        ),
                    }),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|v| v.join("")),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// Prompt tokens whose work was reused (the engine's prefix cache), written as OpenAI
    /// does: `prompt_tokens_details.cached_tokens`. A cached answer's replay reused none.
    #[serde(rename = "prompt_tokens_details", serialize_with = "details")]
    pub cached_tokens: usize,
}

fn details<S: serde::Serializer>(cached: &usize, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut d = s.serialize_struct("PromptTokensDetails", 1)?;
    d.serialize_field("cached_tokens", cached)?;
    d.end()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Model {
    pub id: String,
    pub object: &'static str,
    pub created: i64,
    pub owned_by: &'static str,
}
