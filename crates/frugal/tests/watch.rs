//! `frugal watch` against a real `frugal serve`: its /metrics scraped before and after
//! requests, the interval billed into the watcher's own ledger with the server's counts;
//! a target that is down is a gap, never a bill.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{Server, said};
use frugal_testkit::prometheus::Prometheus;

fn watch(dir: &Path, config: &str) -> Output {
    watch_with(dir, config, &[])
}

fn watch_with(dir: &Path, config: &str, flags: &[&str]) -> Output {
    std::fs::write(dir.join("frugal.toml"), config).unwrap();
    Command::new(env!("CARGO_BIN_EXE_frugal"))
        .current_dir(dir)
        .args(["--config", "frugal.toml", "--ledger", "watch.sqlite"])
        .args(["watch", "--once", "--timeout", "5s"])
        .args(flags)
        .output()
        .unwrap()
}

#[test]
fn a_served_model_s_requests_and_tokens_are_billed_from_its_metrics() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[[watch.target]]
name = "local"
url = "http://{}/metrics"
price_per_hour = "3.60"
workload = "chat"

[[watch.target]]
name = "down"
url = "http://127.0.0.1:9/metrics"
"#,
        server.addr
    );
    // A target down fails the pass for cron, by name, after the others are read.
    let first = watch(dir.path(), &config);
    assert_eq!(first.status.code(), Some(1), "{}", said(&first));
    assert!(
        said(&first).contains("local: first reading (frugal)"),
        "{}",
        said(&first)
    );
    assert!(
        said(&first).contains("down: a gap, not billed"),
        "{}",
        said(&first)
    );
    assert!(
        said(&first).contains("error: a gap this pass, not billed: down (--allow-gaps"),
        "{}",
        said(&first)
    );

    // The server's own counters, summed over their labels.
    let counted = |name: &str| {
        let (_, _, body) = server.request("GET", "/metrics", "");
        frugal_watch::parse(&body).unwrap().sum(name).unwrap_or(0.0)
    };
    let tokens_before = counted("frugal_generated_tokens_total");
    let busy_before = counted("frugal_engine_busy_seconds_total");
    for q in ["What is 2 + 2?", "Name a colour.", "Say hello."] {
        server.ask(q, 8);
    }
    let served = counted("frugal_generated_tokens_total") - tokens_before;
    let busy = counted("frugal_engine_busy_seconds_total") - busy_before;
    assert!(served > 0.0);
    let second = watch_with(dir.path(), &config, &["--allow-gaps"]);
    assert!(second.status.success(), "{}", said(&second));
    assert!(said(&second).contains("local: "), "{}", said(&second));

    let db = rusqlite::Connection::open(dir.path().join("watch.sqlite")).unwrap();
    let (requests, output, cost): (i64, i64, i64) = db
        .query_row(
            "SELECT sum(e.requests), sum(e.output_tokens), sum(e.cost) FROM events e \
             JOIN dims w ON w.id = e.workload WHERE w.name = 'chat'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(requests, 3, "the requests made");
    assert_eq!(output as f64, served, "tokens as the server counted them");
    assert!(cost > 0, "the interval's time is billed");
    // Nothing of the target that was down.
    let down: i64 = db
        .query_row(
            "SELECT count(*) FROM events e JOIN dims w ON w.id = e.workload WHERE w.name = 'down'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(down, 0);
    // The interval as a span of the server: its busy time is the engine's own count.
    let (server_name, busy_ms, span_requests): (String, i64, i64) = db
        .query_row(
            "SELECT v.name, s.busy_ms, s.requests FROM replica_spans s \
             JOIN dims v ON v.id = s.server",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((server_name.as_str(), span_requests), ("local", 3));
    assert!(busy > 0.0);
    assert!(
        (busy_ms as f64 - busy * 1000.0).abs() <= 1.0,
        "{busy_ms} ms against {busy} s"
    );
    let report = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .current_dir(dir.path())
        .args(["--ledger", "watch.sqlite", "report"])
        .output()
        .unwrap();
    let text = said(&report);
    assert!(report.status.success(), "{text}");
    assert!(text.contains("Watched servers"), "{text}");
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("local ")),
        "{text}"
    );
}

#[test]
fn bad_targets_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let twice = "[[watch.target]]\nname = \"a\"\nurl = \"http://x/metrics\"\n\
                 [[watch.target]]\nname = \"a\"\nurl = \"http://y/metrics\"\n";
    let out = watch(dir.path(), twice);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        said(&out).contains("two [[watch.target]]s are named `a`"),
        "{}",
        said(&out)
    );
    let kind = "[[watch.target]]\nname = \"a\"\nurl = \"http://x/metrics\"\nkind = \"triton\"\n";
    let out = watch(dir.path(), kind);
    assert!(
        said(&out).contains("kind `triton` is none of"),
        "{}",
        said(&out)
    );
    let out = watch(dir.path(), "");
    assert!(said(&out).contains("no [[watch.target]]"), "{}", said(&out));
}

/// A fleet read through a real Prometheus server's API: one config entry, the servers
/// found by their `instance` label, priced by an instance-type label, billed like scraped
/// ones; and a Prometheus that is down is a gap.
#[test]
fn a_fleet_is_read_through_a_real_prometheus() {
    let server = Server::start(&[]);
    let prometheus = Prometheus::start(&server.addr.to_string());
    let ok = "frugal_requests_total{status=\"ok\"}";
    prometheus.wait_for(ok, 0.0);
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[watch.prometheus]]\nname = \"fleet\"\nurl = \"http://{}\"\nselector = '{{job=\"chat\"}}'\ninstance_label = \"node_type\"\n",
        prometheus.addr
    );
    let first = watch(dir.path(), &config);
    let name = format!("fleet/{}", server.addr);
    assert!(
        said(&first).contains(&format!("{name}: first reading (frugal)")),
        "{}",
        said(&first)
    );
    let before = prometheus.value(ok).unwrap();
    for q in ["What is 2 + 2?", "Name a colour."] {
        server.ask(q, 4);
    }
    prometheus.wait_for(ok, before + 2.0);
    let second = watch(dir.path(), &config);
    assert!(
        said(&second).contains(&format!("{name}: ")),
        "{}",
        said(&second)
    );
    let db = rusqlite::Connection::open(dir.path().join("watch.sqlite")).unwrap();
    let (requests, instance): (i64, String) = db
        .query_row(
            "SELECT sum(e.requests), i.name FROM events e JOIN dims w ON w.id = e.workload \
             JOIN dims i ON i.id = e.instance WHERE w.name = 'chat' AND e.kind = 0",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(requests, 2, "{}", said(&second));
    assert_eq!(instance, "g5.xlarge", "priced by the node_type label");
    drop(prometheus);
    let third = watch(dir.path(), &config);
    assert_eq!(third.status.code(), Some(1), "{}", said(&third));
    assert!(
        said(&third).contains("a gap this pass, not billed: fleet (--allow-gaps"),
        "{}",
        said(&third)
    );
    assert!(
        said(&third).contains("fleet: every server a gap, not billed: cannot query"),
        "{}",
        said(&third)
    );
    assert!(
        said(&third).contains(&format!(
            "{name}: a gap, not billed: not in Prometheus's answer"
        )),
        "{}",
        said(&third)
    );
}

/// Issue 31: a target whose body never ends was read whole, for as long as `--timeout`
/// allowed. It is a gap named with the bound, and the watcher runs within a data limit
/// (`ulimit -d`, 256 MiB) that reading on would break.
#[test]
fn an_endless_body_is_a_gap_within_bounded_memory() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let base = runtime.block_on(frugal_testkit::loopback::endless_body());
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[watch.target]]\nname = \"endless\"\nurl = \"{base}/metrics\"\nprice_per_hour = \"1\"\n"
    );
    std::fs::write(dir.path().join("frugal.toml"), config).unwrap();
    let out = Command::new("sh")
        .current_dir(dir.path())
        .args(["-c", "ulimit -d 262144 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_frugal"))
        .args(["--config", "frugal.toml", "--ledger", "watch.sqlite"])
        .args(["watch", "--once", "--timeout", "10m", "--allow-gaps"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains(&format!(
            "endless: a gap, not billed: {base}/metrics's body is larger than 16 MiB"
        )),
        "{}",
        said(&out)
    );
}

/// Issue 31: a crash between the ledger's commit and the state file's save left the old
/// snapshot, and the next pass billed the same interval again (its events had no id). The
/// state is put back after a billed pass, as such a crash leaves it: the next pass's
/// interval starts where the billed one did, has its ids, and is stored once.
#[test]
fn an_interval_billed_before_a_crash_is_not_billed_again() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let body = "vllm:request_success_total{finished_reason=\"stop\",model_name=\"m\"} 7\n\
                vllm:prompt_tokens_total{model_name=\"m\"} 1200\n\
                vllm:generation_tokens_total{model_name=\"m\"} 300\n\
                vllm:num_requests_running{model_name=\"m\"} 1\n";
    let router =
        axum::Router::new().route("/metrics", axum::routing::get(move || async move { body }));
    let base = runtime.block_on(frugal_testkit::loopback::serve(router));
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[watch.target]]\nname = \"vllm\"\nurl = \"{base}/metrics\"\nprice_per_hour = \"3.60\"\nworkload = \"chat\"\n"
    );
    let rows = || {
        let db = rusqlite::Connection::open(dir.path().join("watch.sqlite")).unwrap();
        let events: (i64, i64) = db
            .query_row(
                "SELECT count(*), coalesce(sum(cost), 0) FROM events",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        let spans: i64 = db
            .query_row("SELECT count(*) FROM replica_spans", [], |r| r.get(0))
            .unwrap();
        (events, spans)
    };
    let state = dir.path().join("watch.watch.json");
    let first = watch(dir.path(), &config);
    assert!(
        said(&first).contains("vllm: first reading (vllm)"),
        "{}",
        said(&first)
    );
    let baseline = std::fs::read(&state).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let second = watch_with(dir.path(), &config, &["--allow-gaps"]);
    assert!(second.status.success(), "{}", said(&second));
    let billed = rows();
    assert!(
        billed.0.0 >= 1 && billed.1 == 1,
        "{billed:?}: {}",
        said(&second)
    );
    std::fs::write(&state, baseline).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let again = watch(dir.path(), &config);
    assert!(again.status.success(), "{}", said(&again));
    assert_eq!(rows(), billed, "billed once: {}", said(&again));
}

/// Issue 32: a target with no `price_per_hour` or `instance` billed $0. It is priced as the
/// nearest catalog CPU instance to this machine's size, said once at start.
#[test]
fn a_target_without_a_price_is_billed_from_the_catalog() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let body = "vllm:request_success_total{finished_reason=\"stop\",model_name=\"m\"} 7\n\
                vllm:generation_tokens_total{model_name=\"m\"} 300\n\
                vllm:num_requests_running{model_name=\"m\"} 1\n";
    let router =
        axum::Router::new().route("/metrics", axum::routing::get(move || async move { body }));
    let base = runtime.block_on(frugal_testkit::loopback::serve(router));
    let dir = tempfile::tempdir().unwrap();
    let config = format!("[[watch.target]]\nname = \"vllm\"\nurl = \"{base}/metrics\"\n");
    let first = watch(dir.path(), &config);
    assert!(first.status.success(), "{}", said(&first));
    assert!(
        said(&first)
            .contains("frugal watch: servers with no price_per_hour or instance: priced as "),
        "{}",
        said(&first)
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    let second = watch(dir.path(), &config);
    assert!(second.status.success(), "{}", said(&second));
    let db = rusqlite::Connection::open(dir.path().join("watch.sqlite")).unwrap();
    let cost: i64 = db
        .query_row("SELECT coalesce(sum(cost), 0) FROM events", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(
        cost > 0,
        "the interval priced from the catalog: {}",
        said(&second)
    );
}
