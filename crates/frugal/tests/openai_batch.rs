//! End-to-end: the official OpenAI Python client's Batch API flow against `frugal serve`,
//! then the ledger holds each line, under the workload `batch` with its batch as the run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use common::Server;
use frugal_cost::Ledger;
use frugal_cost::ledger::Window;

#[test]
fn the_official_openai_client_runs_a_batch() {
    let server = Server::start(&[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_batch.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(format!("http://{}/v1", server.addr))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.logs()
    );
    let said: Vec<&str> = stdout.split_whitespace().collect();
    let [completed, cancelled, cancelled_lines] = said[..] else {
        panic!("{stdout}")
    };
    let cancelled_lines: u64 = cancelled_lines.parse().unwrap();
    assert!(server.dir().join("frugal-batches/batches.sqlite").exists());
    let (status, dir) = server.stop();
    assert!(status.success(), "{status:?}");

    // Each answered line is one request in the ledger, run by its batch.
    let ledger = Ledger::open(dir.path().join("ledger.sqlite")).unwrap();
    let names = ledger.names().unwrap();
    let mut by_run: HashMap<String, u64> = HashMap::new();
    ledger
        .scan(Window::default(), |r| {
            if names.get(r.workload) == "batch" {
                let run = r.run.map(|id| names.get(id).to_owned()).unwrap_or_default();
                *by_run.entry(run).or_default() += r.requests;
            }
        })
        .unwrap();
    assert_eq!(by_run.get(completed), Some(&4), "{by_run:?}");
    assert_eq!(
        by_run.get(cancelled).copied().unwrap_or(0),
        cancelled_lines,
        "{by_run:?}"
    );
    // `frugal report` shows them as the workload `batch`.
    let report: serde_json::Value = serde_json::from_str(&common::report(
        dir.path().join("ledger.sqlite"),
        &["--json"],
    ))
    .unwrap();
    let batch = report["inference"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["workload"] == "batch")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(batch["requests"], 4 + cancelled_lines, "{report}");
}
