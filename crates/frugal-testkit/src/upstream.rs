//! A mock OpenAI-compatible upstream for the end-to-end tests: a real HTTP server on
//! loopback (axum, on a thread of its own). What it does depends on the request's message,
//! so each test sentence picks a behaviour; any other message is echoed, with usage of 10
//! prompt and 5 completion tokens (none for a message that starts "no usage"; 1,000 prompt
//! tokens of which 800 cached, as OpenAI reports them, for one that starts "cached"). It serves
//! `/v1/embeddings` too ([`mock_embedding`]: three numbers per input, three tokens each).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// The mock upstream: what it does depends on the request's message, so each test
/// sentence picks a behaviour. Counts the calls it gets, in all and per message.
pub fn mock_upstream() -> (String, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let per_message = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let counter = calls.clone();
    let embedded = calls.clone();
    let app = Router::new()
        .route(
            "/v1/embeddings",
            post(move |body: axum::Json<Value>| {
                embedded.fetch_add(1, Ordering::SeqCst);
                async move { embeddings(&body.0) }
            }),
        )
        .route(
            "/v1/chat/completions",
            post(move |body: axum::Json<Value>| {
                counter.fetch_add(1, Ordering::SeqCst);
                let message = body.0["messages"][0]["content"].to_string();
                let n = {
                    let mut seen = per_message.lock().unwrap();
                    let n = seen.entry(message).or_default();
                    *n += 1;
                    *n - 1
                };
                async move { answer(body.0, n).await }
            }),
        );
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    let addr = rx.recv().unwrap();
    (format!("http://{addr}/v1"), calls)
}

/// The mock's embedding of `text`: its length, and 0.5 and -0.25.
pub fn mock_embedding(text: &str) -> [f32; 3] {
    [text.len() as f32, 0.5, -0.25]
}

/// Embeddings of the inputs, as floats whatever was asked; "bad request" is refused.
fn embeddings(body: &Value) -> Response {
    assert_eq!(
        body["model"], "upstream-name",
        "the upstream's own model name is sent"
    );
    let inputs: Vec<&str> = match &body["input"] {
        Value::String(s) => vec![s.as_str()],
        Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if inputs.contains(&"bad request") {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({ "error": { "message": "input[0] is wrong" } })),
        )
            .into_response();
    }
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| json!({ "object": "embedding", "index": i, "embedding": mock_embedding(t) }))
        .collect();
    let tokens = 3 * inputs.len();
    axum::Json(json!({
        "object": "list",
        "data": data,
        "model": "upstream-name",
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    }))
    .into_response()
}

/// `call`: how many times this message came before.
async fn answer(body: Value, call: usize) -> Response {
    let prompt = body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // The upstream's own model name is sent: the tests name it so, or after a hosted model
    // that frugal prices out of the box.
    assert!(
        body["model"] == "upstream-name" || body["model"] == "gpt-4o-mini",
        "the upstream's own model name is sent: {}",
        body["model"]
    );
    let text = format!("echo: {prompt}");
    // "no usage...": answered, streamed or whole, with no usage at all (some servers).
    let usage = if prompt.starts_with("no usage") {
        Value::Null
    } else if prompt.starts_with("cached") {
        json!({ "prompt_tokens": 1000, "completion_tokens": 5, "total_tokens": 1005,
                "prompt_tokens_details": { "cached_tokens": 800 } })
    } else {
        json!({ "prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15 })
    };
    match prompt.as_str() {
        "fail twice" if call < 2 => {
            return (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response();
        }
        "always 500" => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(json!({ "error": { "message": "the GPU fell over" } })),
            )
                .into_response();
        }
        "bad request" => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({ "error": { "message": "messages[0] is wrong" } })),
            )
                .into_response();
        }
        "slow" => tokio::time::sleep(Duration::from_secs(5)).await,
        p if p.starts_with("pause") => tokio::time::sleep(Duration::from_millis(400)).await,
        "malformed" => return (StatusCode::OK, "{\"choices\": [").into_response(),
        _ => {}
    }
    if body["stream"] == true {
        let mut events = vec![
            json!({ "id": "up-1", "object": "chat.completion.chunk", "model": "upstream-name",
                    "choices": [{ "index": 0, "delta": { "role": "assistant", "content": "echo: " }, "finish_reason": null }] }),
            json!({ "id": "up-1", "object": "chat.completion.chunk", "model": "upstream-name",
                    "choices": [{ "index": 0, "delta": { "content": prompt }, "finish_reason": null }] }),
        ];
        let mut sse: String = events.drain(..).map(|e| format!("data: {e}\n\n")).collect();
        if prompt == "drop mid-stream" {
            // The connection ends before the finish and [DONE].
            return Response::new(Body::from(sse));
        }
        sse.push_str(&format!(
            "data: {}\n\n",
            json!({ "id": "up-1", "object": "chat.completion.chunk", "model": "upstream-name",
                    "choices": [{ "index": 0, "delta": {}, "finish_reason": "stop" }] })
        ));
        if body["stream_options"]["include_usage"] == true && !usage.is_null() {
            sse.push_str(&format!(
                "data: {}\n\n",
                json!({ "id": "up-1", "object": "chat.completion.chunk", "choices": [], "usage": usage })
            ));
        }
        sse.push_str("data: [DONE]\n\n");
        return ([("content-type", "text/event-stream")], sse).into_response();
    }
    axum::Json(json!({
        "id": "up-1",
        "object": "chat.completion",
        "model": "upstream-name",
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": "stop" }],
        "usage": usage,
    }))
    .into_response()
}
