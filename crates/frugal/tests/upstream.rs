//! End-to-end: `frugal serve` in front of an OpenAI-compatible upstream (a real HTTP server
//! on loopback, played by axum here): pass-through, streaming, pricing, caching, retries,
//! and each way an upstream fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use common::{Server, header, streamed_text};
use frugal_testkit::upstream::mock_upstream;

fn chat(content: &str, extra: &str) -> String {
    format!(
        r#"{{"model":"mock","messages":[{{"role":"user","content":"{content}"}}],"temperature":0{extra}}}"#
    )
}

fn gateway(url: &str) -> Server {
    gateway_with(url, "")
}

/// The gateway with `extra` appended to its frugal.toml.
fn gateway_with(url: &str, extra: &str) -> Server {
    // $1 per million input tokens, $2 per million output tokens.
    gateway_priced(
        url,
        extra,
        "[[model]]\nname = \"mock-price\"\ninput = 1.0\noutput = 2.0\n",
    )
}

fn gateway_priced(url: &str, extra: &str, prices: &str) -> Server {
    let config = format!(
        "[prices]\nfiles = [\"prices.toml\"]\n\n[[serve.upstream]]\nname = \"mock\"\nurl = \"{url}\"\nmodel = \"upstream-name\"\nprice = \"mock-price\"\ntimeout_s = 1\nretries = 2\n{extra}"
    );
    Server::start_with_files(
        &[("prices.toml", prices), ("frugal.toml", &config)],
        &["--name", "small"],
    )
}

#[test]
fn cascade_routes_accept_confident_answers_and_escalate_the_rest() {
    let (url, calls) = mock_upstream();
    let routes = "[[serve.route]]\nname = \"sure\"\ntiers = [\"small\", \"mock\"]\nthreshold = -1000.0\n\n[[serve.route]]\nname = \"picky\"\ntiers = [\"small\", \"mock\"]\nquantile = 0.0\nthreshold = -0.0001\n";
    let server = gateway_with(&url, routes);
    let ask = |route: &str, content: &str, extra: &str| {
        let body = format!(
            r#"{{"model":"{route}","messages":[{{"role":"user","content":"{content}"}}],"max_tokens":12,"temperature":0{extra}}}"#
        );
        server.request("POST", "/v1/chat/completions", &body)
    };
    // Confident enough: the local model's answer, and the upstream never called.
    let (status, head, body) = ask("sure", "What is the capital of France?", "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&head, "x-frugal-route"), Some("small"), "{head}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let local = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!local.starts_with("echo:"), "{local}");
    assert!(v["choices"][0]["logprobs"].is_null(), "not asked for: {v}");
    assert!(
        header(&head, "x-frugal-cost-usd")
            .unwrap()
            .parse::<f64>()
            .unwrap()
            > 0.0
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // The same, streamed.
    let (_, head, sse) = ask("sure", "Name a bird.", r#","stream":true"#);
    assert_eq!(header(&head, "x-frugal-route"), Some("small"), "{head}");
    let (text, done) = streamed_text(&sse);
    assert!(
        done && !text.is_empty() && !text.starts_with("echo:"),
        "{sse}"
    );

    // Not confident: escalated, and the request cost both tiers.
    let (status, head, body) = ask("picky", "What is the capital of Peru?", "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        header(&head, "x-frugal-route"),
        Some("small>mock"),
        "{head}"
    );
    assert!(
        body.contains("echo: What is the capital of Peru?"),
        "{body}"
    );
    let total: f64 = header(&head, "x-frugal-cost-usd").unwrap().parse().unwrap();
    assert!(
        total > 0.000020,
        "small tier plus $0.00002 of upstream: {total}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let (_, _, sse) = ask("picky", "Stream Peru", r#","stream":true"#);
    assert_eq!(streamed_text(&sse), ("echo: Stream Peru".to_owned(), true));
    assert_eq!(
        server.metric("frugal_route_requests_total{route=\"picky\",tier=\"mock\"}"),
        2.0
    );
    assert_eq!(
        server.metric("frugal_route_requests_total{route=\"sure\",tier=\"small\"}"),
        2.0
    );
    // The routes are models clients can list; streamed logprobs are refused clearly.
    let (_, _, models) = server.request("GET", "/v1/models", "");
    assert!(
        models.contains("\"picky\"") && models.contains("\"sure\""),
        "{models}"
    );
    let (status, _, body) = ask("sure", "x", r#","stream":true,"logprobs":true"#);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("does not stream logprobs"), "{body}");
}

/// Regression: a cascade's cheap tier answered from the cache (filled by a direct request,
/// which asked for no logprobs) came back with no logprobs and was always accepted.
#[test]
fn a_cascade_after_a_cached_direct_request_still_judges_confidence() {
    let (url, calls) = mock_upstream();
    let route = "[[serve.route]]\nname = \"picky\"\ntiers = [\"small\", \"mock\"]\nquantile = 0.0\nthreshold = -0.0001\n";
    let server = gateway_with(&url, route);
    let ask = |model: &str| {
        let body = format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"What is the capital of Peru?"}}],"max_tokens":12,"temperature":0}}"#
        );
        server.request("POST", "/v1/chat/completions", &body)
    };
    let (status, head, body) = ask("small");
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"), "{head}");
    // The route's cheap tier now hits that entry, and is judged on the logprobs kept with it.
    let (status, head, body) = ask("picky");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        header(&head, "x-frugal-route"),
        Some("small>mock"),
        "{head}"
    );
    assert!(
        body.contains("echo: What is the capital of Peru?"),
        "{body}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn the_ledger_and_the_report_say_what_routing_and_the_cache_saved() {
    let (url, calls) = mock_upstream();
    // A dear upstream: the cheap tier's answer saves far more than it costs.
    let prices = "[[model]]\nname = \"mock-price\"\ninput = 1000.0\noutput = 2000.0\n";
    let route =
        "[[serve.route]]\nname = \"auto\"\ntiers = [\"small\", \"mock\"]\nthreshold = -1000.0\n";
    let server = gateway_priced(&url, route, prices);
    let body = r#"{"model":"auto","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":12,"temperature":0}"#;
    let (status, head, _) = server.request("POST", "/v1/chat/completions", body);
    assert_eq!(status, 200);
    assert_eq!(header(&head, "x-frugal-route"), Some("small"), "{head}");
    let routing = server.metric("frugal_saved_usd_total{lever=\"routing\",model=\"auto\"}");
    assert!(routing > 0.001, "the upstream call not made: {routing}");
    // Asked again: the cache answers the local tier; routing saves the upstream again.
    let (_, head, _) = server.request("POST", "/v1/chat/completions", body);
    assert_eq!(header(&head, "x-frugal-cache"), Some("hit-exact"), "{head}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let (_, dir) = server.stop();
    let ledger = dir.path().join("ledger.sqlite");
    let db = rusqlite::Connection::open(&ledger).unwrap();
    let levers: Vec<(i64, i64)> = db
        .prepare("SELECT lever, saved FROM events WHERE lever IS NOT NULL ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let cache = frugal_cost::Lever::Cache.code();
    let routing = frugal_cost::Lever::Routing.code();
    assert_eq!(
        levers.iter().filter(|(l, _)| *l == routing).count(),
        2,
        "{levers:?}"
    );
    assert_eq!(
        levers.iter().filter(|(l, _)| *l == cache).count(),
        1,
        "{levers:?}"
    );
    assert!(levers.iter().all(|(_, saved)| *saved > 0), "{levers:?}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
        .arg("--ledger")
        .arg(&ledger)
        .arg("report")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("Saved by the levers"), "{report}");
}

#[test]
fn an_upstreams_cached_input_is_billed_at_its_cached_price_and_saved_once() {
    let (url, calls) = mock_upstream();
    // $1,000 per million input tokens, $100 cached, $2,000 output.
    let prices =
        "[[model]]\nname = \"mock-price\"\ninput = 1000.0\ncached_input = 100.0\noutput = 2000.0\n";
    let server = gateway_priced(&url, "", prices);
    // 1,000 prompt tokens of which 800 cached, 5 out: 200 x $0.001 + 800 x $0.0001 +
    // 5 x $0.002 = $0.29, where uncached input would have cost $0.72 more.
    let (status, head, body) =
        server.request("POST", "/v1/chat/completions", &chat("cached prompt", ""));
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"), "{head}");
    assert_eq!(header(&head, "x-frugal-cost-usd"), Some("0.290000000"));
    assert_eq!(header(&head, "x-frugal-cached-tokens"), Some("800"));
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 800);
    let saved = "frugal_saved_usd_total{lever=\"prefix_cache\",model=\"mock\"}";
    assert!(
        (server.metric(saved) - 0.72).abs() < 1e-9,
        "{}",
        server.metric(saved)
    );
    // Streamed with its usage: the usage chunk says so, and the call is priced the same.
    let streamed = r#","stream":true,"stream_options":{"include_usage":true}"#;
    let (status, head, sse) = server.request(
        "POST",
        "/v1/chat/completions",
        &chat("cached, streamed", streamed),
    );
    assert_eq!(status, 200, "{sse}");
    assert_eq!(header(&head, "x-frugal-cached-tokens"), None, "{head}");
    let usage: Value = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["usage"].is_object())
        .unwrap();
    assert_eq!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"],
        800
    );
    assert_eq!(usage["frugal"]["cost_usd"], "0.290000000");
    assert!((server.metric(saved) - 1.44).abs() < 1e-9);
    // The first asked again: the exact cache answers (its own lever), with no cached prompt
    // tokens and no second prefix saving.
    let (_, head, body) =
        server.request("POST", "/v1/chat/completions", &chat("cached prompt", ""));
    assert_eq!(header(&head, "x-frugal-cache"), Some("hit-exact"), "{head}");
    assert_eq!(header(&head, "x-frugal-cached-tokens"), Some("0"));
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert!((server.metric(saved) - 1.44).abs() < 1e-9);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let (_, dir) = server.stop();
    let ledger = dir.path().join("ledger.sqlite");
    let db = rusqlite::Connection::open(&ledger).unwrap();
    let rows: Vec<(i64, i64, Option<i64>, i64)> = db
        .prepare(
            "SELECT cached_tokens, cost, lever, saved FROM events
             WHERE lever IS NOT NULL OR cached_tokens > 0 ORDER BY id",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let prefix = Some(frugal_cost::Lever::PrefixCache.code());
    let cache = Some(frugal_cost::Lever::Cache.code());
    // Each call's row, and beside it a row of its saving alone; the replay saved the call.
    let call = (800, 290_000_000, None, 0);
    let saving = (0, 0, prefix, 720_000_000);
    assert_eq!(
        rows,
        [saving, call, saving, call, (0, 0, cache, 290_000_000)]
    );
    let report = common::report(&ledger, &["--json"]);
    let r: Value = serde_json::from_str(&report).unwrap();
    let line = r["inference"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["model"] == "mock")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(line["saved"]["prefix_cache"], 1_440_000_000, "{line}");
    let text = common::report(&ledger, &[]);
    assert!(text.contains("prefix cache"), "{text}");
    assert!(text.contains("$1.44"), "{text}");
}

#[test]
fn a_route_whose_first_tier_is_not_local_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("frugal.toml");
    std::fs::write(
        &config,
        "[[serve.upstream]]\nname = \"mock\"\nurl = \"http://127.0.0.1:9/v1\"\n\n[[serve.route]]\nname = \"auto\"\ntiers = [\"mock\", \"small\"]\nthreshold = -1.0\n",
    )
    .unwrap();
    let err = common::serve_error(&[
        "--config",
        config.to_str().unwrap(),
        "serve",
        "--no-meter",
        "--no-semantic-cache",
        "--name",
        "small",
    ]);
    assert!(
        err.contains("route `auto`: tier `mock` must be the local model `small`"),
        "{err}"
    );
}

#[test]
fn requests_pass_through_priced_cached_and_streamed() {
    let (url, calls) = mock_upstream();
    let server = gateway(&url);
    let (_, _, models) = server.request("GET", "/v1/models", "");
    let models: Value = serde_json::from_str(&models).unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"mock"), "{models}");

    let (status, head, body) = server.request("POST", "/v1/chat/completions", &chat("hello", ""));
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "echo: hello");
    // 10 input tokens at $1/M plus 5 output tokens at $2/M.
    assert_eq!(
        header(&head, "x-frugal-cost-usd"),
        Some("0.000020000"),
        "{head}"
    );
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Again: from the cache, and the upstream is not called.
    let (_, head, body) = server.request("POST", "/v1/chat/completions", &chat("hello", ""));
    assert_eq!(header(&head, "x-frugal-cache"), Some("hit-exact"), "{head}");
    assert_eq!(header(&head, "x-frugal-saved-usd"), Some("0.000020000"));
    let again: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(again["choices"][0]["message"]["content"], "echo: hello");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Streaming is passed through; the usage chunk only when asked for.
    let (_, _, sse) = server.request(
        "POST",
        "/v1/chat/completions",
        &chat("stream me", r#","stream":true"#),
    );
    assert_eq!(streamed_text(&sse), ("echo: stream me".to_owned(), true));
    assert!(!sse.contains("\"usage\""), "{sse}");
    let (_, _, sse) = server.request(
        "POST",
        "/v1/chat/completions",
        &chat(
            "stream usage",
            r#","stream":true,"stream_options":{"include_usage":true}"#,
        ),
    );
    assert_eq!(streamed_text(&sse).0, "echo: stream usage");
    assert!(sse.contains(r#""completion_tokens":5"#), "{sse}");
    // A streamed answer is cached like any other.
    let (_, head, body) = server.request("POST", "/v1/chat/completions", &chat("stream me", ""));
    assert_eq!(header(&head, "x-frugal-cache"), Some("hit-exact"), "{head}");
    assert!(body.contains("echo: stream me"), "{body}");

    // Transient failures are retried: 503, 503, then an answer.
    let (status, _, body) = server.request("POST", "/v1/chat/completions", &chat("fail twice", ""));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("echo: fail twice"));

    let (_, dir) = server.stop();
    let report = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
        .arg("--ledger")
        .arg(dir.path().join("ledger.sqlite"))
        .args(["report", "--json"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    let text = report.to_string();
    assert!(
        text.contains("\"mock\""),
        "the upstream's calls are in the ledger: {text}"
    );
}

#[test]
fn upstream_failures_are_clear_client_errors() {
    let (url, calls) = mock_upstream();
    let server = gateway(&url);
    let error = |content: &str, extra: &str| {
        let (status, _, body) =
            server.request("POST", "/v1/chat/completions", &chat(content, extra));
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        (
            status,
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    };
    // A 500 is retried (3 calls), then a 502 naming the upstream and its message.
    let before = calls.load(Ordering::SeqCst);
    let (status, message) = error("always 500", "");
    assert_eq!(status, 502);
    assert!(
        message.contains("`mock`") && message.contains("the GPU fell over"),
        "{message}"
    );
    assert_eq!(calls.load(Ordering::SeqCst) - before, 3);
    // The client's own mistake comes back as the upstream said it, not retried.
    let before = calls.load(Ordering::SeqCst);
    let (status, message) = error("bad request", "");
    assert_eq!(status, 400);
    assert!(message.contains("messages[0] is wrong"), "{message}");
    assert_eq!(calls.load(Ordering::SeqCst) - before, 1);
    // Too slow: a 504 after the timeout (1 s, and its retries).
    let (status, message) = error("slow", "");
    assert_eq!(status, 504);
    assert!(message.contains("timed out"), "{message}");
    // Malformed JSON from the upstream.
    let (status, message) = error("malformed", "");
    assert_eq!(status, 502);
    assert!(message.contains("malformed JSON"), "{message}");
    // A stream that drops: the client gets an error event and [DONE].
    let (status, _, sse) = server.request(
        "POST",
        "/v1/chat/completions",
        &chat("drop mid-stream", r#","stream":true"#),
    );
    assert_eq!(status, 200);
    let error = sse.find("closed the stream before [DONE]").expect(&sse);
    assert!(sse[error..].contains("data: [DONE]"), "{sse}");
    // Every failure is in the ledger: a failed outcome, serving no request.
    let (_, dir) = server.stop();
    let db = rusqlite::Connection::open(dir.path().join("ledger.sqlite")).unwrap();
    let failed: i64 = db
        .query_row(
            "SELECT count(*) FROM events WHERE outcome IS NOT NULL AND requests = 0",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        failed, 5,
        "always 500, bad request, slow, malformed, dropped stream"
    );
    // An unreachable upstream.
    let server = gateway("http://127.0.0.1:9/v1");
    let (status, _, body) = server.request("POST", "/v1/chat/completions", &chat("hello", ""));
    assert_eq!(status, 502);
    assert!(body.contains("unreachable"), "{body}");
    assert!(server.metric("frugal_requests_total{status=\"failed\"}") >= 1.0);
}

#[test]
fn a_skip_rule_sends_requests_like_the_cheap_tiers_failures_straight_to_the_last_tier() {
    let (url, calls) = mock_upstream();
    // Sums the cheap tier got wrong, capitals it got right.
    let examples: String = [
        ("What is 17 plus 25?", false),
        ("What is 38 plus 46?", false),
        ("What is 52 plus 19?", false),
        ("What is 64 plus 27?", false),
        ("What is the capital of Spain?", true),
        ("What is the capital of Italy?", true),
        ("What is the capital of Japan?", true),
        ("What is the capital of Egypt?", true),
    ]
    .iter()
    .map(|(p, ok)| format!("{{\"prompt\": \"{p}\", \"ok\": {ok}}}\n"))
    .collect();
    let config = format!(
        "[prices]\nfiles = [\"prices.toml\"]\n\n[[serve.upstream]]\nname = \"mock\"\nurl = \"{url}\"\nmodel = \"upstream-name\"\nprice = \"mock-price\"\n\n[[serve.route]]\nname = \"auto\"\ntiers = [\"small\", \"mock\"]\nthreshold = -1000.0\nskip_examples = \"skip.jsonl\"\nskip_k = 3\n"
    );
    let prices = "[[model]]\nname = \"mock-price\"\ninput = 1.0\noutput = 2.0\n";
    let server = route_server(prices, &config, ("skip.jsonl", &examples));
    let ask = |content: &str| ask_auto(&server, content);
    let (status, head, body) = ask("What is 33 plus 48?");
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&head, "x-frugal-route"), Some("skip>mock"), "{head}");
    assert!(body.contains("echo: What is 33 plus 48?"), "{body}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the upstream alone answered"
    );
    // Like the capitals: the cheap tier answers (and its threshold accepts anything).
    let (status, head, body) = ask("What is the capital of Peru?");
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&head, "x-frugal-route"), Some("small"), "{head}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        server.metric("frugal_route_requests_total{route=\"auto\",tier=\"skip>mock\"}"),
        1.0
    );
    drop(server);

    // The same examples through a learned router: `frugal route train` writes it, a route
    // names it, and it decides the same way before either tier runs.
    let dir = tempfile::tempdir().unwrap();
    let (from, out) = (
        dir.path().join("skip.jsonl"),
        dir.path().join("router.json"),
    );
    std::fs::write(&from, &examples).unwrap();
    let trained = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(["route", "train", "--from"])
        .arg(&from)
        .arg("--out")
        .arg(&out)
        .arg("--embedder")
        .arg(common::embedder())
        .output()
        .unwrap();
    assert!(trained.status.success(), "{trained:?}");
    let router = std::fs::read_to_string(&out).unwrap();
    let config = config.replace(
        "skip_examples = \"skip.jsonl\"\nskip_k = 3\n",
        "router = \"router.json\"\nskip_below = 0.5\n",
    );
    let server = route_server(prices, &config, ("router.json", &router));
    let ask = |content: &str| ask_auto(&server, content);
    let (_, head, _) = ask("What is 33 plus 48?");
    assert_eq!(header(&head, "x-frugal-route"), Some("skip>mock"), "{head}");
    let (_, head, _) = ask("What is the capital of Peru?");
    assert_eq!(header(&head, "x-frugal-route"), Some("small"), "{head}");
}

/// A server with `config`'s route and its rule's file, the semantic cache off.
fn route_server(prices: &str, config: &str, rule: (&str, &str)) -> Server {
    Server::start_with_files(
        &[("prices.toml", prices), ("frugal.toml", config), rule],
        &["--name", "small", "--no-semantic-cache"],
    )
}

/// Asks the route `auto`.
fn ask_auto(server: &Server, content: &str) -> (u16, String, String) {
    let body = format!(
        r#"{{"model":"auto","messages":[{{"role":"user","content":"{content}"}}],"max_tokens":8,"temperature":0}}"#
    );
    server.request("POST", "/v1/chat/completions", &body)
}

#[test]
fn bad_skip_rules_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |route: &str| {
        let config = dir.path().join("frugal.toml");
        std::fs::write(
            &config,
            format!("[[serve.upstream]]\nname = \"mock\"\nurl = \"http://127.0.0.1:9/v1\"\n\n[[serve.route]]\nname = \"auto\"\nthreshold = -1.0\n{route}"),
        )
        .unwrap();
        common::serve_error(&[
            "--config",
            config.to_str().unwrap(),
            "serve",
            "--no-meter",
            "--name",
            "small",
            "--embedder",
            common::embedder().to_str().unwrap(),
        ])
    };
    let run = |route: &str, examples: &str| {
        std::fs::write(dir.path().join("skip.jsonl"), examples).unwrap();
        refused(&format!("skip_examples = \"skip.jsonl\"\n{route}"))
    };
    let good = "{\"prompt\": \"What is 1 plus 2?\", \"ok\": false}\n";
    let err = run("tiers = [\"small\", \"small\"]\n", good);
    assert!(
        err.contains("a skip rule (skip_examples or router) needs an upstream last tier"),
        "{err}"
    );
    let err = run(
        "tiers = [\"small\", \"mock\"]\nrouter = \"router.json\"\n",
        good,
    );
    assert!(
        err.contains("skip_examples and router are two skip rules"),
        "{err}"
    );
    let err = run("tiers = [\"small\", \"mock\"]\n", "{\"prompt\": 3}\n");
    assert!(err.contains("skip.jsonl line 1: expected"), "{err}");
    let err = run("tiers = [\"small\", \"mock\"]\n", "\n");
    assert!(err.contains("holds no examples"), "{err}");
    let err = run("tiers = [\"small\", \"mock\"]\nskip_below = 2.0\n", good);
    assert!(err.contains("skip_below is a share in [0, 1]"), "{err}");
    // A router file that is not one.
    std::fs::write(dir.path().join("router.json"), "{\"kind\": \"linear\"}").unwrap();
    let err = refused("tiers = [\"small\", \"mock\"]\nrouter = \"router.json\"\n");
    assert!(
        err.contains("cannot read its router") && err.contains("not a router file"),
        "{err}"
    );
}

/// A chat request to `model`.
fn ask_model(model: &str, content: &str) -> String {
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"{content}"}}],"temperature":0}}"#
    )
}

#[test]
fn a_self_hosted_upstream_is_priced_by_the_hour_its_calls_share() {
    let (url, _) = mock_upstream();
    // $3,600 an hour: a second of the machine is a dollar.
    let hosted = format!(
        "[[serve.upstream]]\nname = \"hosted\"\nurl = \"{url}\"\nmodel = \"upstream-name\"\nprice_per_hour = \"3600\"\ntimeout_s = 5\n"
    );
    let server = gateway_with(&url, &hosted);
    let timed = |content: &str| {
        let t = std::time::Instant::now();
        let (status, head, body) = server.request(
            "POST",
            "/v1/chat/completions",
            &ask_model("hosted", content),
        );
        assert_eq!(status, 200, "{body}");
        let cost: f64 = header(&head, "x-frugal-cost-usd").unwrap().parse().unwrap();
        (cost, t.elapsed().as_secs_f64())
    };
    // Alone, a call pays for all the time it held the machine (the mock takes 0.4 s).
    let (alone, wall) = timed("pause alone");
    assert!((0.39..=wall).contains(&alone), "{alone} for {wall} s");
    // Two at once split the time they were in flight together.
    let t = std::time::Instant::now();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| timed("pause one").0);
        let b = s.spawn(|| timed("pause two").0);
        (a.join().unwrap(), b.join().unwrap())
    });
    let both = t.elapsed().as_secs_f64();
    assert!(a >= 0.15 && b >= 0.15, "{a} {b}");
    assert!(
        (0.39..=both + 0.001).contains(&(a + b)),
        "the two calls' shares ({a} + {b}) add up to the time either was in flight, within {both} s"
    );
    // The time no call held the machine is idle capacity in the ledger, at its price.
    let (_, dir) = server.stop();
    let db = rusqlite::Connection::open(dir.path().join("ledger.sqlite")).unwrap();
    let (busy, idle): (i64, i64) = db
        .query_row(
            "SELECT sum(CASE WHEN e.kind = ?1 THEN e.cost END), sum(CASE WHEN e.kind = ?2 THEN e.cost END)
             FROM events e JOIN dims d ON d.id = e.model WHERE d.name = 'hosted'",
            [frugal_cost::Kind::Inference.code(), frugal_cost::Kind::Idle.code()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let busy = busy as f64 / 1e9;
    assert!((busy - (alone + a + b)).abs() < 1e-6, "{busy}");
    assert!(idle > 0, "the machine's idle time is on the bill");
}

#[test]
fn a_gateway_with_no_model_of_its_own_serves_its_upstreams() {
    let (url, calls) = mock_upstream();
    let config = format!(
        "[[serve.upstream]]\nname = \"mock\"\nurl = \"{url}\"\nmodel = \"upstream-name\"\n"
    );
    let server = Server::start_with_files(&[("frugal.toml", &config)], &["--no-model"]);
    let (status, _, models) = server.request("GET", "/v1/models", "");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"].as_array().unwrap().len(), 1, "{models}");
    assert_eq!(models["data"][0]["id"], "mock");
    for _ in 0..2 {
        let (status, _, body) = server.request("POST", "/v1/chat/completions", &chat("hello", ""));
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the second from the cache");
    // There is no local model to fall back on.
    let (status, _, body) = server.request(
        "POST",
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("default"), "{body}");
    let (_, _, metrics) = server.request("GET", "/metrics", "");
    assert!(!metrics.contains("frugal_queue_depth"), "{metrics}");
    assert!(
        metrics.contains("frugal_requests_total{status=\"ok\"} 2"),
        "{metrics}"
    );
    // Nothing to serve, or a cascade with no local tier: refused at start.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("frugal.toml");
    let route =
        "[[serve.route]]\nname = \"auto\"\ntiers = [\"small\", \"mock\"]\nthreshold = -1.0\n";
    for (text, want) in [
        (String::new(), "frugal.toml names none"),
        (
            format!("{config}{route}"),
            "route `auto`: a cascade starts at the local model",
        ),
    ] {
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
            .arg("--config")
            .arg(&path)
            .args(["serve", "--no-meter", "--no-model"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{err}");
    }
}

/// Issue 32: with no price file, an upstream named `gpt-4o-mini` cost $0. It is priced from
/// the hosted models' table frugal ships (LiteLLM's), and a price file still wins.
#[test]
fn a_hosted_model_is_priced_out_of_the_box_and_a_price_file_overrides_it() {
    let (url, _) = mock_upstream();
    let config =
        format!("[[serve.upstream]]\nname = \"mock\"\nurl = \"{url}\"\nmodel = \"gpt-4o-mini\"\n");
    let cost = |files: &[(&str, &str)]| {
        let server = Server::start_with_files(files, &["--no-model"]);
        let (status, head, body) =
            server.request("POST", "/v1/chat/completions", &chat("hello", ""));
        assert_eq!(status, 200, "{body}");
        header(&head, "x-frugal-cost-usd").map(str::to_owned)
    };
    // 10 input tokens at $0.15/M plus 5 output tokens at $0.60/M, LiteLLM's gpt-4o-mini.
    assert_eq!(
        cost(&[("frugal.toml", &config)]).as_deref(),
        Some("0.000004500")
    );
    let priced = format!("[prices]\nfiles = [\"prices.toml\"]\n\n{config}");
    let own = "[[model]]\nname = \"gpt-4o-mini\"\ninput = 1.0\noutput = 2.0\n";
    assert_eq!(
        cost(&[("prices.toml", own), ("frugal.toml", &priced)]).as_deref(),
        Some("0.000020000"),
        "the price file's"
    );
}

#[test]
fn bad_upstream_prices_and_cache_policies_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("frugal.toml");
    let upstream = "[[serve.upstream]]\nname = \"mock\"\nurl = \"http://127.0.0.1:9/v1\"\n";
    let embedder = common::embedder();
    let cases = [
        (
            format!("{upstream}price = \"gpt-4o-mini\"\nprice_per_hour = \"2.0\"\n"),
            "upstream `mock`: price (per token) and price_per_hour or instance (per hour) exclude each other",
        ),
        (
            format!("{upstream}instance = \"no-such-machine\"\n"),
            "no-such-machine",
        ),
        (
            format!("{upstream}semantic_threshold = 1.5\n"),
            "`mock`: semantic_threshold must be a cosine between 0 and 1, not 1.5",
        ),
        (
            "[serve]\nsemantic_entries = 0\n".to_owned(),
            "semantic_entries must be at least 1",
        ),
        (
            format!("{upstream}semantic_max_error = 1.0\n"),
            "`mock`: semantic_max_error must be a share of served hits in [0, 1), such as 0.01, not 1",
        ),
        (
            "[serve]\nsemantic_verifier = \"no-such-verifier.safetensors\"\n".to_owned(),
            "no-such-verifier.safetensors",
        ),
    ];
    for (text, want) in cases {
        std::fs::write(&config, &text).unwrap();
        let err = common::serve_error(&[
            "--config",
            config.to_str().unwrap(),
            "serve",
            "--no-meter",
            "--embedder",
            embedder.to_str().unwrap(),
        ]);
        assert!(err.contains(want), "{text}: {err}");
    }
}

#[test]
fn cache_policies_share_entries_across_tenants_and_set_a_models_error_bound() {
    use frugal_gateway::admit::keys::hash_key;
    let (url, calls) = mock_upstream();
    let extra = format!(
        "[[serve.upstream]]\nname = \"shared\"\nurl = \"{url}\"\nmodel = \"upstream-name\"\nshared_cache = true\nsemantic_max_error = 0.3\n\n[[serve.key]]\ntenant = \"a\"\nsha256 = \"{}\"\n\n[[serve.key]]\ntenant = \"b\"\nsha256 = \"{}\"\n",
        hash_key("key-a"),
        hash_key("key-b"),
    );
    let server = gateway_with(&url, &extra);
    let cache = |key: &str, model: &str, content: &str| {
        let auth = format!("Authorization: Bearer {key}\r\n");
        let (status, head, body) = server.request_with(
            "POST",
            "/v1/chat/completions",
            &ask_model(model, content),
            &auth,
        );
        assert_eq!(status, 200, "{body}");
        header(&head, "x-frugal-cache").unwrap().to_owned()
    };
    let question = "How do I learn to cook?";
    // By default each tenant has its own entries...
    assert_eq!(cache("key-a", "mock", question), "miss");
    assert_eq!(cache("key-b", "mock", question), "miss");
    // ...and a model whose cache is shared answers one tenant from another's call.
    assert_eq!(cache("key-a", "shared", question), "miss");
    assert_eq!(cache("key-b", "shared", question), "hit-exact");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // The same question in other words: under the default error bound (2%) a miss, under
    // the shared model's own looser 30% a semantic hit.
    let other_words = "What is the best way to learn cooking?";
    assert_eq!(cache("key-a", "mock", other_words), "miss");
    assert_eq!(cache("key-b", "shared", other_words), "hit-semantic");
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

/// No secret reaches a log: a run at debug level through every error path (a wrong key, an
/// upstream that fails, times out, answers malformed JSON or drops its stream) logs neither
/// the upstream's API key nor the client's.
#[test]
fn no_secret_in_any_log() {
    use frugal_gateway::admit::keys::hash_key;
    let (url, _) = mock_upstream();
    let config = format!(
        "[prices]\nfiles = [\"prices.toml\"]\n\n[[serve.upstream]]\nname = \"mock\"\nurl = \"{url}\"\nmodel = \"upstream-name\"\nprice = \"mock-price\"\napi_key_env = \"MOCK_KEY\"\ntimeout_s = 1\nretries = 1\n\n[[serve.key]]\ntenant = \"a\"\nsha256 = \"{}\"\n",
        hash_key("fk-client-secret")
    );
    let server = Server::start_env(
        tempfile::tempdir().unwrap(),
        &[
            (
                "prices.toml",
                "[[model]]\nname = \"mock-price\"\ninput = 1.0\noutput = 2.0\n",
            ),
            ("frugal.toml", &config),
        ],
        &["--name", "small"],
        &[("MOCK_KEY", "sk-upstream-secret"), ("FRUGAL_LOG", "debug")],
    );
    let auth = "Authorization: Bearer fk-client-secret\r\n";
    for content in ["hello", "always 500", "bad request", "slow", "malformed"] {
        server.request_with("POST", "/v1/chat/completions", &chat(content, ""), auth);
    }
    server.request_with(
        "POST",
        "/v1/chat/completions",
        &chat("drop mid-stream", r#","stream":true"#),
        auth,
    );
    server.request_with(
        "POST",
        "/v1/chat/completions",
        &chat("hello", ""),
        "Authorization: Bearer fk-wrong-secret\r\n",
    );
    let logs = server.logs();
    assert!(
        logs.contains("upstream"),
        "the error paths were logged: {logs}"
    );
    for secret in ["sk-upstream-secret", "fk-client-secret", "fk-wrong-secret"] {
        assert!(!logs.contains(secret), "{secret} in the logs:\n{logs}");
    }
}

/// `frugal batch run` with no local model: its lines go to the upstream as `frugal serve`
/// would send them; what the upstream garbles or refuses lands in the error file with the
/// reason, what it answers after retries in the output, each line once.
#[test]
fn a_batch_on_an_upstream_answers_what_it_can_and_files_the_rest_with_the_reason() {
    let (url, calls) = mock_upstream();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("prices.toml"),
        "[[model]]\nname = \"mock-price\"\ninput = 1.0\noutput = 2.0\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("frugal.toml"),
        format!(
            "[prices]\nfiles = [\"prices.toml\"]\n\n[[serve.upstream]]\nname = \"mock\"\nurl = \"{url}\"\nmodel = \"upstream-name\"\nprice = \"mock-price\"\ntimeout_s = 1\nretries = 0\n"
        ),
    )
    .unwrap();
    let prompts = [
        "hello",
        "hi",
        "malformed",
        "always 500",
        "bad request",
        "fail twice",
    ];
    let input: String = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "{}\n",
                json!({ "custom_id": format!("l{i}"), "method": "POST", "url": "/v1/chat/completions",
                        "body": { "model": "mock", "messages": [{ "role": "user", "content": p }] } })
            )
        })
        .collect();
    std::fs::write(dir.path().join("in.jsonl"), input).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
        .current_dir(dir.path())
        .args([
            "--config",
            "frugal.toml",
            "--ledger",
            "ledger.sqlite",
            "batch",
            "run",
        ])
        .args([
            "in.jsonl",
            "--output",
            "out.jsonl",
            "--no-model",
            "--max-attempts",
            "3",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    let read = |name: &str| -> HashMap<String, Value> {
        std::fs::read_to_string(dir.path().join(name))
            .unwrap()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (v["custom_id"].as_str().unwrap().to_owned(), v)
            })
            .collect()
    };
    let done = read("out.jsonl");
    let failed = read("out.errors.jsonl");
    let mut ids: Vec<&String> = done.keys().chain(failed.keys()).collect();
    ids.sort();
    assert_eq!(ids, ["l0", "l1", "l2", "l3", "l4", "l5"], "each line once");
    assert_eq!(
        done["l0"]["response"]["body"]["choices"][0]["message"]["content"],
        "echo: hello"
    );
    // Two 503s, then an answer: retried.
    assert!(done.contains_key("l5"), "{failed:?}");
    let failure = |id: &str| {
        let r = &failed[id]["response"];
        (
            r["status_code"].as_u64().unwrap(),
            r["body"]["error"]["message"].to_string(),
        )
    };
    let (status, why) = failure("l2");
    assert_eq!(status, 502);
    assert!(why.contains("malformed JSON"), "{why}");
    let (status, why) = failure("l3");
    assert_eq!(status, 502, "{why}");
    assert!(why.contains("the GPU fell over"), "{why}");
    // The client's mistake is filed at once, not retried.
    let (status, why) = failure("l4");
    assert_eq!(status, 400);
    assert!(why.contains("messages[0] is wrong"), "{why}");
    // hello, hi, bad request once; fail twice three times; malformed and always 500 three
    // tries each.
    assert_eq!(calls.load(Ordering::SeqCst), 3 + 3 + 3 + 3);
}

/// Issue 31: an upstream that answered whole without `usage` was billed $0, while the same
/// answer streamed was estimated. Both are estimated now, alike.
#[test]
fn an_answer_without_usage_is_estimated_alike_streamed_or_whole() {
    let (url, _) = mock_upstream();
    let config = format!(
        "[prices]\nfiles = [\"prices.toml\"]\n\n[[serve.upstream]]\nname = \"mock\"\nurl = \"{url}\"\nmodel = \"upstream-name\"\nprice = \"mock-price\"\ntimeout_s = 5\n"
    );
    let server = Server::start_with_files(
        &[
            (
                "prices.toml",
                "[[model]]\nname = \"mock-price\"\ninput = 1.0\noutput = 2.0\n",
            ),
            ("frugal.toml", &config),
        ],
        &["--no-model", "--no-cache"],
    );
    let question = "no usage for this answer, please";
    let (status, _, body) = server.request("POST", "/v1/chat/completions", &chat(question, ""));
    assert_eq!(status, 200, "{body}");
    let (status, _, sse) = server.request(
        "POST",
        "/v1/chat/completions",
        &chat(question, r#","stream":true"#),
    );
    assert_eq!(status, 200, "{sse}");
    assert_eq!(streamed_text(&sse).0, format!("echo: {question}"));
    let (_, dir) = server.stop();
    let db = rusqlite::Connection::open(dir.path().join("ledger.sqlite")).unwrap();
    let rows: Vec<(i64, i64, i64)> = db
        .prepare(
            "SELECT input_tokens, output_tokens, cost FROM events WHERE requests = 1 ORDER BY id",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    // "user", the question and 8 bytes of framing: 44 bytes, 11 tokens; "echo: " and the
    // question: 38 bytes, 10 tokens. At $1 and $2 per million: $0.000031.
    eprintln!("whole and streamed without usage: {rows:?}");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0], (11, 10, 31_000), "whole");
    assert_eq!(rows[1], rows[0], "streamed: the same text, the same bill");
}

/// Issue 32: `POST /v1/embeddings` was a 404 with an empty body. The official client's
/// embeddings: the local embedder's own vectors, metered, priced and cached; an upstream's
/// passed through at its input price; refusals and unknown routes in OpenAI's error shape.
#[test]
fn embeddings_come_from_the_local_embedder_or_an_upstream_metered_and_cached() {
    let (url, calls) = mock_upstream();
    let server = gateway(&url);
    let script =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_embeddings.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(format!("http://{}/v1", server.addr))
        .output()
        .unwrap();
    let said = common::said(&out);
    assert!(out.status.success(), "{said}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one passed through");
    let got: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    // The vectors are the embedder's own, to the bit, through base64 and floats alike.
    frugal_engine::quant::Kernel::select_from_env().unwrap();
    let embedder = frugal_semantic::Embedder::load(&common::embedder()).unwrap();
    let own = |t: &Value| -> Value { json!(embedder.embed(t.as_str().unwrap()).unwrap()) };
    let as_f32 = |v: &Value| -> Value {
        let v: Vec<f32> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        json!(v)
    };
    let texts = got["texts"].as_array().unwrap();
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(as_f32(&got["listed"][i]), own(t), "{t}");
    }
    assert_eq!(as_f32(&got["float"]), own(&texts[0]));

    let embed = |body: &str| server.request("POST", "/v1/embeddings", body);
    let error =
        |body: &str| -> Value { serde_json::from_str::<Value>(body).unwrap()["error"].clone() };
    // A chat model is not an embedding model, nor the embedder a chat model.
    let (status, _, body) = embed(r#"{"model":"small","input":"x"}"#);
    assert_eq!(status, 400, "{body}");
    assert_eq!(error(&body)["param"], "model", "{body}");
    assert!(body.contains("does not serve embeddings"), "{body}");
    let (status, _, body) = server.request(
        "POST",
        "/v1/chat/completions",
        r#"{"model":"all-MiniLM-L6-v2","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("is an embedding model"), "{body}");
    let (status, _, body) = embed(r#"{"model":"all-MiniLM-L6-v2","input":[[101, 102]]}"#);
    assert_eq!(status, 400, "{body}");
    assert_eq!(error(&body)["param"], "input", "{body}");
    // The upstream's refusal comes back as it said it, and is on record as failed.
    let (status, _, body) = embed(r#"{"model":"mock","input":"bad request"}"#);
    assert_eq!(status, 400, "{body}");
    assert!(
        error(&body)["message"]
            .as_str()
            .unwrap()
            .contains("input[0] is wrong"),
        "{body}"
    );
    // A route frugal does not serve, or a method a route does not take: JSON, not an empty body.
    let (status, _, body) = server.request("POST", "/v1/nothing", "{}");
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        error(&body)["message"],
        "no route for POST /v1/nothing",
        "{body}"
    );
    let (status, _, body) = server.request("GET", "/v1/embeddings", "");
    assert_eq!(status, 405, "{body}");
    assert_eq!(error(&body)["type"], "invalid_request_error", "{body}");

    // One ledger row per request answered or failed, none for one refused before any work.
    let (_, dir) = server.stop();
    let db = rusqlite::Connection::open(dir.path().join("ledger.sqlite")).unwrap();
    let rows = |model: &str| -> (i64, i64, i64, i64) {
        db.query_row(
            "SELECT count(*), coalesce(sum(e.input_tokens), 0), coalesce(sum(e.cost), 0),
                    count(e.outcome)
             FROM events e JOIN dims d ON d.id = e.model WHERE e.kind = 0 AND d.name = ?1",
            [model],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap()
    };
    // Three answered (the third from the cache), at the machine's price of their time.
    let (n, tokens, cost, failed) = rows("all-MiniLM-L6-v2");
    assert_eq!((n, failed), (3, 0));
    assert!(tokens > 8 && cost > 0, "{tokens} tokens, {cost}");
    // The upstream's 6 input tokens at $1/M, and its refusal, estimated from the input.
    let (n, tokens, cost, failed) = rows("mock");
    assert_eq!((n, failed), (2, 1));
    assert_eq!((tokens, cost), (6 + 3, 9_000));
}
