//! End-to-end: shadows (`shadow_rate`). A cascade's accepted cheap answer and a semantic hit
//! are asked again of the reference path (a mock upstream on loopback) in the background and
//! compared; the ledger gets each shadow's call and its quality sample once, the client's
//! answer neither changes nor waits, and `frugal report` shows the quality kept.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::{Server, header};
use frugal_testkit::upstream::mock_upstream;

/// Quality samples of `lever` on `route` so far, agreeing or not.
fn samples(server: &Server, lever: &str, route: &str) -> f64 {
    ["true", "false"]
        .iter()
        .map(|agree| {
            let name = format!(
                "frugal_shadow_samples_total{{lever=\"{lever}\",route=\"{route}\",agree=\"{agree}\"}}"
            );
            let n = server.metric(&name);
            if n.is_nan() { 0.0 } else { n }
        })
        .sum()
}

fn ask(server: &Server, model: &str, content: &str) -> (String, String) {
    let body = format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"{content}"}}],"max_tokens":12,"temperature":0}}"#
    );
    let (status, head, body) = server.request("POST", "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    (head, text.to_owned())
}

fn wait_for(what: &str, done: impl Fn() -> bool) {
    frugal_testkit::wait_until(Duration::from_secs(60), done, || {
        format!("timed out waiting: {what}")
    });
}

#[test]
fn cheap_answers_are_shadowed_in_the_background_sampled_once_and_reported() {
    let (url, calls) = mock_upstream();
    // The upstream answers "slow" after 5 s: a client that waited for its shadow would
    // see it. `loose` is the same upstream whose semantic hits are served at 30% error.
    let config = format!(
        "[prices]\nfiles = [\"prices.toml\"]\n\n[serve]\nshadow_examples = \"shadows.jsonl\"\n\n[[serve.upstream]]\nname = \"mock\"\nurl = \"{url}\"\nmodel = \"upstream-name\"\nprice = \"mock-price\"\ntimeout_s = 30\nretries = 0\n\n[[serve.upstream]]\nname = \"loose\"\nurl = \"{url}\"\nmodel = \"upstream-name\"\nprice = \"mock-price\"\nsemantic_max_error = 0.3\n\n[[serve.route]]\nname = \"auto\"\ntiers = [\"small\", \"mock\"]\nthreshold = -1000.0\n\n[[serve.route]]\nname = \"never\"\ntiers = [\"small\", \"mock\"]\nthreshold = -1000.0\nshadow_rate = 0.0\n"
    );
    let prices = "[[model]]\nname = \"mock-price\"\ninput = 1000.0\noutput = 2000.0\n";
    let server = Server::start_with_files(
        &[("prices.toml", prices), ("frugal.toml", &config)],
        &["--name", "small", "--shadow-rate", "1"],
    );

    // A cascade's cheap answer, accepted: the client has it long before the upstream
    // could have answered its shadow.
    let start = Instant::now();
    let (head, served) = ask(&server, "auto", "slow");
    let took = start.elapsed();
    assert_eq!(header(&head, "x-frugal-route"), Some("small"), "{head}");
    assert!(
        !served.starts_with("echo:"),
        "the cheap tier's answer: {served}"
    );
    assert!(took < Duration::from_millis(4_500), "delayed: {took:?}");
    assert_eq!(samples(&server, "routing", "auto"), 0.0, "not compared yet");
    wait_for("the cascade's shadow compared", || {
        samples(&server, "routing", "auto") == 1.0
    });
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the shadow asked the upstream"
    );
    assert!(server.metric("frugal_shadow_cost_usd_total") > 0.0);
    assert_eq!(server.metric("frugal_shadow_dropped_total"), 0.0);
    // The shadow neither read nor filled the cache: asked again, the client's own answer.
    let (head, again) = ask(&server, "auto", "slow");
    assert_eq!(header(&head, "x-frugal-cache"), Some("hit-exact"), "{head}");
    assert_eq!(again, served);

    // A semantic hit: its shadow asks the same upstream without the caches.
    let (head, _) = ask(&server, "loose", "How do I learn to cook?");
    assert_eq!(header(&head, "x-frugal-cache"), Some("miss"), "{head}");
    let (head, hit) = ask(&server, "loose", "What is the best way to learn cooking?");
    assert_eq!(
        header(&head, "x-frugal-cache"),
        Some("hit-semantic"),
        "{head}"
    );
    assert_eq!(hit, "echo: How do I learn to cook?");
    wait_for("the semantic hit's shadow compared", || {
        samples(&server, "semantic_cache", "loose") == 1.0
    });
    // A route's own rate overrides [serve]'s: `never` is not shadowed.
    let (head, _) = ask(&server, "never", "Name a bird.");
    assert_eq!(header(&head, "x-frugal-route"), Some("small"), "{head}");
    // The cascade's second answer was shadowed too (rate 1): both settled before stopping.
    wait_for("the second cascade shadow", || {
        samples(&server, "routing", "auto") == 2.0
    });
    assert_eq!(calls.load(Ordering::SeqCst), 4, "none for `never`");
    assert_eq!(samples(&server, "routing", "never"), 0.0);

    let (_, dir) = server.stop();
    // Each routing shadow's question and verdict, as skip examples `frugal route train`
    // reads (a semantic hit's are not: no router learns from them).
    let examples = std::fs::read_to_string(dir.path().join("shadows.jsonl")).unwrap();
    let examples: Vec<Value> = examples
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let prompts: Vec<&str> = examples
        .iter()
        .map(|e| e["prompt"].as_str().unwrap())
        .collect();
    assert_eq!(prompts, ["slow", "slow"], "{examples:?}");
    assert!(
        examples.iter().all(|e| e["ok"].is_boolean()),
        "{examples:?}"
    );
    let ledger = dir.path().join("ledger.sqlite");
    let db = rusqlite::Connection::open(&ledger).unwrap();
    // Each shadow: its call's row (its cost, no request, no verdict) and its sample's.
    type Stored = (String, i64, Option<i64>, Option<i64>, i64, i64);
    let rows: Vec<Stored> = db
        .prepare(
            "SELECT m.name, e.shadow_lever, e.shadow_agreed, e.shadow_method, e.cost, e.requests
             FROM events e JOIN dims m ON m.id = e.model
             WHERE e.shadow_lever IS NOT NULL ORDER BY m.name, e.shadow_agreed IS NULL, e.id",
        )
        .unwrap()
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let routing = frugal_cost::Lever::Routing.code();
    let semantic = frugal_cost::Lever::SemanticCache.code();
    let of = |model: &str, lever: i64| -> Vec<&Stored> {
        rows.iter()
            .filter(|r| r.0 == model && r.1 == lever)
            .collect()
    };
    let (auto, loose) = (of("auto", routing), of("loose", semantic));
    assert_eq!((auto.len(), loose.len(), rows.len()), (4, 2, 6), "{rows:?}");
    for shadow in [&auto[..], &loose[..]] {
        let (samples, calls): (Vec<&Stored>, Vec<&Stored>) =
            shadow.iter().partition(|r| r.2.is_some());
        assert_eq!(samples.len(), calls.len(), "{rows:?}");
        assert!(
            samples
                .iter()
                .all(|r| r.3.is_some() && r.4 == 0 && r.5 == 0)
        );
        assert!(calls.iter().all(|r| r.3.is_none() && r.4 > 0 && r.5 == 0));
    }

    let report = |json: bool| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
            .arg("--ledger")
            .arg(&ledger)
            .arg("report")
            .args(json.then_some("--json"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = report(false);
    assert!(
        text.contains("Quality kept beside each saving, measured online"),
        "{text}"
    );
    let v: Value = serde_json::from_str(&report(true)).unwrap();
    let quality = v["quality"].as_array().unwrap();
    assert_eq!(quality.len(), 2, "{v}");
    let line = |lever: &str| {
        quality
            .iter()
            .find(|l| l["lever"] == lever)
            .unwrap_or_else(|| panic!("{lever}: {v}"))
    };
    let (cascade, cache) = (line("routing"), line("semantic_cache"));
    assert_eq!(
        (cascade["model"].as_str(), cascade["samples"].as_u64()),
        (Some("auto"), Some(2))
    );
    assert_eq!(
        (cache["model"].as_str(), cache["samples"].as_u64()),
        (Some("loose"), Some(1))
    );
    for l in [cascade, cache] {
        let (low, high) = (
            l["kept_low"].as_f64().unwrap(),
            l["kept_high"].as_f64().unwrap(),
        );
        let kept = l["kept"].as_f64().unwrap();
        assert!(low <= kept && kept <= high && high > low, "{l}");
        assert!(l["shadow_cost"].as_i64().unwrap() > 0, "{l}");
        assert!(l["saved"].as_i64().unwrap() > 0, "{l}");
        assert!(text.contains(l["model"].as_str().unwrap()));
    }
}

/// A shadow under way when the gateway is stopped gets the drain to finish: its call and its
/// sample reach the ledger, once.
#[test]
fn a_shadow_under_way_at_shutdown_is_drained_into_the_ledger_once() {
    let (url, calls) = mock_upstream();
    let config = format!(
        "[serve]\nshadow_rate = 1.0\n\n[[serve.upstream]]\nname = \"mock\"\nurl = \"{url}\"\nmodel = \"upstream-name\"\ntimeout_s = 30\nretries = 0\n\n[[serve.route]]\nname = \"auto\"\ntiers = [\"small\", \"mock\"]\nthreshold = -1000.0\n"
    );
    let server = Server::start_with_files(&[("frugal.toml", &config)], &["--name", "small"]);
    let (head, _) = ask(&server, "auto", "slow");
    assert_eq!(header(&head, "x-frugal-route"), Some("small"), "{head}");
    wait_for("the shadow's call made", || {
        calls.load(Ordering::SeqCst) == 1
    });
    let (status, dir) = server.stop();
    assert!(status.success(), "{status:?}");
    let db = rusqlite::Connection::open(dir.path().join("ledger.sqlite")).unwrap();
    let (calls, samples): (i64, i64) = db
        .query_row(
            "SELECT count(*) FILTER (WHERE shadow_agreed IS NULL),
                    count(*) FILTER (WHERE shadow_agreed IS NOT NULL)
             FROM events WHERE shadow_lever IS NOT NULL",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((calls, samples), (1, 1));
}

#[test]
fn a_shadow_rate_outside_zero_to_one_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("frugal.toml");
    let route = "[[serve.upstream]]\nname = \"mock\"\nurl = \"http://127.0.0.1:9/v1\"\n\n[[serve.route]]\nname = \"auto\"\ntiers = [\"small\", \"mock\"]\nthreshold = -1.0\n";
    let refused = |toml: &str, flag: &[&str]| {
        std::fs::write(&config, toml).unwrap();
        let mut args = vec![
            "--config",
            config.to_str().unwrap(),
            "serve",
            "--no-meter",
            "--no-semantic-cache",
            "--name",
            "small",
        ];
        args.extend(flag);
        common::serve_error(&args)
    };
    let err = refused(route, &["--shadow-rate", "1.5"]);
    assert!(
        err.contains(
            "shadow_rate must be a share of cheap answers in [0, 1], such as 0.02, not 1.5"
        ),
        "{err}"
    );
    let err = refused(&format!("[serve]\nshadow_rate = -0.1\n{route}"), &[]);
    assert!(err.contains("not -0.1"), "{err}");
    let err = refused(&format!("{route}shadow_rate = 2.0\n"), &[]);
    assert!(
        err.contains("route `auto`: shadow_rate must be a share"),
        "{err}"
    );
}
