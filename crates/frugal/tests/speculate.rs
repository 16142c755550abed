//! Speculative decoding end to end: `frugal serve --speculate ngram` (and `[serve] speculate`)
//! answers exactly as `none` does, a stop sequence cutting the answer inside a draft
//! included, bills the same completion tokens, and counts its drafts on /metrics; an unknown
//! method is refused at start.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use serde_json::{Value, json};

use common::{Server, serve_error};

/// A task whose answer copies the prompt's text: drafts are long and mostly accepted.
const COPY: &str = "Repeat this text word for word.\n\nCompute instances come in four families: \
general purpose (n2, 2 to 64 vCPUs, 4 GiB of memory per vCPU), compute optimized (c2, 2 GiB per \
vCPU), memory optimized (m2, 8 GiB per vCPU) and GPU instances (g1, with one to eight GPUs).";

/// A greedy answer to COPY cut at `stop`: its text and completion tokens.
fn ask(server: &Server, stop: Option<&str>) -> (String, u64) {
    let mut body = json!({
        "messages": [{ "role": "user", "content": COPY }],
        "max_tokens": 48,
        "temperature": 0,
    });
    if let Some(stop) = stop {
        body["stop"] = json!([stop]);
    }
    let (status, v): (u16, Value) = server.json("/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{v}");
    (
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    )
}

#[test]
fn speculation_answers_as_plain_decoding_and_counts_its_drafts() {
    let flags = ["--no-semantic-cache", "--no-cache", "--no-meter"];
    let plain = Server::start(&[&flags[..], &["--speculate", "none"]].concat());
    let spec = Server::start_with_files(
        &[("frugal.toml", "[serve]\nspeculate = \"ngram\"\n")],
        &flags,
    );
    let (text, tokens) = ask(&plain, None);
    assert_eq!(ask(&spec, None), (text.clone(), tokens));
    // A word first said well into the answer, as a stop sequence: the answer ends before it
    // whether its tokens came in a draft or not.
    let words: Vec<&str> = text.split_whitespace().collect();
    let stop = words[words.len() / 2..]
        .iter()
        .find(|w| w.len() > 3 && text.find(*w) > Some(text.len() / 3))
        .unwrap_or_else(|| panic!("no stop word in {text:?}"));
    let cut = ask(&plain, Some(stop));
    assert!(!cut.0.contains(stop) && cut.1 < tokens, "{cut:?}");
    assert_eq!(ask(&spec, Some(stop)), cut);
    let accepted = spec.metric("frugal_speculation_accepted_tokens_total");
    assert!(accepted > 0.0, "{accepted}");
    assert!(spec.metric("frugal_speculation_drafted_tokens_total") >= accepted);
    assert_eq!(plain.metric("frugal_speculation_drafted_tokens_total"), 0.0);
}

#[test]
fn an_unknown_speculation_method_is_refused_at_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(["serve", "--speculate", "eagle"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`eagle` is not a speculation method: ngram or none"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("frugal.toml");
    std::fs::write(&config, "[serve]\nspeculate = \"eagle\"\n").unwrap();
    let err = serve_error(&["--config", config.to_str().unwrap(), "serve"]);
    assert!(
        err.contains("serve.speculate") && err.contains("`ngram`"),
        "{err}"
    );
}
