//! Prefix reuse end to end: `frugal serve` with and without its engine's prefix cache, a
//! conversation whose later turns reuse the KV of the turns before. What was reused is said
//! as OpenAI says it (`usage.prompt_tokens_details.cached_tokens`, whole and in a stream's
//! usage chunk), in `x-frugal-cached-tokens`, in /metrics, and as the lever `prefix_cache`
//! in the ledger and the report; pools' replicas follow `[serve] prefix_cache`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use serde_json::{Value, json};

use common::{Server, header, model};

/// A system prompt long enough to fill several KV blocks, as a chat service's is.
const SYSTEM: &str = "You are the help desk of a small library. Answer in one short sentence. \
The library opens at nine in the morning and closes at six in the evening on weekdays, and \
at noon on Saturdays; it is closed on Sundays and public holidays. Members may borrow up to \
five books at a time for three weeks, and renew them twice unless another member has asked \
for them. Late books cost ten cents a day. The reading room is on the first floor, the \
children's corner on the ground floor beside the entrance, and the quiet study rooms on the \
second floor can be booked for two hours at the front desk.";

const QUESTIONS: [&str; 3] = [
    "When do you open on Saturday?",
    "How many books can I borrow?",
    "Where is the reading room?",
];

/// What a served conversation's turns said of their reused prompt tokens.
struct Turns {
    /// The whole turns' `usage.prompt_tokens_details.cached_tokens`, and their
    /// `x-frugal-cached-tokens`.
    whole: Vec<(u64, u64)>,
    /// The streamed last turn's usage chunk's, and its response head.
    streamed: u64,
    stream_head: String,
    /// Each turn's messages (the last turn's included), to ask again.
    messages: Vec<Vec<Value>>,
}

/// Three turns of one conversation, each the last one's prompt, its answer and a new
/// question: the first two answered whole, the third streamed with its usage chunk.
fn converse(server: &Server, pool: Option<&str>) -> Turns {
    let mut messages = vec![json!({ "role": "system", "content": SYSTEM })];
    let mut turns = Turns {
        whole: Vec::new(),
        streamed: 0,
        stream_head: String::new(),
        messages: Vec::new(),
    };
    for (i, q) in QUESTIONS.iter().enumerate() {
        messages.push(json!({ "role": "user", "content": q }));
        turns.messages.push(messages.clone());
        let stream = i == QUESTIONS.len() - 1;
        let mut body = json!({
            "messages": messages,
            "max_tokens": 8,
            "temperature": 0,
        });
        if let Some(pool) = pool {
            body["model"] = json!(pool);
        }
        if stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({ "include_usage": true });
        }
        let (status, head, text) =
            server.request("POST", "/v1/chat/completions", &body.to_string());
        assert_eq!(status, 200, "{text}");
        if stream {
            turns.streamed = cached_tokens(&usage_chunk(&text));
            turns.stream_head = head;
            break;
        }
        let v: Value = serde_json::from_str(&text).unwrap();
        let said = header(&head, "x-frugal-cached-tokens")
            .unwrap_or_else(|| panic!("no x-frugal-cached-tokens: {head}"))
            .parse()
            .unwrap();
        turns.whole.push((cached_tokens(&v), said));
        let answer = v["choices"][0]["message"]["content"].as_str().unwrap();
        messages.push(json!({ "role": "assistant", "content": answer }));
    }
    turns
}

/// `usage.prompt_tokens_details.cached_tokens` of a body or chunk, which must be there.
fn cached_tokens(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage.prompt_tokens_details.cached_tokens: {v}"))
}

/// A stream's usage chunk (`stream_options.include_usage`).
fn usage_chunk(sse: &str) -> Value {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .find(|v| v["usage"].is_object())
        .unwrap_or_else(|| panic!("no usage chunk: {sse}"))
}

fn ledger_levers(dir: &std::path::Path) -> Vec<(i64, i64, i64)> {
    let db = rusqlite::Connection::open(dir.join("ledger.sqlite")).unwrap();
    db.prepare(
        "SELECT cached_tokens, coalesce(lever, -1), saved FROM events
         WHERE requests > 0 OR lever IS NOT NULL ORDER BY id",
    )
    .unwrap()
    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

#[test]
fn a_conversation_reuses_its_earlier_turns_and_every_surface_says_so() {
    let server = Server::start(&["--no-semantic-cache"]);
    let t = converse(&server, None);
    // The first turn found nothing; the next ones reuse at least the system prompt.
    assert_eq!(t.whole[0], (0, 0));
    let (json_2, header_2) = t.whole[1];
    assert!(json_2 > 0, "turn 2 reused nothing");
    assert_eq!(header_2, json_2, "the header says what the body says");
    assert!(
        t.streamed >= json_2,
        "turn 3 reuses at least what turn 2 did"
    );
    // A stream's headers go out before its end: its count is in the usage chunk only.
    assert_eq!(header(&t.stream_head, "x-frugal-cached-tokens"), None);

    assert!(server.metric("frugal_prefix_cache_lookups_total") >= 3.0);
    assert!(server.metric("frugal_prefix_cache_hits_total") >= 2.0);
    let hit_tokens = server.metric("frugal_prefix_cache_hit_tokens_total");
    assert!(hit_tokens >= (json_2 + t.streamed) as f64, "{hit_tokens}");
    assert!(server.metric("frugal_prefix_cache_evictions_total") >= 0.0);
    let (_, _, metrics) = server.request("GET", "/metrics", "");
    for state in ["used", "cached", "free"] {
        let line = format!("frugal_kv_blocks{{state=\"{state}\"}} ");
        assert!(metrics.contains(&line), "{metrics}");
    }
    assert!(metrics.contains("# TYPE frugal_prefix_cache_hits_total counter"));
    let saved = server.saved("prefix_cache");
    assert!(saved > 0.0, "the prefill it spared is saved");

    // Turn 2 asked again: the exact cache answers, which is another lever; the answer
    // reused no prompt and saves no prefill.
    let body = json!({ "messages": t.messages[1], "max_tokens": 8, "temperature": 0 });
    let (status, head, text) = server.request("POST", "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&head, "x-frugal-cache"), Some("hit-exact"), "{head}");
    assert_eq!(header(&head, "x-frugal-cached-tokens"), Some("0"));
    assert_eq!(cached_tokens(&serde_json::from_str(&text).unwrap()), 0);
    assert_eq!(server.saved("prefix_cache"), saved);

    let (_, dir) = server.stop();
    let rows = ledger_levers(dir.path());
    let prefix = frugal_cost::Lever::PrefixCache.code();
    let cache = frugal_cost::Lever::Cache.code();
    // Turns 2 and 3 saved by the prefix cache, once each (a row of its own beside each
    // turn's); the replay by the exact cache.
    let levers: Vec<i64> = rows.iter().map(|r| r.1).collect();
    assert_eq!(
        levers.iter().filter(|l| **l == prefix).count(),
        2,
        "{rows:?}"
    );
    assert_eq!(
        levers.iter().filter(|l| **l == cache).count(),
        1,
        "{rows:?}"
    );
    let cached: i64 = rows.iter().map(|r| r.0).sum();
    assert_eq!(cached as u64, json_2 + t.streamed, "{rows:?}");
    assert!(rows.iter().filter(|r| r.1 == prefix).all(|r| r.2 > 0));
    // The ledger keeps what the metrics counted.
    let in_ledger: i64 = rows.iter().filter(|r| r.1 == prefix).map(|r| r.2).sum();
    let counted = (saved * 1e9).round() as i64;
    assert!((in_ledger - counted).abs() <= 2, "{in_ledger} vs {counted}");
    let report = common::report(dir.path().join("ledger.sqlite"), &[]);
    assert!(report.contains("prefix cache"), "{report}");
}

#[test]
fn without_the_prefix_cache_every_turn_prefills_its_whole_prompt() {
    for (files, flags) in [
        (vec![], vec!["--no-semantic-cache", "--no-prefix-cache"]),
        (
            vec![("frugal.toml", "[serve]\nprefix_cache = false\n")],
            vec!["--no-semantic-cache"],
        ),
    ] {
        let server = Server::start_with_files(&files, &flags);
        let t = converse(&server, None);
        assert_eq!(t.whole, [(0, 0), (0, 0)], "{flags:?}");
        assert_eq!(t.streamed, 0);
        assert_eq!(server.metric("frugal_prefix_cache_hits_total"), 0.0);
        assert_eq!(server.metric("frugal_prefix_cache_hit_tokens_total"), 0.0);
        let (_, dir) = server.stop();
        let rows = ledger_levers(dir.path());
        let prefix = frugal_cost::Lever::PrefixCache.code();
        assert!(rows.iter().all(|r| r.0 == 0 && r.1 != prefix), "{rows:?}");
    }
}

/// A gateway to a `process` pool of `frugal serve` replicas and a `local` one, with
/// `serve` (lines of `[serve]`) in its config.
fn pools(serve: &str) -> Server {
    let config = format!(
        r#"[serve]
{serve}

[[serve.pool]]
name = "proc"
backend = "process"
command = "{bin} serve --model {{model}} --port {{port}} --no-meter --no-cache --price-per-hour 0 --name proc"
model = "{model}"
tick = "100ms"

[[serve.pool]]
name = "local"
backend = "local"
model = "{model}"
tick = "100ms"
"#,
        bin = env!("CARGO_BIN_EXE_frugal"),
        model = model().display(),
    );
    Server::start_with_files(&[("frugal.toml", &config)], &["--no-model", "--no-cache"])
}

#[test]
fn pool_replicas_follow_the_gateways_prefix_cache() {
    let on = pools("");
    for pool in ["proc", "local"] {
        let t = converse(&on, Some(pool));
        assert!(t.whole[1].0 > 0, "{pool}: turn 2 reused nothing");
        assert_eq!(t.whole[1].1, t.whole[1].0, "{pool}");
        assert!(t.streamed > 0, "{pool}");
    }
    drop(on);
    let off = pools("prefix_cache = false");
    for pool in ["proc", "local"] {
        let t = converse(&off, Some(pool));
        assert_eq!(t.whole, [(0, 0), (0, 0)], "{pool}");
        assert_eq!(t.streamed, 0, "{pool}");
    }
}

/// An answer cut at a stop sequence ends before the engine's last event: what its prompt
/// reused is told when it is admitted, so the cut answer still says it.
#[test]
fn an_answer_cut_at_a_stop_sequence_still_says_what_it_reused() {
    let server = Server::start(&["--no-semantic-cache"]);
    let ask = |q: &str, stop: Value| {
        let body = json!({
            "messages": [{ "role": "system", "content": SYSTEM }, { "role": "user", "content": q }],
            "max_tokens": 16,
            "temperature": 0,
            "stop": stop,
        });
        let (status, _, text) = server.request("POST", "/v1/chat/completions", &body.to_string());
        assert_eq!(status, 200, "{text}");
        serde_json::from_str::<Value>(&text).unwrap()
    };
    assert_eq!(cached_tokens(&ask(QUESTIONS[0], Value::Null)), 0);
    let cut = ask(QUESTIONS[1], json!([" ", "."]));
    assert_eq!(cut["choices"][0]["finish_reason"], "stop", "{cut}");
    assert!(
        cached_tokens(&cut) > 0,
        "the system prompt was reused: {cut}"
    );
}
