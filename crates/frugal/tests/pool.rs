//! Pools end to end: `frugal serve --no-model` as a gateway to pools of real replicas
//! (`frugal serve` processes, engines in process, an external server), driven over HTTP,
//! with replicas killed by signals and bad commands that crash, hang or do not exist.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Server, header, model};

/// A `process` pool of `frugal serve` replicas of the test model, with `extra` settings
/// (TOML lines) and fast windows so that a test runs in seconds.
fn process_pool(name: &str, extra: &str) -> String {
    format!(
        r#"
[[serve.pool]]
name = "{name}"
backend = "process"
command = "{bin} serve --model {{model}} --port {{port}} --no-meter --no-cache --price-per-hour 0 --name {name}"
model = "{model}"
price_per_hour = "3.6"
tick = "100ms"
{extra}
"#,
        bin = env!("CARGO_BIN_EXE_frugal"),
        model = model().display(),
    )
}

fn gateway(config: &str) -> Server {
    Server::start_with_files(&[("frugal.toml", config)], &["--no-model", "--no-cache"])
}

fn status(server: &Server, pool: &str) -> serde_json::Value {
    let (code, _, body) = server.request("GET", &format!("/v1/pools/{pool}/scale"), "");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Polls the pool until `ok` holds, or fails after `within`.
fn wait_for(
    server: &Server,
    pool: &str,
    within: Duration,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let last = std::cell::RefCell::new(serde_json::Value::Null);
    frugal_testkit::wait_until(
        within,
        || {
            let s = status(server, pool);
            let done = ok(&s);
            last.replace(s);
            done
        },
        || format!("pool never got there: {}", last.borrow()),
    );
    last.into_inner()
}

fn chat(pool: &str, question: &str, max_tokens: u32) -> String {
    serde_json::json!({
        "model": pool,
        "messages": [{ "role": "user", "content": question }],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
    .to_string()
}

/// The gateway's child processes (its replicas), from /proc: their parent is the gateway.
fn children(server: &Server) -> Vec<String> {
    let parent = server.pid().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid = e.ok()?.file_name().into_string().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // pid (comm) state ppid ...: comm may hold spaces, so read after its ')'.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

fn ledger(dir: &tempfile::TempDir) -> rusqlite::Connection {
    rusqlite::Connection::open(dir.path().join("ledger.sqlite")).unwrap()
}

fn query(db: &rusqlite::Connection, sql: &str) -> i64 {
    db.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn a_request_at_zero_is_held_until_a_replica_is_ready_and_an_idle_pool_goes_back_to_zero() {
    let server = gateway(&process_pool(
        "p",
        "max_replicas = 2\ntarget_in_flight = 2\nscale_to_zero_after = \"1s\"\nstable_window = \"2s\"\npanic_window = \"1s\"",
    ));
    let s = status(&server, "p");
    assert_eq!(
        (s["ready"].as_u64(), s["starting"].as_u64()),
        (Some(0), Some(0)),
        "{s}"
    );
    // Held, not refused: the first answer waits out the cold start.
    let started = Instant::now();
    let (code, head, body) =
        server.request("POST", "/v1/chat/completions", &chat("p", "Say hello.", 8));
    assert_eq!(code, 200, "{body}");
    let cold = started.elapsed();
    let cost: f64 = header(&head, "x-frugal-cost-usd").unwrap().parse().unwrap();
    assert!(cost > 0.0, "{head}");
    let s = status(&server, "p");
    assert_eq!(
        (s["ready"].as_u64(), s["cold_starts"].as_u64()),
        (Some(1), Some(1)),
        "{s}"
    );
    let (_, _, metrics) = server.request("GET", "/metrics", "");
    assert!(
        metrics.contains("frugal_pool_replicas{pool=\"p\",state=\"ready\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("frugal_pool_cold_starts_total{pool=\"p\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("frugal_pool_cold_start_seconds_count{pool=\"p\"} 1"),
        "{metrics}"
    );
    // A warm replica answers without the wait.
    let warm = Instant::now();
    let (code, _, _) = server.request("POST", "/v1/chat/completions", &chat("p", "Say bye.", 8));
    assert_eq!(code, 200);
    assert!(
        warm.elapsed() < cold,
        "warm {:?} against cold {cold:?}",
        warm.elapsed()
    );
    // Idle past the grace and the stable window: back to zero, the process gone.
    wait_for(&server, "p", Duration::from_secs(15), |s| {
        s["ready"] == 0 && s["draining"] == 0 && s["desired_replicas"] == 0
    });
    let (exit, dir) = server.stop();
    assert!(exit.success());
    let db = ledger(&dir);
    // Both answers, the first held for the cold start.
    let answered = query(
        &db,
        "SELECT COUNT(*) FROM events e JOIN dims d ON d.id = e.model WHERE d.name = 'p' AND e.kind = 0 AND e.outcome IS NULL",
    );
    assert_eq!(answered, 2);
    let waited = query(&db, "SELECT MAX(wait_ms) FROM events WHERE kind = 0");
    assert!(waited > 0, "the first request's cold start is on record");
    // The replica's life, start to stop, at its price: starting, ready and draining spans,
    // whose unbilled part is idle capacity.
    let states = query(&db, "SELECT COUNT(DISTINCT state) FROM replica_spans");
    assert_eq!(states, 3);
    let idle = query(&db, "SELECT COUNT(*) FROM events WHERE kind = 2");
    assert!(idle > 0);
    // Every span's cost is its duration at $3.60/h: 1,000 nano-dollars a millisecond
    // (priced to the microsecond, so within one millisecond's worth of it).
    let off = query(
        &db,
        "SELECT COUNT(*) FROM replica_spans WHERE ABS(cost - duration_ms * 1000) >= 1000",
    );
    assert_eq!(off, 0);
    // Requests and idle time together are the replicas' time, to the milliseconds' rounding.
    let spans = query(&db, "SELECT SUM(cost) FROM replica_spans");
    let paid = query(
        &db,
        "SELECT SUM(cost) FROM events e JOIN dims d ON d.id = e.model WHERE d.name = 'p'",
    );
    assert!(
        (spans - paid).abs() < 10_000,
        "spans {spans} against requests and idle {paid}"
    );
}

#[test]
fn a_burst_scales_up_at_the_first_tick_and_scale_down_drains_without_cutting_a_request() {
    let server = gateway(&process_pool(
        "p",
        "max_replicas = 3\ntarget_in_flight = 1\nmax_in_flight = 4\nstable_window = \"2s\"\npanic_window = \"1s\"\nscale_to_zero_after = \"1m\"\nmin_replicas = 1",
    ));
    wait_for(&server, "p", Duration::from_secs(30), |s| s["ready"] == 1);
    let addr = server.addr.clone();
    let burst: Vec<_> = (0..6)
        .map(|i| {
            let body = chat("p", &format!("Count from {i} to 40."), 48);
            let server = Server::attach(&addr);
            std::thread::spawn(move || server.request("POST", "/v1/chat/completions", &body).0)
        })
        .collect();
    // Six in flight at a target of one: the first tick's sample (ticks are 100 ms) is over
    // 200% of capacity, and the pool is sized to it at once (a second allows for a busy CI).
    let s = wait_for(&server, "p", Duration::from_secs(1), |s| {
        s["desired_replicas"] == 3
    });
    assert!(s["demand"].as_u64().unwrap() >= 3, "{s}");
    for b in burst {
        assert_eq!(b.join().unwrap(), 200);
    }
    wait_for(&server, "p", Duration::from_secs(30), |s| {
        s["ready"] == 3 || s["draining"].as_u64() > Some(0)
    });
    // While the pool shrinks back to one replica, a client asks one question after another
    // (demand one, the target): every one is answered, none cut by a drain.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..1)
        .map(|i| {
            let server = Server::attach(&addr);
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut codes = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let body = chat("p", &format!("Client {i}: name a colour."), 24);
                    codes.push(server.request("POST", "/v1/chat/completions", &body).0);
                }
                codes
            })
        })
        .collect();
    wait_for(&server, "p", Duration::from_secs(30), |s| {
        s["ready"] == 1 && s["draining"] == 0 && s["starting"] == 0
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let codes: Vec<u16> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    assert!(
        !codes.is_empty() && codes.iter().all(|&c| c == 200),
        "{codes:?}"
    );
    let replicas = children(&server);
    assert!(!replicas.is_empty());
    let (exit, dir) = server.stop();
    assert!(exit.success());
    // Stopping the gateway stopped its replicas.
    for pid in replicas {
        let alive = std::process::Command::new("kill")
            .args(["-0", &pid])
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(!alive.success(), "replica {pid} outlived the gateway");
    }
    let drained = query(
        &ledger(&dir),
        "SELECT COUNT(*) FROM replica_spans WHERE state = 2",
    );
    assert!(drained >= 2, "two replicas drained on the way down");
}

#[test]
fn a_replica_killed_under_load_is_replaced_and_every_request_gets_an_answer() {
    let server = gateway(&process_pool(
        "p",
        "min_replicas = 2\nmax_replicas = 2\ntarget_in_flight = 4",
    ));
    wait_for(&server, "p", Duration::from_secs(30), |s| s["ready"] == 2);
    let addr = server.addr.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let server = Server::attach(&addr);
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let body = chat("p", &format!("Client {i}: count to twenty."), 32);
                    let (code, _, body) = server.request("POST", "/v1/chat/completions", &body);
                    out.push((code, body));
                }
                out
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let victim = children(&server).pop().expect("a replica process");
    std::process::Command::new("kill")
        .args(["-9", &victim])
        .status()
        .unwrap();
    // The pool notices, replaces the replica, and serves on.
    wait_for(&server, "p", Duration::from_secs(5), |s| {
        s["ready"].as_u64() < Some(2)
    });
    wait_for(&server, "p", Duration::from_secs(30), |s| s["ready"] == 2);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers: Vec<(u16, String)> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let ok = answers.iter().filter(|(c, _)| *c == 200).count() as i64;
    for (code, body) in &answers {
        // An answer, or an error that says what happened.
        assert!(
            *code == 200 || (*code >= 500 && body.contains("\"message\"")),
            "{code}: {body}"
        );
    }
    let (_, dir) = server.stop();
    let db = ledger(&dir);
    let recorded = query(
        &db,
        "SELECT COALESCE(SUM(requests), 0) FROM events WHERE kind = 0 AND outcome IS NULL",
    );
    assert!(recorded >= ok, "{ok} answered, {recorded} in the ledger");
    let s = query(&db, "SELECT COUNT(DISTINCT replica) FROM replica_spans");
    assert!(s >= 3, "the killed replica was replaced");
}

/// Issue 31, item 12: replicas are in process groups of their own, so a gateway killed
/// with SIGKILL (which runs no Drop) left them serving, holding their memory and ports.
#[test]
fn replicas_do_not_outlive_a_gateway_killed_with_sigkill() {
    let server = gateway(&process_pool("p", "min_replicas = 2\nmax_replicas = 2"));
    wait_for(&server, "p", Duration::from_secs(120), |s| {
        s["ready"].as_u64() == Some(2)
    });
    let replicas = children(&server);
    assert_eq!(replicas.len(), 2, "{replicas:?}");
    let _dir = server.kill();
    // Gone, or a zombie waiting for init to reap it.
    let alive = |pid: &String| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let state = stat
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .next()?
                    .to_owned();
                (state != "Z").then_some(())
            })
            .is_some()
    };
    frugal_testkit::wait_until(
        Duration::from_secs(10),
        || !replicas.iter().any(alive),
        || {
            let left: Vec<_> = replicas.iter().filter(|p| alive(p)).collect();
            format!("replicas outlived the gateway: {left:?}")
        },
    );
}

#[test]
fn crash_loops_back_off_and_starts_that_hang_or_cannot_run_are_clear_503s() {
    let hang = "python3 -c \"import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(60)\" {port}";
    let config = format!(
        r#"
[[serve.pool]]
name = "crash"
backend = "process"
command = "sh -c 'exit 3' sh {{port}}"
tick = "100ms"

[[serve.pool]]
name = "hang"
backend = "process"
command = "{hang}"
cold_start_timeout = "1s"
tick = "100ms"

[[serve.pool]]
name = "missing"
backend = "process"
command = "/nonexistent/llama-server --port {{port}}"
tick = "100ms"
"#,
        hang = hang.replace('"', "\\\"")
    );
    let server = gateway(&config);
    let (code, head, body) =
        server.request("POST", "/v1/chat/completions", &chat("crash", "Hi", 4));
    assert_eq!(code, 503, "{body}");
    assert!(header(&head, "retry-after").is_some(), "{head}");
    assert!(
        body.contains("exited before it was ready") && body.contains("crash-"),
        "{body}"
    );
    let started = Instant::now();
    let (code, _, body) = server.request("POST", "/v1/chat/completions", &chat("hang", "Hi", 4));
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("cold_start_timeout"), "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the hung probe is bounded"
    );
    let (code, _, body) = server.request("POST", "/v1/chat/completions", &chat("missing", "Hi", 4));
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("cannot start `/nonexistent/llama-server`"),
        "{body}"
    );
    // A crash loop backs off (1 s, 2 s, 4 s...): a handful of starts in three seconds, not
    // a fork storm.
    std::thread::sleep(Duration::from_secs(3));
    let logs = std::fs::read_dir(server.dir().join("frugal-pools"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("crash-")
        })
        .count();
    assert!((1..=4).contains(&logs), "{logs} starts");
    // The gateway itself stays up and says why.
    let s = status(&server, "crash");
    assert!(
        s["last_error"].as_str().unwrap().contains("exit status: 3"),
        "{s}"
    );
}

#[test]
fn bad_pool_settings_are_refused_before_serving() {
    for (entry, says) in [
        (
            "backend = \"process\"\ncommand = \"llama-server -m x\"",
            "must contain {port}",
        ),
        (
            "backend = \"process\"\ncommand = \"x {port}\"\nmin_replicas = 3\nmax_replicas = 2",
            "max_replicas (2) is below min_replicas (3)",
        ),
        (
            "backend = \"process\"\ncommand = \"x {port}\"\nscale_to_zero_after = \"soon\"",
            "scale_to_zero_after: `soon` is not a duration",
        ),
        ("backend = \"local\"", "a local pool needs `model`"),
        ("backend = \"external\"", "an external pool needs `url`"),
        ("backend = \"lambda\"", "unknown variant `lambda`"),
        (
            "backend = \"process\"\ncommand = \"x {port}\"\nrouting = \"random\"",
            "unknown variant `random`",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("frugal.toml");
        std::fs::write(&path, format!("[[serve.pool]]\nname = \"p\"\n{entry}\n")).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
            .arg("--config")
            .arg(&path)
            .args(["serve", "--no-model", "--port", "0"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{entry}: {err}");
        assert!(err.contains(says), "{entry}: {err}");
    }
}

#[test]
fn local_and_external_pools_serve_and_an_external_pool_without_an_endpoint_holds_then_503s() {
    let upstream = Server::start(&["--no-cache"]);
    let config = format!(
        r#"
[[serve.pool]]
name = "local"
backend = "local"
model = "{model}"
price_per_hour = "3.6"
tick = "100ms"

[[serve.pool]]
name = "ext"
backend = "external"
url = "http://{addr}/v1"
tick = "100ms"

[[serve.pool]]
name = "gone"
backend = "external"
url = "http://127.0.0.1:9/v1"
# Long enough that a loaded machine's status polls see the held request.
cold_start_timeout = "3s"
tick = "100ms"
"#,
        model = model().display(),
        addr = upstream.addr,
    );
    let server = gateway(&config);
    for pool in ["local", "ext"] {
        let (code, _, body) = server.request(
            "POST",
            "/v1/chat/completions",
            &chat(pool, "What is 2+2?", 8),
        );
        assert_eq!(code, 200, "{pool}: {body}");
        assert_eq!(status(&server, pool)["ready"], 1);
    }
    let started = Instant::now();
    let (code, head, body) = server.request("POST", "/v1/chat/completions", &chat("gone", "Hi", 4));
    assert_eq!(code, 503, "{body}");
    assert!(header(&head, "retry-after").is_some());
    assert!(
        started.elapsed() >= Duration::from_millis(2_900),
        "held while nothing was ready"
    );
    // Queued requests count as demand, for KEDA to wake a Deployment at zero.
    let addr = server.addr.clone();
    let held = std::thread::spawn(move || {
        Server::attach(&addr)
            .request("POST", "/v1/chat/completions", &chat("gone", "Hi", 4))
            .0
    });
    // The thread's request may start late on a busy machine; once in, it is held ~3 s.
    let s = wait_for(&server, "gone", Duration::from_secs(10), |s| {
        s["queued"] == 1
    });
    assert_eq!(
        (s["demand"].as_u64(), s["desired_replicas"].as_u64()),
        (Some(1), Some(1)),
        "{s}"
    );
    assert_eq!(held.join().unwrap(), 503);
}

/// Issue 33, item 5: a pool of replicas that cache prefixes sends each conversation's later
/// turns to the replica that served its first (`routing = "prefix"`, the default);
/// `least_in_flight` sends them wherever is least busy. Each replica names itself in its
/// answers (`--name POOL-ID`), so every turn says which replica served it.
#[test]
fn conversations_later_turns_go_to_the_replica_that_served_their_first() {
    let pool = |name: &str, routing: &str| {
        format!(
            r#"
[[serve.pool]]
name = "{name}"
backend = "process"
command = "{bin} serve --model {{model}} --port {{port}} --no-meter --no-cache --price-per-hour 0 --name {name}-{{replica}}"
model = "{model}"
min_replicas = 3
max_replicas = 3
tick = "100ms"
{routing}
"#,
            bin = env!("CARGO_BIN_EXE_frugal"),
            model = model().display(),
        )
    };
    let server = gateway(&format!(
        "{}{}",
        pool("sticky", ""),
        pool("spread", "routing = \"least_in_flight\"")
    ));
    for p in ["sticky", "spread"] {
        wait_for(&server, p, Duration::from_secs(120), |s| s["ready"] == 3);
    }
    const CONVERSATIONS: usize = 9;
    const TURNS: usize = 3;
    // One turn of conversation `c`: its history so far plus a question; the replica that
    // answered (its name's suffix) and the answer, appended to the history.
    let turn =
        |addr: &str, pool: &str, history: &mut Vec<serde_json::Value>, c: usize, t: usize| {
            if history.is_empty() {
                // A short system prompt of its own: every message is shorter than a
                // routing chunk (256 bytes), so a later turn finds its prefix by whole
                // messages.
                let system = format!("You are assistant number {c}. Answer briefly.");
                history.push(serde_json::json!({ "role": "system", "content": system }));
            }
            history.push(serde_json::json!({
                "role": "user",
                "content": format!("Question {t} of conversation {c}: name a colour."),
            }));
            let body = serde_json::json!({
                "model": pool, "messages": history, "max_tokens": 8, "temperature": 0,
            })
            .to_string();
            let (code, _, body) =
                Server::attach(addr).request("POST", "/v1/chat/completions", &body);
            assert_eq!(code, 200, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let replica = v["model"].as_str().unwrap().to_owned();
            assert!(replica.starts_with(&format!("{pool}-")), "{v}");
            history.push(v["choices"][0]["message"].clone());
            replica
        };
    // Later turns on their first turn's replica, of all later turns.
    let sticky = |served: &[Vec<String>]| {
        let same = served
            .iter()
            .map(|turns| turns[1..].iter().filter(|r| **r == turns[0]).count())
            .sum::<usize>();
        (same, served.len() * (TURNS - 1))
    };
    // The most loaded replica's requests over the mean, from the scale endpoint.
    let share = |pool: &str| {
        let s = status(&server, pool);
        let counts: Vec<f64> = s["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["requests"].as_f64().unwrap())
            .collect();
        let mean = counts.iter().sum::<f64>() / counts.len() as f64;
        (counts.iter().cloned().fold(0.0, f64::max) / mean, counts)
    };
    // Several conversations at once, each turn of every one released together: a replica
    // busy with one is passed over by least-in-flight routing for the next.
    let concurrent = |pool: &'static str| -> Vec<Vec<String>> {
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(CONVERSATIONS));
        let threads: Vec<_> = (0..CONVERSATIONS)
            .map(|c| {
                let (addr, barrier) = (server.addr.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let mut history = Vec::new();
                    (0..TURNS)
                        .map(|t| {
                            barrier.wait();
                            turn(&addr, pool, &mut history, c + 100, t)
                        })
                        .collect()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    };

    // One request at a time: every later turn finds its prefix on its first turn's
    // replica, and new conversations are spread over the replicas by hashing.
    let mut histories = vec![Vec::new(); CONVERSATIONS];
    let mut served = vec![Vec::new(); CONVERSATIONS];
    for t in 0..TURNS {
        for (c, history) in histories.iter_mut().enumerate() {
            served[c].push(turn(&server.addr, "sticky", history, c, t));
        }
    }
    let (same, later) = sticky(&served);
    assert_eq!(same, later, "{served:?}");
    let firsts: std::collections::HashSet<_> = served.iter().map(|t| &t[0]).collect();
    assert!(
        firsts.len() >= 2,
        "first turns all on one replica: {served:?}"
    );
    let (_, _, metrics) = server.request("GET", "/metrics", "");
    for (outcome, n) in [("hit", later), ("miss", CONVERSATIONS), ("overflow", 0)] {
        let line = format!(
            "frugal_pool_prefix_routed_total{{pool=\"sticky\",outcome=\"{outcome}\"}} {n}\n"
        );
        assert!(metrics.contains(&line), "{line}: {metrics}");
    }
    assert!(!metrics.contains("frugal_pool_prefix_routed_total{pool=\"spread\""));
    let (top, counts) = share("sticky");
    println!(
        "prefix, one at a time: {same}/{later} later turns on their first turn's replica; most loaded replica {top:.2}x the mean {counts:?}"
    );

    // Concurrently, on both pools.
    let spread = concurrent("spread");
    let (spread_same, later) = sticky(&spread);
    let (spread_top, spread_counts) = share("spread");
    let prefix = concurrent("sticky");
    let (prefix_same, _) = sticky(&prefix);
    println!(
        "concurrent, {CONVERSATIONS} conversations x {TURNS} turns: later turns on their first turn's replica: prefix {prefix_same}/{later}, least_in_flight {spread_same}/{later}; most loaded replica (all requests) prefix {:.2}x, least_in_flight {spread_top:.2}x the mean {spread_counts:?}",
        share("sticky").0
    );
    assert!(spread_same < later, "least_in_flight: {spread:?}");

    // Each replica's own /metrics, where the scale endpoint says it is, as a replay tool
    // reads its prefix cache's hits.
    let s = status(&server, "sticky");
    for r in s["replicas"].as_array().unwrap() {
        let url = r["url"].as_str().unwrap_or_else(|| panic!("{s}"));
        let addr = url.strip_prefix("http://").unwrap();
        let (code, _, body) = Server::attach(addr).request("GET", "/metrics", "");
        assert_eq!(code, 200, "{url}");
        assert!(body.contains("frugal_"), "{url}: {body}");
        let hits = body
            .lines()
            .find(|l| l.starts_with("frugal_prefix_cache_hit_tokens_total"))
            .unwrap_or("frugal_prefix_cache_hit_tokens_total (not yet exported)");
        println!(
            "replica {} at {url}: {} requests; {hits}",
            r["id"], r["requests"]
        );
    }
}
