//! `POST /v1/embeddings` in OpenAI's shapes: the request checked into an [`EmbeddingJob`],
//! and vectors rendered as the client asked (`float`, or `base64` of little-endian f32s, as
//! OpenAI's clients ask by default).

use axum::body::Bytes;
use serde_json::{Value, json};

use crate::http::error::ApiError;

/// Inputs in one request at most, as OpenAI allows.
pub const MAX_INPUTS: usize = 2048;

/// How vectors are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Float,
    Base64,
}

/// What the request embeds.
#[derive(Debug, Clone, PartialEq)]
pub enum Inputs {
    Texts(Vec<String>),
    /// Token ids in the model's own vocabulary: passed to an upstream as they came.
    Tokens(usize),
}

/// A checked embeddings request.
#[derive(Debug, Clone)]
pub struct EmbeddingJob {
    /// The body as it came (an upstream gets it, with its model name; the cache key reads it).
    pub body: Value,
    pub model: Option<String>,
    pub inputs: Inputs,
    pub encoding: Encoding,
    /// The width asked for, if any.
    pub dimensions: Option<i64>,
}

impl EmbeddingJob {
    pub fn parse(body: &Bytes) -> Result<EmbeddingJob, ApiError> {
        let body: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::BadRequest(format!("invalid request body: {e}")))?;
        if !body.is_object() {
            return Err(ApiError::BadRequest(
                "invalid request body: expected a JSON object".into(),
            ));
        }
        let model = match &body["model"] {
            Value::Null => None,
            Value::String(m) => Some(m.clone()),
            _ => return Err(invalid("model", "model must be a string".into())),
        };
        let inputs = inputs(&body["input"])?;
        let encoding = match body["encoding_format"].as_str() {
            None if body["encoding_format"].is_null() => Encoding::Float,
            Some("float") => Encoding::Float,
            Some("base64") => Encoding::Base64,
            _ => {
                return Err(invalid(
                    "encoding_format",
                    format!(
                        "encoding_format must be \"float\" or \"base64\", got {}",
                        body["encoding_format"]
                    ),
                ));
            }
        };
        let dimensions = match &body["dimensions"] {
            Value::Null => None,
            v => match v.as_i64().filter(|d| *d >= 1) {
                Some(d) => Some(d),
                None => {
                    return Err(invalid(
                        "dimensions",
                        format!("dimensions must be a positive integer, got {v}"),
                    ));
                }
            },
        };
        Ok(EmbeddingJob {
            body,
            model,
            inputs,
            encoding,
            dimensions,
        })
    }

    /// The model the request names; `None` for the default.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref().filter(|m| *m != "default")
    }

    /// Bytes of input: an upper bound of its tokens on any byte-level tokenizer (a token
    /// id counts as one).
    pub fn input_bytes(&self) -> u64 {
        match &self.inputs {
            Inputs::Texts(t) => t.iter().map(String::len).sum::<usize>() as u64,
            Inputs::Tokens(n) => *n as u64,
        }
    }
}

fn invalid(param: &'static str, message: String) -> ApiError {
    ApiError::InvalidParam { param, message }
}

/// `input`: a string, an array of strings, an array of token ids, or an array of them.
fn inputs(v: &Value) -> Result<Inputs, ApiError> {
    let inputs = match v {
        Value::String(s) => Inputs::Texts(vec![s.clone()]),
        Value::Array(items) if items.is_empty() => {
            return Err(invalid("input", "input must not be empty".into()));
        }
        Value::Array(items) => array_inputs(items).ok_or_else(|| invalid("input", SHAPE.into()))?,
        _ => return Err(invalid("input", SHAPE.into())),
    };
    let count = match (&inputs, v) {
        (Inputs::Texts(t), _) => t.len(),
        (Inputs::Tokens(_), Value::Array(items)) if items[0].is_array() => items.len(),
        (Inputs::Tokens(_), _) => 1,
    };
    if count > MAX_INPUTS {
        return Err(invalid(
            "input",
            format!("at most {MAX_INPUTS} inputs per request, got {count}"),
        ));
    }
    if let Inputs::Texts(texts) = &inputs
        && let Some(i) = texts.iter().position(String::is_empty)
    {
        // OpenAI refuses an empty string: it has no embedding.
        return Err(invalid("input", format!("input[{i}] is empty")));
    }
    Ok(inputs)
}

const SHAPE: &str =
    "input must be a string, an array of strings, an array of token ids or an array of such arrays";

/// A non-empty array of strings, of token ids, or of non-empty arrays of token ids.
fn array_inputs(items: &[Value]) -> Option<Inputs> {
    let is_token = |v: &Value| v.as_u64().is_some();
    if items.iter().all(Value::is_string) {
        let texts = items.iter().filter_map(|s| s.as_str().map(str::to_owned));
        return Some(Inputs::Texts(texts.collect()));
    }
    if items.iter().all(is_token) {
        return Some(Inputs::Tokens(items.len()));
    }
    let lists: Vec<&Vec<Value>> = items.iter().map(Value::as_array).collect::<Option<_>>()?;
    lists
        .iter()
        .all(|l| !l.is_empty() && l.iter().all(is_token))
        .then(|| Inputs::Tokens(lists.iter().map(|l| l.len()).sum()))
}

/// The response body of `vectors`, as `encoding` writes them, without its cost.
pub fn render(vectors: &[Vec<f32>], encoding: Encoding, model: &str, tokens: u64) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = match encoding {
                Encoding::Float => json!(v),
                Encoding::Base64 => json!(base64(v)),
            };
            json!({ "object": "embedding", "index": index, "embedding": embedding })
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    })
}

/// `v`'s little-endian f32 bytes in standard base64 (with padding), as OpenAI sends them.
fn base64(v: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(body: Value) -> Result<EmbeddingJob, ApiError> {
        EmbeddingJob::parse(&Bytes::from(body.to_string()))
    }

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        // 1.0f32 is 00 00 80 3f little-endian.
        assert_eq!(base64(&[1.0]), "AACAPw==");
        assert_eq!(base64(&[1.0, -2.5]), "AACAPwAAIMA=");
        assert_eq!(base64(&[]), "");
    }

    #[test]
    fn every_input_shape_openai_takes_and_clear_refusals() {
        let texts = |b: Value| job(b).unwrap().inputs;
        assert_eq!(
            texts(json!({ "input": "hi" })),
            Inputs::Texts(vec!["hi".into()])
        );
        assert_eq!(
            texts(json!({ "input": ["a", "b"] })),
            Inputs::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(texts(json!({ "input": [1, 2, 3] })), Inputs::Tokens(3));
        assert_eq!(texts(json!({ "input": [[1, 2], [3]] })), Inputs::Tokens(3));
        let j =
            job(json!({ "input": "x", "encoding_format": "base64", "dimensions": 384 })).unwrap();
        assert_eq!((j.encoding, j.dimensions), (Encoding::Base64, Some(384)));
        for (body, param, says) in [
            (json!({}), "input", "input must be"),
            (json!({ "input": [] }), "input", "must not be empty"),
            (json!({ "input": ["a", ""] }), "input", "input[1] is empty"),
            (json!({ "input": ["a", 1] }), "input", "input must be"),
            (json!({ "input": [[]] }), "input", "input must be"),
            (
                json!({ "input": "x", "encoding_format": "int8" }),
                "encoding_format",
                "\"float\" or \"base64\"",
            ),
            (
                json!({ "input": "x", "dimensions": 0 }),
                "dimensions",
                "positive integer",
            ),
            (
                json!({ "input": "x", "model": 3 }),
                "model",
                "must be a string",
            ),
        ] {
            match job(body.clone()) {
                Err(ApiError::InvalidParam { param: p, message }) => {
                    assert_eq!(p, param, "{body}");
                    assert!(message.contains(says), "{body}: {message}");
                }
                other => panic!("{body}: {other:?}"),
            }
        }
        let many: Vec<&str> = vec!["x"; MAX_INPUTS + 1];
        assert!(job(json!({ "input": many })).is_err());
    }
}
