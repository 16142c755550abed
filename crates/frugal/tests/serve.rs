//! End-to-end: `frugal serve` on the default model, over real HTTP on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Server, header, model, streamed_text};

/// `frugal report` on the ledger a stopped server left in `dir`.
fn ledger_report(dir: &tempfile::TempDir, args: &[&str]) -> String {
    common::report(dir.path().join("ledger.sqlite"), args)
}

/// Stops the server cleanly; `frugal report --json` on its ledger, and the ledger's folder.
fn stop_and_report(server: Server) -> (serde_json::Value, tempfile::TempDir) {
    let (status, dir) = server.stop();
    assert!(status.success(), "{status:?}");
    let report = serde_json::from_str(&ledger_report(&dir, &["--json"])).unwrap();
    (report, dir)
}

#[test]
fn the_official_openai_client_works() {
    let server = Server::start(&[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(format!("http://{}/v1", server.addr))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every request went to the ledger, priced at $3.60/h: a millisecond is a micro-dollar.
    let (report, _dir) = stop_and_report(server);
    let line = &report["inference"][0];
    assert_eq!(line["requests"], 4, "{report}");
    assert!(line["cost"].as_i64().unwrap() > 0, "{report}");
}

#[test]
fn greedy_output_is_coherent_and_repeatable_and_costed() {
    // Without the cache, so repeats are the engine's own.
    let server = Server::start(&["--no-cache"]);
    let body = r#"{"messages":[{"role":"user","content":"What is 2 plus 2?"}],"max_tokens":32,"temperature":0}"#;
    let (status, head, text) = server.request("POST", "/v1/chat/completions", body);
    assert_eq!(status, 200, "{text}");
    assert!(head.to_lowercase().contains("x-frugal-cost-usd:"), "{head}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(answer.contains('4'), "{answer}");
    let (_, again) = server.json("/v1/chat/completions", body);
    assert_eq!(
        again["choices"][0]["message"]["content"],
        answer.as_str(),
        "greedy is deterministic"
    );
    let seeded = r#"{"prompt":"Once upon a time","max_tokens":16,"temperature":0.9,"seed":7}"#;
    let (_, a) = server.json("/v1/completions", seeded);
    let (_, b) = server.json("/v1/completions", seeded);
    assert_eq!(
        a["choices"][0]["text"], b["choices"][0]["text"],
        "same seed, same text"
    );
    let stop = r#"{"prompt":"1, 2, 3, 4, 5,","max_tokens":20,"temperature":0,"stop":[" 8"]}"#;
    let (_, s) = server.json("/v1/completions", stop);
    assert_eq!(s["choices"][0]["finish_reason"], "stop", "{s}");
    assert!(
        !s["choices"][0]["text"].as_str().unwrap().contains('8'),
        "{s}"
    );
}

#[test]
fn the_exact_cache_replays_deterministic_answers() {
    let server = Server::start(&[]);
    let body = r#"{"messages":[{"role":"user","content":"Name a color."}],"max_tokens":12,"temperature":0}"#;
    let chat = |body: &str, headers: &str| {
        let (status, head, text) =
            server.request_with("POST", "/v1/chat/completions", body, headers);
        assert_eq!(status, 200, "{text}");
        (head, text)
    };
    let (head, first) = chat(body, "");
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"), "{head}");
    let cost = header(&head, "x-frugal-cost-usd").unwrap().to_owned();
    assert!(cost.parse::<f64>().unwrap() > 0.0, "{head}");
    let answer: serde_json::Value = serde_json::from_str(&first).unwrap();
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();

    // The same request: replayed, free, saving what the first cost.
    let (head, again) = chat(body, "");
    assert_eq!(header(&head, "x-frugal-cache"), Some("hit-exact"), "{head}");
    assert_eq!(header(&head, "x-frugal-cost-usd"), Some("0.000000000"));
    assert_eq!(header(&head, "x-frugal-saved-usd"), Some(cost.as_str()));
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again["choices"][0], answer["choices"][0]);
    for tokens in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(again["usage"][tokens], answer["usage"][tokens]);
    }
    // What each cost, in the body too.
    assert_eq!(again["usage"]["cost_usd"], 0.0);
    assert_eq!(answer["frugal"]["cost_usd"], cost.as_str());
    assert_ne!(again["id"], answer["id"]);

    // Streamed from the cache: the same text, as chunks, with the usage chunk and [DONE].
    let streamed = body.replace(
        r#""temperature":0"#,
        r#""temperature":0,"stream":true,"stream_options":{"include_usage":true}"#,
    );
    let (head, sse) = chat(&streamed, "");
    assert_eq!(header(&head, "x-frugal-cache"), Some("hit-exact"), "{head}");
    assert_eq!(streamed_text(&sse), (content.to_owned(), true));
    assert!(sse.contains(r#""completion_tokens""#), "{sse}");

    // Another max_tokens is another answer; sampling is never cached; no-store and
    // no-cache are honoured.
    let (head, _) = chat(&body.replace("12", "13"), "");
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"));
    let (head, _) = chat(
        &body.replace(r#""temperature":0"#, r#""temperature":0.8"#),
        "",
    );
    assert_eq!(header(&head, "x-frugal-cache"), Some("bypass"));
    let (head, _) = chat(body, "Cache-Control: no-store\r\n");
    assert_eq!(header(&head, "x-frugal-cache"), Some("bypass"));
    let (head, _) = chat(body, "Cache-Control: no-cache\r\n");
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"));

    // A streamed miss fills the cache for a plain request.
    let fresh = r#"{"messages":[{"role":"user","content":"Name a fruit."}],"max_tokens":12,"temperature":0,"stream":true}"#;
    let (head, sse) = chat(fresh, "");
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"));
    let (head, plain) = chat(&fresh.replace(r#","stream":true"#, ""), "");
    assert_eq!(header(&head, "x-frugal-cache"), Some("hit-exact"));
    let plain: serde_json::Value = serde_json::from_str(&plain).unwrap();
    assert_eq!(
        plain["choices"][0]["message"]["content"].as_str().unwrap(),
        streamed_text(&sse).0
    );

    // Identical requests at once: one is answered, the others wait for its answer.
    let bird = r#"{"messages":[{"role":"user","content":"Name a bird."}],"max_tokens":12,"temperature":0}"#;
    let results: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| chat(bird, ""))).collect();
        handles.into_iter().map(|h| h.join().unwrap().0).collect()
    });
    let misses = results
        .iter()
        .filter(|h| header(h, "x-frugal-cache") == Some("miss"))
        .count();
    assert_eq!(misses, 1, "{results:?}");

    // Errors are never cached: the same bad request fails the same way twice.
    for _ in 0..2 {
        let (status, _, _) = server.request(
            "POST",
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"temperature":0,"max_tokens":0}"#,
        );
        assert_eq!(status, 400);
    }
    assert_eq!(
        server.metric("frugal_cache_requests_total{result=\"hit-exact\"}"),
        6.0
    );
    assert!(server.saved("cache") > 0.0);
}

#[test]
fn the_semantic_cache_answers_rewordings_and_guards_meaning() {
    let server = Server::start(&[]);
    let ask = |question: &str, max_tokens: u32| {
        let (head, content) = server.ask(question, max_tokens);
        (
            header(&head, "x-frugal-cache").unwrap().to_owned(),
            head,
            content,
        )
    };
    let (result, _, first) = ask("How can I improve my English speaking skills?", 16);
    assert_eq!(result, "miss");
    // The same question in other words: the first answer, free, saving what it cost.
    let (result, head, again) = ask("How do I improve my English speaking skills?", 16);
    assert_eq!(result, "hit-semantic", "{head}");
    assert_eq!(again, first);
    assert_eq!(header(&head, "x-frugal-cost-usd"), Some("0.000000000"));
    assert!(common::saved_usd(&head) > 0.0, "{head}");
    // Other parameters are another space; another meaning is vetoed or too far.
    assert_eq!(
        ask("How do I improve my English speaking skills?", 17).0,
        "miss"
    );
    let (_, _, _) = ask("How do I convert dollars to rupees?", 16);
    let (result, head, _) = ask("How do I convert rupees to dollars?", 16);
    assert_eq!(result, "miss");
    // The guard says why it turned the near neighbour away.
    assert_eq!(
        header(&head, "x-frugal-semantic-veto"),
        Some("swapped"),
        "{head}"
    );
    assert_eq!(
        ask("How can I improve my French speaking skills?", 16).0,
        "miss"
    );
    assert_eq!(
        server.metric("frugal_semantic_vetoes_total{reason=\"swapped\"}"),
        1.0
    );
    assert_eq!(
        server.metric("frugal_cache_requests_total{result=\"hit-semantic\"}"),
        1.0
    );
    assert_eq!(server.metric("frugal_semantic_search_seconds_count"), 6.0);
    assert!(server.saved("semantic_cache") > 0.0);
    // The verifier's error budget, at its default bound, accounts what it read and served.
    let budget = |name: &str| server.metric(&format!("{name}{{max_error=\"0.02\"}}"));
    assert_eq!(budget("frugal_semantic_max_error"), 0.02);
    assert_eq!(budget("frugal_semantic_budget_hits_total"), 1.0);
    let candidates = budget("frugal_semantic_candidates_total");
    assert!(candidates >= 1.0, "{candidates}");
    let rate =
        server.metric("frugal_semantic_wrong_rate_estimate{max_error=\"0.02\",bound=\"estimate\"}");
    assert!((0.0..=0.02).contains(&rate), "{rate}");
    let model = common::model();
    let name = model.file_stem().unwrap().to_string_lossy();
    let spent = server.metric(&format!("frugal_spend_usd_total{{model=\"{name}\"}}"));
    assert!(spent > 0.0, "{spent}");

    // Off when asked: the rewording is computed again.
    let plain = Server::start(&["--no-semantic-cache"]);
    let body = |q: &str| {
        format!(
            r#"{{"messages":[{{"role":"user","content":"{q}"}}],"max_tokens":8,"temperature":0}}"#
        )
    };
    plain.request(
        "POST",
        "/v1/chat/completions",
        &body("How can I improve my English speaking skills?"),
    );
    let (_, head, _) = plain.request(
        "POST",
        "/v1/chat/completions",
        &body("How do I improve my English speaking skills?"),
    );
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"));
}

#[test]
fn a_missing_embedder_is_a_clear_error() {
    let err = common::serve_error(&[
        "--ledger",
        "/nonexistent/l.sqlite",
        "serve",
        "--no-meter",
        "--embedder",
        "/nonexistent/minilm",
    ]);
    assert!(
        err.contains("no embedding model in /nonexistent/minilm"),
        "{err}"
    );
    assert!(err.contains("--no-semantic-cache"), "{err}");
}

#[test]
fn a_first_run_from_any_folder_finds_the_embedder_in_the_data_folder_or_serves_without_it() {
    let home = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let off = |server: &Server| {
        server
            .stderr()
            .iter()
            .filter(|l| l.contains("the semantic cache is off"))
            .count()
    };
    // No ./models/minilm here and none in ~/.local/share/frugal: it serves, the semantic
    // cache off, and says so once.
    let server = Server::start_elsewhere(cwd.path(), home.path(), &["--no-meter"]);
    assert_eq!(off(&server), 1, "{:?}", server.stderr());
    let line = server.stderr().join("\n");
    assert!(
        line.contains("no embedding model in models/minilm or ")
            && line.contains(".local/share/frugal/models/minilm"),
        "{line}"
    );
    let question = "How can I improve my English speaking skills?";
    let (head, _) = server.ask(question, 8);
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"));
    let (head, _) = server.ask(question, 8);
    assert_eq!(header(&head, "x-frugal-cache"), Some("hit-exact"));
    let (head, _) = server.ask("How do I improve my English speaking skills?", 8);
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"), "{head}");
    drop(server);

    // Fetched into the data folder (`FRUGAL_MODELS=~/.local/share/frugal/models
    // scripts/fetch-models.sh minilm`), it is found from any folder.
    let models = home.path().join(".local/share/frugal/models");
    std::fs::create_dir_all(&models).unwrap();
    std::os::unix::fs::symlink(
        std::fs::canonicalize(common::embedder()).unwrap(),
        models.join("minilm"),
    )
    .unwrap();
    let server = Server::start_elsewhere(cwd.path(), home.path(), &["--no-meter"]);
    assert_eq!(off(&server), 0, "{:?}", server.stderr());
    let (head, _) = server.ask(question, 8);
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"));
    let (head, _) = server.ask("How do I improve my English speaking skills?", 8);
    assert_eq!(
        header(&head, "x-frugal-cache"),
        Some("hit-semantic"),
        "{head}"
    );
}

#[test]
fn bad_requests_get_clear_errors() {
    let server = Server::start(&[]);
    let (status, v) = server.json("/v1/chat/completions", "{not json");
    assert_eq!(status, 400);
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid request body"),
        "{v}"
    );
    let (status, v) = server.json(
        "/v1/chat/completions",
        r#"{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("model_not_found")),
        "{v}"
    );
    let long = "word ".repeat(9000);
    let body = serde_json::json!({"messages":[{"role":"user","content":long}]}).to_string();
    let (status, v) = server.json("/v1/chat/completions", &body);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("8192 tokens"),
        "{v}"
    );
    let (status, v) = server.json(
        "/v1/completions",
        r#"{"prompt":"hi","max_tokens":100000000}"#,
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exceeds the context of 8192"),
        "{v}"
    );
    let (status, v) = server.json("/v1/completions", r#"{"prompt":"hi","temperature":7}"#);
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("temperature")),
        "{v}"
    );
    let (status, _) = server.json("/v1/chat/completions", r#"{"messages":[]}"#);
    assert_eq!(status, 400);
}

/// SIGTERM under load: HTTP drains, then the meter, and every answered request has its row.
#[test]
fn sigterm_under_load_loses_no_answered_request() {
    let server = Server::start(&["--no-cache"]);
    let addr = server.addr.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let (addr, stop) = (addr.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut answered = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let body = format!(
                        r#"{{"prompt":"Client {i} counts: 1, 2,","max_tokens":6,"temperature":0.7}}"#
                    );
                    let Ok(mut s) = TcpStream::connect(&addr) else {
                        break;
                    };
                    let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
                    let sent = write!(
                        s,
                        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let mut out = String::new();
                    if sent.is_err() || s.read_to_string(&mut out).is_err() {
                        break;
                    }
                    if out.starts_with("HTTP/1.1 200") && out.contains("\"finish_reason\"") {
                        answered += 1;
                    }
                }
                answered
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let (status, dir) = server.stop();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(status.success(), "{status:?}");
    assert!(answered > 0);
    let db = rusqlite::Connection::open(dir.path().join("ledger.sqlite")).unwrap();
    let rows: i64 = db
        .query_row(
            "SELECT COALESCE(SUM(requests), 0) FROM events WHERE kind = 0 AND outcome IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        rows >= answered as i64,
        "{answered} answered, {rows} completed requests in the ledger"
    );
}

/// The kernel the engine runs is chosen at start (measured, with a cache in
/// `$XDG_CACHE_HOME/frugal`) and said in the start line and in `/metrics`.
#[test]
fn the_kernel_choice_is_said_at_start_and_in_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let server = Server::start_env(
        dir,
        &[],
        &[],
        &[("XDG_CACHE_HOME", cache.to_str().unwrap())],
    );
    let logs = server.logs();
    let said = logs
        .lines()
        .find(|l| l.contains("on http://"))
        .and_then(|l| l.split_once("; "))
        .map(|(_, rest)| rest.split(" kernels, ").collect::<Vec<_>>())
        .unwrap_or_default();
    let [kernel, rest] = said[..] else {
        panic!("no kernels in the start line: {logs}");
    };
    let (prefetch, rest) = rest.split_once(" prefetch, on ").unwrap();
    let (threads, how) = rest.split_once(" threads, ").unwrap();
    let chosen = if how.starts_with("measured:") {
        "measured"
    } else {
        assert!(how.starts_with("by instruction set"), "{logs}");
        "flags"
    };
    let info = format!(
        "frugal_engine_info{{kernel=\"{kernel}\",prefetch=\"{prefetch}\",threads=\"{threads}\",chosen=\"{chosen}\"}} "
    );
    assert_eq!(server.metric(&info), 1.0, "{info}");
    let file = cache.join("frugal/kernels.json");
    assert_eq!(file.exists(), chosen == "measured", "{}", file.display());
}

#[test]
fn a_client_that_disconnects_frees_its_sequence() {
    let server = Server::start(&[]);
    let body = r#"{"prompt":"Write a long story about a dragon.","max_tokens":2000,"temperature":0.8,"ignore_eos":true,"stream":true}"#;
    let mut s = TcpStream::connect(&server.addr).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 512];
    let n = s.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).contains("200 OK"));
    // The headers may come before the engine has admitted the request.
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.metric("frugal_running_sequences") != 1.0 {
        assert!(Instant::now() < deadline, "the request never ran");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.metric("frugal_running_sequences") != 0.0 {
        assert!(Instant::now() < deadline, "the sequence was not freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(server.metric("frugal_generated_tokens_total") < 2000.0);
}

#[test]
fn overload_is_a_429_with_retry_after() {
    // Without the cache: identical requests would wait for one answer instead of queueing.
    let server = Server::start(&["--max-batch", "1", "--max-queue", "1", "--no-cache"]);
    let body = r#"{"prompt":"Count to one hundred:","max_tokens":300,"temperature":0}"#;
    let addr = server.addr.clone();
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(&addr).unwrap();
                write!(
                    s,
                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).unwrap();
                out
            })
        })
        .collect();
    let answers: Vec<String> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let rejected: Vec<&String> = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 429"))
        .collect();
    assert!(!rejected.is_empty(), "{answers:?}");
    assert!(
        rejected[0].to_lowercase().contains("retry-after: 1"),
        "{}",
        rejected[0]
    );
    assert!(rejected[0].contains("overloaded"), "{}", rejected[0]);
    assert!(answers.iter().any(|a| a.starts_with("HTTP/1.1 200")));
}

#[test]
fn a_corrupt_model_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(model()).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"this is not a model").unwrap();
    for (file, want) in [(&cut, "truncated"), (&junk, "not a GGUF file")] {
        let out = Command::new(env!("CARGO_BIN_EXE_frugal"))
            .args(["serve", "--no-meter", "--port", "0", "--model"])
            .arg(file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn keys_tenants_and_budgets() {
    use frugal_gateway::admit::keys::hash_key;
    let config = format!(
        "[[serve.key]]\ntenant = \"a\"\nsha256 = \"{}\"\n\n[[serve.key]]\ntenant = \"b\"\nsha256 = \"{}\"\n\n[[serve.key]]\ntenant = \"small\"\nsha256 = \"{}\"\ndaily_usd = \"0.000001\"\n",
        hash_key("key-a"),
        hash_key("key-b"),
        hash_key("key-small")
    );
    let server = Server::start_with_files(&[("frugal.toml", &config)], &[]);
    let body =
        r#"{"messages":[{"role":"user","content":"Say hi."}],"max_tokens":8,"temperature":0}"#;
    let call = |key: &str, body: &str| {
        let auth = if key.is_empty() {
            String::new()
        } else {
            format!("Authorization: Bearer {key}\r\n")
        };
        server.request_with("POST", "/v1/chat/completions", body, &auth)
    };
    // No key, a wrong key: 401 in OpenAI's shape, and the key is not echoed.
    for key in ["", "key-wrong"] {
        let (status, _, text) = call(key, body);
        assert_eq!(status, 401, "{text}");
        assert!(
            text.contains("invalid_api_key") && !text.contains("key-wrong"),
            "{text}"
        );
    }
    // The tiny budget's first request holds the engine's recent cost per token, none yet:
    // admitted, it overshoots by itself. Later ones, priced, are refused.
    let sampled = r#"{"messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":8,"temperature":0.9}"#;
    assert_eq!(call("key-small", sampled).0, 200);
    // Each tenant has its own cache entries.
    let cache = |key: &str| {
        let (status, head, text) = call(key, body);
        assert_eq!(status, 200, "{text}");
        header(&head, "x-frugal-cache").unwrap().to_owned()
    };
    assert_eq!(cache("key-a"), "miss");
    assert_eq!(cache("key-a"), "hit-exact");
    assert_eq!(cache("key-b"), "miss", "tenant b must not get a's answer");

    // A budget under concurrent load: 4 clients, 3 requests each (sampled, so uncached).
    // Spent, or too little left for a request's worst case: every one is refused.
    let outcomes: Vec<(u16, String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    (0..3)
                        .map(|_| call("key-small", sampled))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let ok = outcomes.iter().filter(|o| o.0 == 200).count();
    assert_eq!(ok, 0, "overshoot beyond the first request");
    for (status, head, text) in outcomes.iter().filter(|o| o.0 != 200) {
        assert_eq!(*status, 429, "{text}");
        assert!(
            text.contains("daily budget of `small`") && text.contains("budget_exceeded"),
            "{text}"
        );
        let retry: u64 = header(head, "retry-after").unwrap().parse().unwrap();
        assert!(retry > 1, "{head}");
    }
    assert!(outcomes.len() - ok >= 8);
    // Other tenants are unaffected.
    assert_eq!(call("key-a", sampled).0, 200);

    // A restart does not hand the budget out again: the ledger remembers what was spent.
    let (_, dir) = server.stop();
    let server = Server::start_in(dir, &[("frugal.toml", &config)], &[]);
    let auth = |key: &str| format!("Authorization: Bearer {key}\r\n");
    let (status, _, text) =
        server.request_with("POST", "/v1/chat/completions", sampled, &auth("key-small"));
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("daily budget of `small`"), "{text}");
    let (status, _, _) =
        server.request_with("POST", "/v1/chat/completions", sampled, &auth("key-a"));
    assert_eq!(status, 200);
}

#[test]
fn bench_replays_a_workload_and_counts_the_cache_answers_and_the_metered_cost() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let workload = dir.path().join("w.jsonl");
    std::fs::write(
        &workload,
        concat!(
            "{\"at\": 0.0, \"prompt\": \"What is the capital of France?\", \"max_tokens\": 8}\n",
            "{\"at\": 0.2, \"prompt\": \"Name a primary colour.\", \"max_tokens\": 8}\n",
            "{\"at\": 3.0, \"prompt\": \"What is the capital of France?\", \"max_tokens\": 8}\n",
        ),
    )
    .unwrap();
    let s = bench(&server, &["--workload", workload.to_str().unwrap()]);
    assert_eq!(
        (s["requests"].as_u64(), s["errors"].as_u64()),
        (Some(3), Some(0)),
        "{s}"
    );
    assert_eq!(s["cache"]["miss"], 2, "{s}");
    assert_eq!(
        s["cache"]["hit-exact"], 1,
        "the repeat is answered from the cache: {s}"
    );
    assert!(s["output_tokens"].as_u64().unwrap() > 0, "{s}");
    // Priced at $3.60/h, the two answers the engine computed cost something; the hit nothing.
    assert!(s["metered_cost"].as_i64().unwrap() > 0, "{s}");
    assert!(s["metered_per_1k_requests"].as_i64().unwrap() > 0, "{s}");
}

#[test]
fn batching_savings_reach_the_metrics_and_the_report() {
    let server = Server::start(&["--no-cache"]);
    // One request alone, then eight at once: only the second group shares steps.
    let (status, _) = server.json(
        "/v1/completions",
        r#"{"prompt":"Once upon a time","max_tokens":12,"temperature":0}"#,
    );
    assert_eq!(status, 200);
    let alone = server.saved("batching");
    assert_eq!(
        alone, 0.0,
        "a request served alone saved nothing by batching"
    );
    let args = "--concurrency 8 --requests 8 --max-tokens 24 --distinct";
    let s = bench(&server, &args.split(' ').collect::<Vec<_>>());
    assert_eq!(s["errors"], 0, "{s}");
    let batched = server.saved("batching");
    assert!(batched > 0.0, "eight streams at once shared their steps");
    let (report, dir) = stop_and_report(server);
    let line = &report["inference"][0];
    assert_eq!(line["requests"], 9, "{report}");
    let saved = line["saved"]["batching"].as_i64().unwrap();
    // The ledger keeps what the metrics counted.
    let counted = (batched * 1e9).round() as i64;
    assert!(
        saved > 0 && (saved - counted).abs() <= 1,
        "{saved} vs {counted}: {report}"
    );
    let text = ledger_report(&dir, &[]);
    assert!(
        text.contains("Saved by the levers") && text.contains("batching"),
        "{text}"
    );
}

#[test]
fn bench_replays_conversations_turn_by_turn_with_the_servers_answers() {
    let server = Server::start(&["--no-cache"]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("c.jsonl");
    // ShareGPT lines: the data's own answers ("gpt") are never sent, the server's are.
    let users: [&[&str]; 3] = [
        &[
            "Name a colour.",
            "Why that one?",
            "Name a fruit of that colour.",
        ],
        &[
            "What is 2 + 2?",
            "And 3 + 3?",
            "Add them up.",
            "One more turn than --turns.",
        ],
        &["Say hello in French."],
    ];
    let mut text = String::new();
    for (i, turns) in users.iter().enumerate() {
        let messages: Vec<_> = turns
            .iter()
            .flat_map(|u| {
                [
                    serde_json::json!({ "from": "human", "value": u }),
                    serde_json::json!({ "from": "gpt", "value": "the data's answer" }),
                ]
            })
            .collect();
        text +=
            &serde_json::json!({ "id": format!("c{i}"), "conversations": messages }).to_string();
        text.push('\n');
    }
    std::fs::write(&data, text).unwrap();
    let replay = |in_flight: &str, name: &str| {
        let transcript = dir.path().join(name);
        let s = bench(
            &server,
            &[
                "--conversations",
                data.to_str().unwrap(),
                "--turns",
                "3",
                "--max-tokens",
                "6",
                "--concurrency",
                in_flight,
                "--price-per-hour",
                "3.6",
                "--transcript",
                transcript.to_str().unwrap(),
            ],
        );
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&transcript)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (s, lines)
    };
    for (in_flight, name) in [("3", "together.jsonl"), ("1", "alone.jsonl")] {
        let (s, transcripts) = replay(in_flight, name);
        // 3 + 3 (of 4, capped by --turns) + 1 turns; all but the 3 first turns are later ones.
        assert_eq!(
            (s["conversations"].as_u64(), s["requests"].as_u64()),
            (Some(3), Some(7)),
            "{s}"
        );
        assert_eq!(
            (s["errors"].as_u64(), s["later_turns"].as_u64()),
            (Some(0), Some(4)),
            "{s}"
        );
        // The figures add up: computed and cached make the prompt, turn by turn and in all.
        let turns: Vec<&serde_json::Value> = transcripts
            .iter()
            .flat_map(|t| t["turns"].as_array().unwrap())
            .collect();
        let sum = |k: &str| {
            turns
                .iter()
                .map(|t| t[k].as_u64().unwrap_or(0))
                .sum::<u64>()
        };
        assert_eq!(
            s["prompt_tokens"].as_u64(),
            Some(sum("prompt_tokens")),
            "{s}"
        );
        assert_eq!(
            s["output_tokens"].as_u64(),
            Some(sum("output_tokens")),
            "{s}"
        );
        assert_eq!(
            sum("prefill_tokens") + sum("cached_tokens"),
            sum("prompt_tokens"),
            "{s}"
        );
        assert_eq!(
            s["prefill_tokens"].as_u64().unwrap() + s["cached_tokens"].as_u64().unwrap(),
            s["prompt_tokens"].as_u64().unwrap(),
            "{s}"
        );
        assert!(s["first_turn_ttft"]["p50"].as_f64().unwrap() > 0.0, "{s}");
        assert!(s["later_turn_ttft"]["p50"].as_f64().unwrap() > 0.0, "{s}");
        // $3.60/h is $0.001 a second: priced by the wall time.
        let cost = s["cost"].as_i64().unwrap();
        let expected = (s["wall_s"].as_f64().unwrap() * 1e6) as i64;
        assert!(
            (cost - expected).abs() <= 1_000,
            "{cost} vs {expected}: {s}"
        );
        for (t, turns) in transcripts.iter().zip(users) {
            // The user messages in the data's order, each after the server's answer.
            let messages = t["messages"].as_array().unwrap();
            let sent = turns.len().min(3);
            assert_eq!(messages.len(), 2 * sent, "{t}");
            for (k, m) in messages.iter().enumerate() {
                if k % 2 == 0 {
                    assert_eq!(m["role"], "user", "{t}");
                    assert_eq!(m["content"], turns[k / 2], "{t}");
                } else {
                    assert_eq!(m["role"], "assistant", "{t}");
                    assert_ne!(m["content"], "the data's answer", "{t}");
                    assert!(!m["content"].as_str().unwrap().is_empty(), "{t}");
                }
            }
            if in_flight != "1" {
                continue;
            }
            // Alone, each turn is the server's deterministic answer to exactly that prompt:
            // asked again, it counts the same prompt tokens and gives the same answer.
            for (k, turn) in t["turns"].as_array().unwrap().iter().enumerate() {
                let body = serde_json::json!({
                    "messages": &messages[..2 * k + 1],
                    "max_tokens": 6,
                    "temperature": 0,
                });
                let (status, v) = server.json("/v1/chat/completions", &body.to_string());
                assert_eq!(status, 200, "{v}");
                assert_eq!(v["usage"]["prompt_tokens"], turn["prompt_tokens"], "{t}");
                assert_eq!(
                    v["choices"][0]["message"]["content"],
                    messages[2 * k + 1]["content"],
                    "{t}"
                );
            }
        }
    }
}

/// `frugal bench --json` against the server, with `args`: its summary.
fn bench(server: &Server, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args([
            "bench",
            "--json",
            "--url",
            &format!("http://{}/v1", server.addr),
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn requests_are_metered_into_a_postgresql_ledger() {
    let url = frugal_testkit::postgres::database();
    let server = Server::start_on_ledger(&url, &["--no-cache"]);
    let body = r#"{"messages":[{"role":"user","content":"Say hi."}],"max_tokens":4}"#;
    for _ in 0..3 {
        let (status, _, text) = server.request("POST", "/v1/chat/completions", body);
        assert_eq!(status, 200, "{text}");
    }
    let (status, _) = server.stop();
    assert!(status.success());
    let report: serde_json::Value =
        serde_json::from_str(&common::report(Path::new(&url), &["--json"])).unwrap();
    let line = &report["inference"][0];
    assert_eq!(line["requests"], 3, "{report}");
    assert!(line["cost"].as_i64().unwrap() > 0, "{report}");
    let ledger = frugal_cost::Ledger::open(frugal_cost::Location::parse(&url)).unwrap();
    let mut rows = 0;
    ledger
        .scan(frugal_cost::Window::default(), |r| {
            rows += u64::from(r.kind == frugal_cost::Kind::Inference) * r.requests
        })
        .unwrap();
    assert_eq!(rows, 3, "every answered request once");
}

/// Issue 32: `serve --quant q4_0` served and billed the Q4_1 file under the file's name, and
/// the report's "Quality kept" put a FAILED Q4_0 evaluation against the model served as
/// stored. A re-quantized model is listed, answered and billed as `<file>+q4_0` (the file's
/// name still reaches it), and an evaluation is shown against the way it was run alone.
#[test]
fn a_requantized_model_is_named_for_what_runs_and_its_quality_matched_to_it() {
    use frugal_engine::eval::quality::{FileId, Record, append};
    let home = tempfile::tempdir().unwrap();
    let xdg = home.path().to_str().unwrap();
    let failed = Record {
        at: "2026-12-05T00:00:00Z".into(),
        kind: "ppl".into(),
        model: FileId::of(&model()).unwrap(),
        quant: Some("Q4_0".into()),
        kv: None,
        reference: None,
        data: "held-out.txt".into(),
        summary: "PPL +31% of the reference's".into(),
        gate: Some(false),
        figures: serde_json::json!({}),
    };
    append(&home.path().join("frugal/evals.jsonl"), &failed).unwrap();
    let stem = model().file_stem().unwrap().to_str().unwrap().to_owned();
    let quant = format!("{stem}+q4_0");
    let quality = |dir: &tempfile::TempDir| -> String {
        common::report_with_data_home(dir.path().join("ledger.sqlite"), xdg, &[])
            .split("Quality kept")
            .nth(1)
            .unwrap_or_default()
            .to_owned()
    };
    let env = [("XDG_DATA_HOME", xdg)];

    // As stored: the Q4_0 evaluation is not this model's.
    let stored = Server::start_env(tempfile::tempdir().unwrap(), &[], &["--no-cache"], &env);
    stored.ask("Say hi.", 2);
    let (_, dir) = stored.stop();
    assert_eq!(quality(&dir), "", "nothing measured the file as stored");

    // Re-quantized, into the same ledger: named so, and reached by the file's name too.
    let server = Server::start_env(dir, &[], &["--no-cache", "--quant", "q4_0"], &env);
    let (_, _, models) = server.request("GET", "/v1/models", "");
    let models: serde_json::Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], quant.as_str(), "{models}");
    for named in [None, Some(&stem), Some(&quant)] {
        let mut body = serde_json::json!({
            "messages": [{ "role": "user", "content": "Say hi." }],
            "max_tokens": 2,
        });
        if let Some(m) = named {
            body["model"] = serde_json::json!(m);
        }
        let (status, v) = server.json("/v1/chat/completions", &body.to_string());
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["model"], quant.as_str(), "{v}");
    }
    let (_, dir) = server.stop();
    let db = rusqlite::Connection::open(dir.path().join("ledger.sqlite")).unwrap();
    // Requests' rows (a prefix cache's saving has a row of its own, serving none).
    let billed: Vec<(String, i64)> = db
        .prepare(
            "SELECT d.name, count(*) FROM events e JOIN dims d ON d.id = e.model
             WHERE e.kind = 0 AND e.requests > 0 GROUP BY d.name ORDER BY d.name",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(billed, [(stem.clone(), 1), (quant.clone(), 3)]);
    let table = quality(&dir);
    let rows: Vec<&str> = table.lines().filter(|l| l.contains("FAILED")).collect();
    assert_eq!(rows.len(), 1, "{table}");
    assert!(
        rows[0].contains(&quant) && rows[0].contains("Q4_0"),
        "{table}"
    );
}
