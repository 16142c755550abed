//! End-to-end: `frugal serve` with no price prices its machine from the cloud's metadata
//! (a fake AWS endpoint here), or, off the clouds, from the catalog, and says which.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, put};

/// An AWS IMDSv2 endpoint saying this is a g5.xlarge, on a runtime of its own.
fn fake_aws() -> (String, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let app = Router::new()
        .route("/latest/api/token", put(|| async { "tok" }))
        .route(
            "/latest/meta-data/instance-type",
            get(|h: HeaderMap| async move {
                if h.get("x-aws-ec2-metadata-token")
                    .is_some_and(|t| t == "tok")
                {
                    "g5.xlarge".into_response()
                } else {
                    StatusCode::UNAUTHORIZED.into_response()
                }
            }),
        );
    let url = runtime.block_on(frugal_testkit::loopback::serve(app));
    (url, runtime)
}

/// `frugal serve` with no price and `metadata_url`: its pricing line, once it listens.
fn pricing_line(metadata_url: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .arg("--ledger")
        .arg(dir.path().join("ledger.sqlite"))
        .args(["serve", "--port", "0", "--no-cache", "--model"])
        .arg(common::model())
        .args(["--metadata-url", metadata_url])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pricing = None;
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains("frugal serve: priced as") {
            pricing = Some(line);
        } else if line.contains("http://") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    pricing.expect("no pricing line before the server listened")
}

#[test]
fn serve_without_a_price_prices_its_machine_and_says_how() {
    let (url, _runtime) = fake_aws();
    let line = pricing_line(&url);
    assert!(
        line.contains(
            "priced as aws g5.xlarge $1.006/h (catalog, on demand; aws g5.xlarge from the \
             instance metadata); --price-per-hour or --instance overrides it"
        ),
        "{line}"
    );

    // Off the clouds: nothing listens there. The answer comes within the detection timeout.
    let closed = format!("http://127.0.0.1:{}", frugal_testkit::free_port().unwrap());
    let started = Instant::now();
    let line = pricing_line(&closed);
    assert!(
        line.contains("no cloud metadata: the cheapest catalog CPU instance with >= "),
        "{line}"
    );
    assert!(
        line.contains("--price-per-hour or --instance overrides it"),
        "{line}"
    );
    assert!(!line.contains("at $0.000/h"), "{line}");
    eprintln!("off the clouds, after {:?}: {line}", started.elapsed());
}

/// Issue 32: `serve --no-meter` answered `x-frugal-cost-usd: 0`: it skipped pricing the
/// machine along with the ledger. The request is still priced; only its row is not written.
#[test]
fn no_meter_skips_the_ledger_not_the_price() {
    let (url, _runtime) = fake_aws();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .arg("--ledger")
        .arg(dir.path().join("ledger.sqlite"))
        .args([
            "serve",
            "--port",
            "0",
            "--no-meter",
            "--no-cache",
            "--model",
        ])
        .arg(common::model())
        .args(["--metadata-url", &url])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = lines
        .find_map(|l| {
            let l = l.unwrap();
            let rest = l.split("http://").nth(1)?;
            Some(rest.split('/').next()?.to_owned())
        })
        .expect("the server did not start");
    let body = r#"{"messages":[{"role":"user","content":"Say hi."}],"max_tokens":4}"#;
    let (status, head, text) = common::request_at(&addr, "POST", "/v1/chat/completions", body, "");
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status, 200, "{text}");
    let cost: f64 = common::header(&head, "x-frugal-cost-usd")
        .unwrap()
        .parse()
        .unwrap();
    assert!(cost > 0.0, "{head}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["usage"]["cost_usd"].as_f64().unwrap() > 0.0, "{v}");
    assert!(
        !dir.path().join("ledger.sqlite").exists(),
        "nothing metered"
    );
}
