//! Fuzz targets of request validation: any JSON, generated requests and real requests
//! mutated byte by byte must become a job or a 4xx, within a bounded allocation; a job must
//! become an engine request within the context, or a 4xx.

use std::sync::OnceLock;

use axum::response::IntoResponse;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::{Map, json};

use super::*;
use frugal_engine::gguf::Gguf;
use frugal_testkit::fuzz::{Mutation, capped, cases, mutate};

/// The engine's context in these targets: small, so prompts and max_tokens run into it.
const CTX: usize = 256;
/// The largest allocation a request body of at most a few kilobytes may make.
const CAP: usize = 64 << 20;

fn model() -> &'static (Tokenizer, ChatTemplate) {
    static MODEL: OnceLock<(Tokenizer, ChatTemplate)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = frugal_testkit::test_model(frugal_engine::DEFAULT_MODEL);
        let gguf = Gguf::open(&path).unwrap();
        (
            Tokenizer::from_gguf(&gguf).unwrap(),
            ChatTemplate::from_gguf(&gguf).unwrap(),
        )
    })
}

/// A refusal must be the client's fault (4xx), never a 5xx or a panic.
fn client_error(e: ApiError) -> Result<(), TestCaseError> {
    let status = e.into_response().status();
    prop_assert!(status.is_client_error(), "{status}");
    Ok(())
}

/// Validates `body` at both endpoints as the server does, then as the local engine does.
fn check(body: &[u8]) -> Result<(), TestCaseError> {
    let bytes = Bytes::copy_from_slice(body);
    for parse in [Job::chat, Job::completion] {
        let (job, peak) = capped(CAP, body, || parse(&bytes));
        // serde_json's values take tens of bytes per byte of JSON at most.
        prop_assert!(
            peak <= 64 * body.len() + (1 << 20),
            "{peak} bytes for {} bytes of body",
            body.len()
        );
        let job = match job {
            Ok(job) => job,
            Err(e) => {
                client_error(e)?;
                continue;
            }
        };
        prop_assert!(job.max_tokens().is_none_or(|n| n >= 1));
        prop_assert!((1..=128).contains(&job.n()));
        prop_assert!(job.top.is_none_or(|t| t <= 20));
        let (tokenizer, template) = model();
        match engine_request(tokenizer, template, &[2], CTX, &job) {
            Ok(run) => {
                prop_assert!(run.request.prompt.len() + run.request.max_tokens <= CTX);
                prop_assert!(run.request.max_tokens >= 1);
                prop_assert!(run.stops.len() <= 4);
            }
            Err(e) => client_error(e)?,
        }
    }
    Ok(())
}

/// Keys of the request shapes, and now and then another.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(&[
            "messages", "role", "content", "type", "text", "prompt", "logprobs",
            "top_logprobs", "model", "max_tokens", "max_completion_tokens", "temperature",
            "top_p", "top_k", "seed", "stop", "stream", "stream_options", "include_usage",
            "n", "presence_penalty", "frequency_penalty", "ignore_eos",
        ][..]).prop_map(str::to_owned),
        1 => "[a-z_]{0,6}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-3i64..300).prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(
            &[
                "user",
                "system",
                "assistant",
                "text",
                "image_url",
                "",
                "<|im_start|>"
            ][..]
        )
        .prop_map(Value::from),
        "\\PC{0,16}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_validate_any_json", 300)))]

    /// Any JSON, weighted to the request's own keys, at both endpoints.
    #[test]
    fn fuzz_validate_any_json(v in btree_map(key(), json_value(), 0..8)) {
        let body = serde_json::to_vec(&v).unwrap();
        check(&body)?;
    }
}

/// A chat request every server accepts, in OpenAI's shapes.
fn valid_chat() -> impl Strategy<Value = (Value, u64)> {
    let message = (
        prop::sample::select(&["system", "user", "assistant"][..]),
        prop_oneof![
            "\\PC{0,40}".prop_map(Value::from),
            vec("\\PC{0,12}", 1..3).prop_map(|parts| {
                Value::Array(
                    parts
                        .into_iter()
                        .map(|t| json!({"type": "text", "text": t}))
                        .collect(),
                )
            })
        ],
    )
        .prop_map(|(role, content)| json!({"role": role, "content": content}));
    (
        vec(message, 1..4),
        1u64..64,
        1i64..=128,
        0i64..=20,
        any::<bool>(),
        0.0f32..=2.0,
    )
        .prop_map(|(messages, max_tokens, n, top, stream, temperature)| {
            (
                json!({
                    "model": "default",
                    "messages": messages,
                    "max_tokens": max_tokens,
                    "n": n,
                    "logprobs": true,
                    "top_logprobs": top,
                    "stream": stream,
                    "temperature": temperature,
                }),
                max_tokens,
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_validate_valid_chat", 200)))]

    /// A valid chat request is a job with what it asked for.
    #[test]
    fn fuzz_validate_valid_chat((v, max_tokens) in valid_chat()) {
        let job = Job::chat(&Bytes::from(serde_json::to_vec(&v).unwrap()))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(job.max_tokens(), Some(max_tokens));
        prop_assert_eq!(job.n(), v["n"].as_u64().unwrap());
        prop_assert_eq!(job.top, v["top_logprobs"].as_u64().map(|t| t as usize));
        prop_assert_eq!(job.model(), None);
        let text: usize = v["messages"].as_array().unwrap().iter().map(|m| match &m["content"] {
            Value::String(s) => s.len(),
            parts => parts.as_array().unwrap().iter().map(|p| p["text"].as_str().unwrap().len()).sum(),
        }).sum();
        prop_assert!(job.prompt_bytes() as usize >= text);
    }
}

/// Real request bodies: what the OpenAI SDKs send (the tests' and the docs' examples).
const SEEDS: &[&str] = &[
    r#"{"model":"default","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"What is the capital of France?"}],"max_tokens":32,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}"#,
    r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":[{"type":"text","text":"Say hi"},{"type":"text","text":" twice"}]}],"logprobs":true,"top_logprobs":3,"n":2,"stop":["\n\n","END"],"seed":7}"#,
    r#"{"prompt":"What is a new business to start with less investment?","max_tokens":32,"top_p":0.9,"top_k":40,"logprobs":2}"#,
    r#"{"model":"smollm2","prompt":["a","b"],"max_completion_tokens":5,"stop":"x","presence_penalty":0.0,"ignore_eos":true}"#,
];

const DICT: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"true",
    b"-1",
    b"0",
    b"1e999",
    b"99999999999999999999",
    b"\\u0000",
    b"\\ud800",
    b"\"messages\":",
    b"\"max_tokens\":",
    b"\"n\":",
    b"\"stop\":",
    b"\"content\":",
    b"\xff",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_validate_mutated_requests", 500)))]

    /// Real requests mutated byte by byte.
    #[test]
    fn fuzz_validate_mutated_requests(seed in 0usize..SEEDS.len(), m in vec(any::<Mutation>(), 0..6)) {
        check(&mutate(SEEDS[seed].as_bytes(), &m, DICT))?;
    }
}

/// Deeply nested JSON is refused by serde_json's recursion limit, not by the stack.
#[test]
fn fuzz_validate_deep_nesting() {
    for depth in [127, 128, 129, 10_000] {
        let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        check(body.as_bytes()).unwrap();
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":{}"x"{}}}]}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        check(body.as_bytes()).unwrap();
    }
}
