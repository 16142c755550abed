//! End-to-end: tenants' budgets shared by two `frugal serve` replicas through a real Redis
//! over one PostgreSQL ledger, what happens when Redis goes away and comes back, and keys
//! and budgets reloaded on SIGHUP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Server, header, request_at};
use frugal_cost::{Kind, Ledger, Location, Money, Window};
use frugal_gateway::admit::keys::hash_key;
use frugal_testkit::redis::Redis;
use frugal_testkit::upstream::mock_upstream;

/// $1,000 per million prompt tokens, $2,000 per million completion tokens: the mock's
/// answer (10 and 5 tokens) costs $0.02.
const PRICES: &str = "[[model]]\nname = \"mock-price\"\ninput = 1000.0\noutput = 2000.0\n";

/// A request's hold: every prompt byte a token ("user", the content and 8 bytes of
/// framing: 40) and all of `max_tokens` (5): $0.040 + $0.010.
const QUESTION: &str = "spend a little of the budget";
const HOLD: Money = Money::from_cents(5);

fn config(upstream: &str, extra: &str, keys: &[(&str, &str, &str)]) -> String {
    let mut text = format!(
        "[prices]\nfiles = [\"prices.toml\"]\n\n[serve]\n{extra}\n[[serve.upstream]]\nname = \"mock\"\nurl = \"{upstream}\"\nmodel = \"upstream-name\"\nprice = \"mock-price\"\ntimeout_s = 5\n"
    );
    for (tenant, key, daily) in keys {
        text += &format!(
            "\n[[serve.key]]\ntenant = \"{tenant}\"\nsha256 = \"{}\"\ndaily_usd = \"{daily}\"\n",
            hash_key(key)
        );
    }
    text
}

/// A gateway on a mock upstream whose budgets are held in Redis at `url`, with one tenant,
/// `acme` (key `fk-acme`), of `daily` dollars a day.
fn on_redis(url: &str, daily: &str) -> Server {
    let (upstream, _) = mock_upstream();
    let text = config(
        &upstream,
        &format!("budget_redis = \"{url}\"\n"),
        &[("acme", "fk-acme", daily)],
    );
    Server::start_with_files(
        &[("prices.toml", PRICES), ("frugal.toml", text.as_str())],
        &["--no-model", "--no-cache"],
    )
}

fn ask(addr: &str, key: &str) -> (u16, String, String) {
    let body = format!(
        r#"{{"model":"mock","messages":[{{"role":"user","content":"{QUESTION}"}}],"max_tokens":5}}"#
    );
    request_at(
        addr,
        "POST",
        "/v1/chat/completions",
        &body,
        &format!("Authorization: Bearer {key}\r\n"),
    )
}

/// A metric's value, read with `key` (the metrics need one when keys are configured).
fn metric(addr: &str, key: &str, name: &str) -> f64 {
    let (_, _, body) = request_at(
        addr,
        "GET",
        "/metrics",
        "",
        &format!("Authorization: Bearer {key}\r\n"),
    );
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(f64::NAN)
}

fn wait_for(what: &str, done: impl FnMut() -> bool) {
    let why = || format!("timed out waiting for {what}");
    frugal_testkit::wait_until(Duration::from_secs(20), done, why);
}

fn hup(s: &Server) {
    let ok = std::process::Command::new("kill")
        .args(["-HUP", &s.pid().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

fn refused_for_budget(status: u16, head: &str, body: &str) {
    assert_eq!(status, 429, "{body}");
    // Spent (with the holds in flight), or too little left for this request's hold.
    assert!(
        body.contains("the daily budget of `acme` is spent")
            || body.contains("left of the daily budget of `acme`"),
        "{body}"
    );
    assert!(header(head, "retry-after").is_some(), "{head}");
}

/// The issue's must-show: two gateways on one PostgreSQL ledger and one budget, loaded at
/// once until both refuse; the tenant's combined spend stops within one reservation of it.
#[test]
fn two_gateways_on_one_ledger_spend_one_budget() {
    let redis = Redis::start().unwrap();
    let ledger = frugal_testkit::postgres::database();
    let (upstream, _) = mock_upstream();
    let limit = Money::from_cents(100);
    let text = config(
        &upstream,
        &format!("budget_redis = \"{}\"\n", redis.url),
        &[("acme", "fk-acme", "1.00")],
    );
    let files = [("prices.toml", PRICES), ("frugal.toml", text.as_str())];
    let flags = ["--no-model", "--no-cache"];
    let gateways = [
        Server::start_on_ledger_in(tempfile::tempdir().unwrap(), &ledger, &files, &flags),
        Server::start_on_ledger_in(tempfile::tempdir().unwrap(), &ledger, &files, &flags),
    ];
    // One request through each first: on a loaded machine one gateway's clients could
    // otherwise spend the whole budget before the other's start.
    for g in &gateways {
        assert_eq!(ask(&g.addr, "fk-acme").0, 200);
    }
    let mut answered = std::sync::atomic::AtomicU64::new(2);
    std::thread::scope(|s| {
        for i in 0..8 {
            let addr = gateways[i % 2].addr.clone();
            let answered = &answered;
            s.spawn(move || {
                loop {
                    let (status, head, body) = ask(&addr, "fk-acme");
                    if status == 200 {
                        answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        continue;
                    }
                    refused_for_budget(status, &head, &body);
                    return;
                }
            });
        }
    });
    // A refusal counts the holds in flight, which settle at less: once they have, one
    // gateway or the other may find room for a last request or two.
    for g in &gateways {
        loop {
            let (status, head, body) = ask(&g.addr, "fk-acme");
            if status != 200 {
                refused_for_budget(status, &head, &body);
                break;
            }
            *answered.get_mut() += 1;
        }
        assert_eq!(metric(&g.addr, "fk-acme", "frugal_budget_shared"), 1.0);
        assert_eq!(
            metric(&g.addr, "fk-acme", "frugal_budget_fallbacks_total"),
            0.0
        );
    }
    let served: Vec<f64> = gateways
        .iter()
        .map(|g| metric(&g.addr, "fk-acme", "frugal_requests_total{status=\"ok\"}"))
        .collect();
    assert!(
        served.iter().all(|n| *n > 0.0),
        "both gateways served: {served:?}"
    );
    assert_eq!(served.iter().sum::<f64>(), *answered.get_mut() as f64);
    let [a, b] = gateways;
    assert!(a.stop().0.success() && b.stop().0.success());
    let ledger = Ledger::open(Location::parse(&ledger)).unwrap();
    let spent: Money = ledger
        .tenant_spend(0)
        .unwrap()
        .into_iter()
        .filter(|(t, _)| t == "acme")
        .map(|(_, m)| m)
        .sum();
    let mut rows = 0;
    ledger
        .scan(Window::default(), |r| {
            rows += u64::from(r.kind == Kind::Inference) * r.requests;
        })
        .unwrap();
    let answered = answered.into_inner();
    eprintln!(
        "two gateways: {answered} requests answered ({served:?} each), ${} spent of a ${} budget (one hold: ${})",
        spent.to_string_places(2),
        limit.to_string_places(2),
        HOLD.to_string_places(2)
    );
    assert_eq!(rows, answered, "every answered request once in the ledger");
    assert_eq!(
        spent,
        Money::from_nanos(Money::from_cents(2).nanos() * answered as i64)
    );
    assert!(
        spent >= limit - HOLD && spent <= limit + HOLD,
        "{answered} requests spent ${}",
        spent.to_string_places(2)
    );
}

/// Without Redis, gateways on one PostgreSQL ledger read each other's spend from it every
/// few seconds: a budget one spent is spent at the other too, late.
#[test]
fn without_budget_redis_gateways_on_one_postgresql_ledger_catch_up_with_each_other() {
    let ledger = frugal_testkit::postgres::database();
    let (upstream, _) = mock_upstream();
    let text = config(&upstream, "", &[("acme", "fk-acme", "0.20")]);
    let files = [("prices.toml", PRICES), ("frugal.toml", text.as_str())];
    let flags = ["--no-model", "--no-cache"];
    let a = Server::start_on_ledger_in(tempfile::tempdir().unwrap(), &ledger, &files, &flags);
    let b = Server::start_on_ledger_in(tempfile::tempdir().unwrap(), &ledger, &files, &flags);
    let mut spent_at_a = 0;
    loop {
        let (status, head, body) = ask(&a.addr, "fk-acme");
        if status != 200 {
            refused_for_budget(status, &head, &body);
            break;
        }
        spent_at_a += 1;
    }
    // $0.02 a request, each holding $0.05: the ninth's hold is more than the $0.04 left.
    assert_eq!(spent_at_a, 8, "$0.20 at $0.02 a request");
    // B reads the ledger every 5 s (A's meter writes within 250 ms); asking B meanwhile
    // would spend B's own view of the budget, so it is asked once, after.
    std::thread::sleep(Duration::from_secs(6));
    let (status, head, body) = ask(&b.addr, "fk-acme");
    refused_for_budget(status, &head, &body);
    assert!(
        body.contains("the $0.040000 left"),
        "B counts A's spend: {body}"
    );
    assert_eq!(metric(&b.addr, "fk-acme", "frugal_budget_shared"), 1.0);
    let age = metric(&b.addr, "fk-acme", "frugal_budget_catch_up_age_seconds");
    assert!(age < 6.0, "the last catch-up {age} s ago");
    assert!(a.stop().0.success() && b.stop().0.success());
}

#[test]
fn without_redis_requests_are_served_on_the_local_view_and_settled_when_it_returns() {
    let mut redis = Redis::start().unwrap();
    let server = on_redis(&redis.url, "100.00");
    let shared = |s: &Server| metric(&s.addr, "fk-acme", "frugal_budget_shared");
    assert_eq!(ask(&server.addr, "fk-acme").0, 200);
    assert_eq!(shared(&server), 1.0);

    redis.kill();
    for _ in 0..3 {
        let (status, _, body) = ask(&server.addr, "fk-acme");
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(shared(&server), 0.0);
    assert!(metric(&server.addr, "fk-acme", "frugal_budget_fallbacks_total") >= 1.0);
    wait_for("the log of the fallback", || {
        server
            .logs()
            .contains("admission falls back to this gateway's view")
    });

    // A gateway cannot start against a Redis that is not there; the URL's password is not
    // said.
    let dir = tempfile::tempdir().unwrap();
    let secret = redis.url.replace("redis://", "redis://:hunter2@");
    let (upstream, _) = mock_upstream();
    std::fs::write(dir.path().join("prices.toml"), PRICES).unwrap();
    std::fs::write(
        dir.path().join("frugal.toml"),
        config(
            &upstream,
            &format!("budget_redis = \"{secret}\"\n"),
            &[("acme", "fk-acme", "1.00")],
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
        .arg("--config")
        .arg(dir.path().join("frugal.toml"))
        .arg("--ledger")
        .arg(dir.path().join("ledger.sqlite"))
        .args(["serve", "--no-model", "--port", "0"])
        .output()
        .unwrap();
    let said = common::said(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("cannot reach the shared budgets: budget_redis redis://***@127.0.0.1:"),
        "{said}"
    );
    assert!(!said.contains("hunter2"), "{said}");

    // Back, empty: the totals start again from this gateway's view, and what it spent
    // meanwhile is added once.
    redis.restart().unwrap();
    wait_for("shared budgets again", || {
        ask(&server.addr, "fk-acme").0 == 200
            && shared(&server) == 1.0
            && metric(&server.addr, "fk-acme", "frugal_budget_unsettled") == 0.0
    });
    let requests = metric(
        &server.addr,
        "fk-acme",
        "frugal_requests_total{status=\"ok\"}",
    );
    let out = std::process::Command::new("redis-cli")
        .args([
            "-u",
            &redis.url,
            "--scan",
            "--pattern",
            "frugal:budget:v1:{acme}:day:*",
        ])
        .output()
        .unwrap();
    let key = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let out = std::process::Command::new("redis-cli")
        .args(["-u", &redis.url, "GET", &key])
        .output()
        .unwrap();
    let nanos: i64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        Money::from_nanos(nanos),
        Money::from_nanos(Money::from_cents(2).nanos() * requests as i64),
        "{requests} requests in Redis's total"
    );
    wait_for("the log of the return", || {
        server.logs().contains("Redis answers again")
    });
}

#[test]
fn sighup_reloads_keys_and_budgets_and_refuses_a_bad_config() {
    let (upstream, _) = mock_upstream();
    let server = Server::start_with_files(
        &[
            ("prices.toml", PRICES),
            (
                "frugal.toml",
                &config(&upstream, "", &[("acme", "fk-acme", "1.00")]),
            ),
        ],
        &["--no-model", "--no-cache"],
    );
    let file = server.dir().join("frugal.toml");
    let reloads = |result: &str| {
        metric(
            &server.addr,
            "fk-acme",
            &format!("frugal_config_reloads_total{{result=\"{result}\"}}"),
        )
    };
    assert_eq!(ask(&server.addr, "fk-acme").0, 200);
    assert_eq!(ask(&server.addr, "fk-other").0, 401);

    // A tenant added, acme's budget cut below what it spent: acme keeps its $0.02.
    std::fs::write(
        &file,
        config(
            &upstream,
            "",
            &[("acme", "fk-acme", "0.01"), ("other", "fk-other", "1.00")],
        ),
    )
    .unwrap();
    hup(&server);
    wait_for("the reload", || reloads("ok") == 1.0);
    assert_eq!(ask(&server.addr, "fk-other").0, 200);
    let (status, _, body) = ask(&server.addr, "fk-acme");
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("$0.020000 of $0.01"), "{body}");
    // Said once the keys are swapped (the metric counts first).
    wait_for("the reload's log", || {
        server
            .logs()
            .contains("keys reloaded: 2 keys (were 1); tenants added: other; budgets changed: acme")
    });

    // A config that does not parse, then one that does not check: refused, keys kept.
    std::fs::write(&file, "[serve]\nbogus = 1\n").unwrap();
    hup(&server);
    wait_for("the refused reload", || reloads("error") == 1.0);
    std::fs::write(&file, "[[serve.key]]\ntenant = \"x\"\nsha256 = \"abc\"\n").unwrap();
    hup(&server);
    wait_for("the second refused reload", || {
        reloads("error") == 2.0 && server.logs().contains("sha256 must be 64 hex digits")
    });
    assert_eq!(ask(&server.addr, "fk-other").0, 200);
    let logs = server.logs();
    assert!(logs.contains("config reload refused"), "{logs}");
    assert!(logs.contains("bogus"), "{logs}");
    assert!(logs.contains("sha256 must be 64 hex digits"), "{logs}");
    for key in ["fk-acme", "fk-other"] {
        assert!(!logs.contains(&hash_key(key)[..16]), "{logs}");
    }

    // Removed: refused from now on.
    std::fs::write(
        &file,
        config(&upstream, "", &[("other", "fk-other", "1.00")]),
    )
    .unwrap();
    hup(&server);
    wait_for("the last reload", || {
        metric(
            &server.addr,
            "fk-other",
            "frugal_config_reloads_total{result=\"ok\"}",
        ) == 2.0
    });
    assert_eq!(ask(&server.addr, "fk-acme").0, 401);
    assert!(server.stop().0.success());
}

/// Issue 31: a SIGHUP to a config without keys would open the API (every route answered
/// without a key): it is refused, as an error that says why, counted, and the old keys stay;
/// `allow_open = true` lets it through.
#[test]
fn sighup_to_a_config_without_keys_keeps_the_api_closed_unless_it_allows_open() {
    let (upstream, _) = mock_upstream();
    let server = Server::start_with_files(
        &[
            ("prices.toml", PRICES),
            (
                "frugal.toml",
                &config(&upstream, "", &[("acme", "fk-acme", "1.00")]),
            ),
        ],
        &["--no-model", "--no-cache"],
    );
    let file = server.dir().join("frugal.toml");
    let keyless =
        |method: &str, path: &str, body: &str| request_at(&server.addr, method, path, body, "").0;
    let chat = r#"{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#;
    assert_eq!(keyless("POST", "/v1/chat/completions", chat), 401);

    std::fs::write(&file, config(&upstream, "", &[])).unwrap();
    hup(&server);
    wait_for("the refused reload", || {
        metric(&server.addr, "fk-acme", "frugal_key_reloads_refused_total") == 1.0
    });
    assert_eq!(
        metric(
            &server.addr,
            "fk-acme",
            "frugal_config_reloads_total{result=\"error\"}"
        ),
        1.0
    );
    for (method, path, body) in [
        ("POST", "/v1/chat/completions", chat),
        ("GET", "/v1/files", ""),
        ("GET", "/v1/batches", ""),
        ("GET", "/v1/models", ""),
    ] {
        assert_eq!(keyless(method, path, body), 401, "{method} {path}");
    }
    assert_eq!(ask(&server.addr, "fk-acme").0, 200, "the old key stays");
    wait_for("the refusal's log", || {
        server
            .logs()
            .contains("config reload refused, the keys stay as they were")
    });
    let logs = server.logs();
    assert!(logs.contains("ERROR"), "{logs}");
    assert!(logs.contains("open the API to anyone"), "{logs}");

    std::fs::write(&file, config(&upstream, "allow_open = true\n", &[])).unwrap();
    hup(&server);
    wait_for("the allowed reload", || {
        keyless("POST", "/v1/chat/completions", chat) == 200
    });
    wait_for("the reload's log", || {
        server
            .logs()
            .contains("keys reloaded: 0 keys (were 1); tenants removed: acme")
    });
    assert!(server.stop().0.success());
}

/// Issue 31: `max_tokens` 10^15 overflowed the reservation into $0, and 8 of 8 concurrent
/// requests were admitted on a $0.01 budget. Now 32 at once are all refused, by the
/// worst case they say, and hold nothing back from a request that fits; a request without
/// `max_tokens` holds the upstream's `max_output_tokens`, 4,096 tokens where none is set.
#[test]
fn absurd_max_tokens_cannot_buy_past_a_budget() {
    let (upstream, _) = mock_upstream();
    let text = config(&upstream, "", &[("acme", "fk-acme", "0.10")])
        .replace("timeout_s = 5\n", "timeout_s = 5\nmax_output_tokens = 10\n");
    let server = Server::start_with_files(
        &[("prices.toml", PRICES), ("frugal.toml", text.as_str())],
        &["--no-model", "--no-cache"],
    );
    let absurd = |extra: &str| {
        format!(
            r#"{{"model":"mock","messages":[{{"role":"user","content":"{QUESTION}"}}],"max_tokens":1000000000000000{extra}}}"#
        )
    };
    let statuses: Vec<(u16, String)> = std::thread::scope(|s| {
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let (addr, body) = (
                    &server.addr,
                    absurd(if i % 2 == 0 { "" } else { r#","n":128"# }),
                );
                s.spawn(move || {
                    let (status, _, body) = request_at(
                        addr,
                        "POST",
                        "/v1/chat/completions",
                        &body,
                        "Authorization: Bearer fk-acme\r\n",
                    );
                    (status, body)
                })
            })
            .collect();
        tasks.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let admitted = statuses.iter().filter(|(s, _)| *s == 200).count();
    eprintln!("32 requests with max_tokens 10^15 on a $0.10 budget: {admitted} admitted");
    assert_eq!(admitted, 0, "{statuses:?}");
    for (status, body) in &statuses {
        assert_eq!(*status, 429, "{body}");
        assert!(
            body.contains("more than the $0.100000 left of the daily budget of `acme`"),
            "{body}"
        );
    }
    // Nothing held back, nothing spent: a request that fits is answered.
    assert_eq!(ask(&server.addr, "fk-acme").0, 200);
    // Without max_tokens: the upstream's 10 output tokens held ($0.04 + $0.02), not 4,096.
    let bare =
        format!(r#"{{"model":"mock","messages":[{{"role":"user","content":"{QUESTION}"}}]}}"#);
    let (status, _, body) = request_at(
        &server.addr,
        "POST",
        "/v1/chat/completions",
        &bare,
        "Authorization: Bearer fk-acme\r\n",
    );
    assert_eq!(status, 200, "{body}");
    assert!(server.stop().0.success());

    // Where the upstream says nothing, 4,096 tokens ($8.19) are more than a $0.10 budget.
    let text = config(&upstream, "", &[("acme", "fk-acme", "0.10")]);
    let server = Server::start_with_files(
        &[("prices.toml", PRICES), ("frugal.toml", text.as_str())],
        &["--no-model", "--no-cache"],
    );
    let (status, _, body) = request_at(
        &server.addr,
        "POST",
        "/v1/chat/completions",
        &bare,
        "Authorization: Bearer fk-acme\r\n",
    );
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("may cost up to $8.232000"), "{body}");
    assert!(server.stop().0.success());
}

/// The day's total of `acme` in the Redis at `url`, in nanodollars.
fn redis_day_total(url: &str) -> i64 {
    let out = std::process::Command::new("redis-cli")
        .args([
            "-u",
            url,
            "--scan",
            "--pattern",
            "frugal:budget:v1:{acme}:day:*",
        ])
        .output()
        .unwrap();
    let key = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let out = std::process::Command::new("redis-cli")
        .args(["-u", url, "GET", &key])
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Issue 31, the fault suite's "Redis frozen under shared budgets": Redis paused past the
/// 250 ms timeout while requests hold and settle, then resumed. Requests are answered
/// meanwhile on the gateway's view; after, Redis's total is the true cost, each request
/// once, no hold is left, and the tenant is admitted while budget remains.
#[test]
fn redis_frozen_under_shared_budgets() {
    let redis = Redis::start().unwrap();
    let server = on_redis(&redis.url, "2.00");
    assert_eq!(ask(&server.addr, "fk-acme").0, 200);
    redis.pause();
    let started = std::time::Instant::now();
    let mut during = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let (status, _, body) = ask(&server.addr, "fk-acme");
        assert_eq!(status, 200, "{body}");
        during += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    redis.resume();
    wait_for("Redis to take it all back", || {
        metric(&server.addr, "fk-acme", "frugal_budget_shared") == 1.0
            && metric(&server.addr, "fk-acme", "frugal_budget_unsettled") == 0.0
            && metric(&server.addr, "fk-acme", "frugal_budget_unreleased") == 0.0
    });
    let answered = metric(
        &server.addr,
        "fk-acme",
        "frugal_requests_total{status=\"ok\"}",
    );
    let truth = Money::from_nanos(Money::from_cents(2).nanos() * answered as i64);
    let total = Money::from_nanos(redis_day_total(&redis.url));
    eprintln!(
        "Redis frozen 3 s: {during} requests answered during the freeze; Redis's total ${} after, true cost ${} ({answered} requests)",
        total.to_string_places(2),
        truth.to_string_places(2)
    );
    assert_eq!(total, truth);
    let out = std::process::Command::new("redis-cli")
        .args(["-u", &redis.url, "ZCARD", "frugal:budget:v1:{acme}:holds"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        "0",
        "no hold left"
    );
    // Budget remains: admitted until it is spent, and only then refused.
    let mut more = 0;
    loop {
        let (status, head, body) = ask(&server.addr, "fk-acme");
        if status != 200 {
            refused_for_budget(status, &head, &body);
            break;
        }
        more += 1;
    }
    let spent = Money::from_nanos(Money::from_cents(2).nanos() * (answered as i64 + more));
    assert!(
        spent > Money::from_cents(200) - HOLD && spent <= Money::from_cents(200),
        "admitted up to the budget: ${}",
        spent.to_string_places(2)
    );
    assert!(server.stop().0.success());
}

/// Issue 31: what a gateway spent while Redis did not answer was dropped when it stopped.
/// Now it waits a little for Redis to take it.
#[test]
fn a_gateway_stopping_while_redis_is_paused_settles_into_it_once_it_answers() {
    let redis = Redis::start().unwrap();
    let server = on_redis(&redis.url, "100.00");
    assert_eq!(ask(&server.addr, "fk-acme").0, 200);
    redis.pause();
    for _ in 0..3 {
        assert_eq!(ask(&server.addr, "fk-acme").0, 200);
    }
    let unsettled = metric(&server.addr, "fk-acme", "frugal_budget_unsettled");
    assert!(unsettled >= 1.0, "{unsettled}");
    let term = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    std::thread::sleep(Duration::from_millis(500));
    redis.resume();
    assert!(server.stop().0.success());
    assert_eq!(
        Money::from_nanos(redis_day_total(&redis.url)),
        Money::from_cents(8),
        "4 requests at $0.02"
    );
}

/// Issue 31: a gateway that started without keys and was given some by SIGHUP never read
/// the other replicas' spend from the shared ledger.
#[test]
fn keys_added_by_sighup_catch_up_with_the_other_replicas_spend() {
    let ledger = frugal_testkit::postgres::database();
    let (upstream, _) = mock_upstream();
    let keyed = config(&upstream, "", &[("acme", "fk-acme", "0.20")]);
    let flags = ["--no-model", "--no-cache"];
    let a = Server::start_on_ledger_in(
        tempfile::tempdir().unwrap(),
        &ledger,
        &[("prices.toml", PRICES), ("frugal.toml", keyed.as_str())],
        &flags,
    );
    let b = Server::start_on_ledger_in(
        tempfile::tempdir().unwrap(),
        &ledger,
        &[
            ("prices.toml", PRICES),
            ("frugal.toml", &config(&upstream, "", &[])),
        ],
        &flags,
    );
    std::fs::write(b.dir().join("frugal.toml"), &keyed).unwrap();
    hup(&b);
    wait_for("B's reload", || {
        metric(
            &b.addr,
            "fk-acme",
            "frugal_config_reloads_total{result=\"ok\"}",
        ) == 1.0
    });
    // A spends the budget after B took the key: only B's catch-up can see it.
    let mut spent_at_a = 0;
    loop {
        let (status, head, body) = ask(&a.addr, "fk-acme");
        if status != 200 {
            refused_for_budget(status, &head, &body);
            break;
        }
        spent_at_a += 1;
    }
    assert_eq!(spent_at_a, 8);
    std::thread::sleep(Duration::from_secs(6));
    let (status, head, body) = ask(&b.addr, "fk-acme");
    refused_for_budget(status, &head, &body);
    assert!(
        body.contains("the $0.040000 left"),
        "B counts A's spend: {body}"
    );
    assert!(a.stop().0.success() && b.stop().0.success());
}
