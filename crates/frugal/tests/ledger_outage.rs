//! End-to-end: `frugal serve --ledger postgres://...` under concurrent load while its
//! PostgreSQL server is killed and started again. Serving goes on (the meter spools to a
//! local file), `/metrics` says so, and after a SIGTERM every answered request is in the
//! ledger exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use common::Server;
use frugal_testkit::upstream::mock_upstream;

/// A metric's value in a `/metrics` text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|v| v.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// Polls `/metrics` until `done` holds of it (at most `patience`).
fn wait_for(addr: &str, what: &str, patience: Duration, done: impl Fn(&str) -> bool) {
    let text = std::cell::RefCell::new(String::new());
    frugal_testkit::wait_until(
        patience,
        || {
            let (_, _, now) = Server::attach(addr).request("GET", "/metrics", "");
            let ok = done(&now);
            text.replace(now);
            ok
        },
        || format!("timed out waiting: {what}\n{}", text.borrow()),
    );
}

/// Until `/metrics` says the ledger is down and rows are in the spool.
fn wait_for_spooling(server: &Server) {
    wait_for(
        &server.addr,
        "the ledger down, rows spooled",
        Duration::from_secs(30),
        |m| {
            metric(m, "frugal_ledger_up") == Some(0.0)
                && metric(m, "frugal_ledger_spooled_events").is_some_and(|n| n > 0.0)
        },
    );
}

/// The gateway's config: a mock upstream, priced, and the spool in its folder.
fn config() -> [(&'static str, String); 2] {
    [
        (
            "frugal.toml",
            format!(
                "[ledger]\nspool = \"outage.spool\"\n\n[prices]\nfiles = [\"prices.toml\"]\n\n[[serve.upstream]]\nname = \"mock\"\nurl = \"{}\"\nmodel = \"upstream-name\"\nprice = \"mock-price\"\n",
                mock_upstream().0
            ),
        ),
        (
            "prices.toml",
            "[[model]]\nname = \"mock-price\"\ninput = 1.0\noutput = 2.0\n".into(),
        ),
    ]
}

/// Inference rows in the ledger, their distinct ids, and the requests they served.
fn in_ledger(url: &str) -> (i64, i64, i64) {
    let mut db = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let row = db
        .query_one(
            "SELECT count(*), count(DISTINCT row_hash), coalesce(sum(requests), 0)::BIGINT
             FROM events WHERE kind = $1",
            &[&frugal_cost::Kind::Inference.code()],
        )
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

fn ask(server: &Server, i: usize) {
    let body =
        json!({ "model": "mock", "messages": [{ "role": "user", "content": format!("q{i}") }] });
    let (status, _, text) = server.request("POST", "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{text}");
}

#[test]
fn a_spool_left_by_a_killed_gateway_is_replayed_at_the_next_start() {
    let mut pg = frugal_testkit::postgres::Server::start().unwrap();
    let url = pg.database().unwrap();
    let files = config();
    let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let extra = ["--no-model", "--no-cache"];
    let server = Server::start_on_ledger_in(tempfile::tempdir().unwrap(), &url, &files, &extra);
    for i in 0..10 {
        ask(&server, i);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while in_ledger(&url) != (10, 10, 10) {
        assert!(Instant::now() < deadline, "the first rows committed");
        std::thread::sleep(Duration::from_millis(50));
    }
    pg.kill().unwrap();
    for i in 10..35 {
        ask(&server, i);
    }
    wait_for_spooling(&server);
    // The rest of the group commits go to the spool within the writer's next rounds.
    std::thread::sleep(Duration::from_secs(1));
    let (_, _, m) = server.request("GET", "/metrics", "");
    let spooled = metric(&m, "frugal_ledger_spooled_events").unwrap();
    let dir = server.kill();
    pg.restart().unwrap();
    assert!(dir.path().join("outage.spool").exists());
    let server = Server::start_on_ledger_in(dir, &url, &files, &extra);
    wait_for(
        &server.addr,
        "the spool replayed",
        Duration::from_secs(30),
        |m| {
            metric(m, "frugal_ledger_spooled_events") == Some(0.0)
                && metric(m, "frugal_ledger_replayed_events_total") == Some(spooled)
        },
    );
    let (status, dir) = server.stop();
    assert!(status.success());
    assert_eq!(in_ledger(&url), (35, 35, 35), "every answered request once");
    let left: i64 = rusqlite::Connection::open(dir.path().join("outage.spool"))
        .unwrap()
        .query_row("SELECT count(*) FROM rows", [], |r| r.get(0))
        .unwrap();
    assert_eq!(left, 0);
}

#[test]
fn postgres_killed_and_restarted_under_load_every_answered_request_is_in_the_ledger_once() {
    let mut pg = frugal_testkit::postgres::Server::start().unwrap();
    let url = pg.database().unwrap();
    let files = config();
    let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let server = Server::start_on_ledger_in(
        tempfile::tempdir().unwrap(),
        &url,
        &files,
        &["--no-model", "--no-cache"],
    );
    let spool = server.dir().join("outage.spool");
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (stop, answered, refused) = (stop.clone(), answered.clone(), refused.clone());
            let client = Server::attach(&server.addr);
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let body = json!({
                        "model": "mock",
                        "messages": [{ "role": "user", "content": format!("client {c} request {i}") }],
                    })
                    .to_string();
                    let (status, _, text) = client.request("POST", "/v1/chat/completions", &body);
                    if status == 200 {
                        answered.fetch_add(1, Ordering::Relaxed);
                    } else {
                        refused.lock().unwrap().push(format!("{status}: {text}"));
                    }
                    i += 1;
                }
            })
        })
        .collect();
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let before = answered.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    pg.kill().unwrap();
    let killed = Instant::now();
    let at_kill = answered.load(Ordering::Relaxed);
    // While PostgreSQL is down, `/metrics` says so and rows pile up in the spool.
    wait_for_spooling(&server);
    std::thread::sleep(Duration::from_secs(1));
    assert!(spool.exists());
    let during = answered.load(Ordering::Relaxed) - at_kill;
    let down_for = killed.elapsed().as_secs_f64();
    assert!(during > 0, "serving goes on while the ledger is down");
    pg.restart().unwrap();
    wait_for(
        &server.addr,
        "the spool replayed",
        Duration::from_secs(60),
        |m| {
            metric(m, "frugal_ledger_up") == Some(1.0)
                && metric(m, "frugal_ledger_spooled_events") == Some(0.0)
                && metric(m, "frugal_ledger_replayed_events_total").is_some_and(|n| n > 0.0)
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let (_, _, metrics) = server.request("GET", "/metrics", "");
    assert_eq!(
        metric(&metrics, "frugal_ledger_lost_events_total"),
        Some(0.0)
    );
    let replayed = metric(&metrics, "frugal_ledger_replayed_events_total").unwrap_or(0.0);
    assert!(
        metrics.contains("frugal_ledger_commit_seconds_count"),
        "{metrics}"
    );
    let logs = server.logs();
    let (status, _dir) = server.stop();
    assert!(status.success(), "{logs}");
    let refused = refused.lock().unwrap();
    assert!(refused.is_empty(), "every request answered: {refused:?}");
    let answered = answered.load(Ordering::Relaxed);
    let (rows, ids, requests) = in_ledger(&url);
    assert_eq!(
        (rows, ids, requests),
        (answered as i64, answered as i64, answered as i64),
        "every answered request once ({during} during the outage)"
    );
    let left: i64 = rusqlite::Connection::open(&spool)
        .unwrap()
        .query_row("SELECT count(*) FROM rows", [], |r| r.get(0))
        .unwrap();
    assert_eq!(left, 0, "the spool is empty");
    assert!(!logs.contains(frugal_testkit::postgres::PASSWORD), "{logs}");
    eprintln!(
        "answered {answered} requests, each once in the ledger; {before:.0} requests/s before the kill, {:.0}/s in the {down_for:.1} s after it; {replayed} rows replayed from the spool",
        during as f64 / down_for
    );
}

/// Thaws a frozen server when dropped.
struct Thaw<'a>(&'a frugal_testkit::postgres::Server);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        let _ = self.0.thaw();
    }
}

/// A chat request's status, or `None` when the connection failed or was cut.
fn post(addr: &str, body: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(120))).ok()?;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    // A status line alone is not an answer: the body must have come whole.
    let (head, rest) = out.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    (status != 200 || rest.trim_end().ends_with('}')).then_some(status)
}

/// The fault suite's frozen ledger: PostgreSQL stopped with SIGSTOP (connections open,
/// nothing answers) under load for `FRUGAL_FREEZE_S` seconds (5 by default; the figures in
/// BENCHMARKS.md use 30), the gateway SIGKILLed while it is still frozen, then PostgreSQL
/// thawed and the gateway started again on its folder. Requests go on being answered
/// through the freeze, `/health` answers, and every answered request is in the ledger.
#[test]
fn postgres_frozen_under_load_holds_no_answer_and_a_sigkill_during_the_freeze_loses_nothing() {
    let freeze_for = Duration::from_secs(
        std::env::var("FRUGAL_FREEZE_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5),
    );
    let pg = frugal_testkit::postgres::Server::start().unwrap();
    let url = pg.database().unwrap();
    let files = config();
    let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let extra = ["--no-model", "--no-cache"];
    let server = Server::start_on_ledger_in(tempfile::tempdir().unwrap(), &url, &files, &extra);
    let stop = Arc::new(AtomicBool::new(false));
    let frozen = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    // Latencies of the requests sent while the ledger was frozen, in microseconds.
    let during = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (stop, frozen, answered, during) =
                (stop.clone(), frozen.clone(), answered.clone(), during.clone());
            let client = Server::attach(&server.addr);
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let body = json!({
                        "model": "mock",
                        "messages": [{ "role": "user", "content": format!("client {c} request {i}") }],
                    })
                    .to_string();
                    let sent = Instant::now();
                    let in_freeze = frozen.load(Ordering::Relaxed);
                    // Cut by the kill: no answer, and no error of the test's.
                    if post(&client.addr, &body) == Some(200) {
                        answered.fetch_add(1, Ordering::Relaxed);
                        if in_freeze {
                            during
                                .lock()
                                .unwrap()
                                .push(sent.elapsed().as_micros() as u64);
                        }
                    }
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    pg.freeze().unwrap();
    // Thawed however the test ends: a frozen server cannot be stopped.
    let thaw = Thaw(&pg);
    frozen.store(true, Ordering::Relaxed);
    std::thread::sleep(freeze_for);
    let (status, _, health) = server.request("GET", "/health", "");
    assert_eq!(
        status, 200,
        "/health answers while the ledger is frozen: {health}"
    );
    let (_, _, metrics) = server.request("GET", "/metrics", "");
    // Killed under load, the ledger still frozen: answers in flight may be cut.
    let dir = server.kill();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    drop(thaw);
    let answered = answered.load(Ordering::Relaxed);
    let mut during = during.lock().unwrap().clone();
    during.sort_unstable();
    assert!(
        during.len() as u64 > freeze_for.as_secs(),
        "serving went on through the freeze: {} answered",
        during.len()
    );
    let p99 = during[(during.len() * 99 / 100).min(during.len() - 1)];
    let server = Server::start_on_ledger_in(dir, &url, &files, &extra);
    wait_for(
        &server.addr,
        "the journal shipped",
        Duration::from_secs(60),
        |m| metric(m, "frugal_ledger_spooled_events") == Some(0.0),
    );
    let (status, _dir) = server.stop();
    assert!(status.success());
    let (rows, ids, requests) = in_ledger(&url);
    assert_eq!(rows, ids, "each row once");
    assert_eq!(rows, requests);
    // Each answered request is in the ledger; at most the 4 cut by the kill are billed
    // without their answer (their upstream calls were made).
    assert!(
        (answered as i64..=answered as i64 + 4).contains(&rows),
        "{rows} rows for {answered} answered requests"
    );
    eprintln!(
        "frozen {} s: {} requests answered during the freeze, p99 {:.1} ms; journal held {} rows at the kill; {answered} answered in all, {rows} in the ledger, {} missing",
        freeze_for.as_secs(),
        during.len(),
        p99 as f64 / 1000.0,
        metric(&metrics, "frugal_ledger_spooled_events").unwrap_or(-1.0),
        (answered as i64 - rows).max(0)
    );
}
