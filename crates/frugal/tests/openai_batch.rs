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

/// A process's figure from /proc/PID/status (`VmRSS`, `VmHWM`), in kB.
fn vm(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

/// Uploads `lines` lines of `line(i)` (each `width` bytes with its newline) as one
/// multipart file, streamed: the file's id.
fn upload_lines(addr: &str, lines: usize, width: usize, line: impl Fn(usize) -> String) -> String {
    use std::io::{Read, Write};
    let boundary = "frugal-hostile";
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"bad.jsonl\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    let length = head.len() + lines * width + tail.len();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n{head}"
    )
    .unwrap();
    let mut chunk = Vec::with_capacity(1 << 20);
    for i in 0..lines {
        let mut l = line(i);
        l.push_str(&" ".repeat(width - 1 - l.len()));
        l.push('\n');
        chunk.extend_from_slice(l.as_bytes());
        if chunk.len() >= 1 << 20 {
            s.write_all(&chunk).unwrap();
            chunk.clear();
        }
    }
    s.write_all(&chunk).unwrap();
    s.write_all(tail.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let file: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {out}"));
    file["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{out}"))
        .to_owned()
}

/// Issue 31, item 2: a 2 MB file of a million bad lines took the gateway to 1.7 GB of
/// memory (every error kept, the file read whole), and a 200 MB one got it OOM-killed at
/// every start. A 200 MB file of bad lines, uploaded and made a batch, now fails with its
/// first errors and their count, for little memory.
#[test]
fn a_200_mb_file_of_bad_lines_fails_its_batch_for_little_memory() {
    let (url, calls) = frugal_testkit::upstream::mock_upstream();
    let config = format!(
        "[prices]\nfiles = [\"prices.toml\"]\n\n[[serve.upstream]]\nname = \"mock\"\nurl = \"{url}\"\nmodel = \"upstream-name\"\nprice = \"mock-price\"\n"
    );
    let prices = "[[model]]\nname = \"mock-price\"\ninput = 1.0\noutput = 2.0\n";
    let server = Server::start_with_files(
        &[("prices.toml", prices), ("frugal.toml", &config)],
        &["--no-model", "--no-cache"],
    );
    let idle = vm(server.pid(), "VmRSS");
    // 200 MiB, the most an upload holds: lines cut off mid-JSON, and lines of a custom_id
    // only (three problems each).
    let (lines, width) = (1 << 20, 200);
    let file = upload_lines(&server.addr, lines, width, |i| {
        if i % 2 == 0 {
            format!(
                "{{\"custom_id\": \"r{i}\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {{\"model\": \"mock\", \"messages\": ["
            )
        } else {
            format!("{{\"custom_id\": \"r{i}\"}}")
        }
    });
    let create = format!(
        r#"{{"input_file_id": "{file}", "endpoint": "/v1/chat/completions", "completion_window": "24h"}}"#
    );
    let (status, batch) = server.json("/v1/batches", &create);
    assert_eq!(status, 200, "{batch}");
    let path = format!("/v1/batches/{}", batch["id"].as_str().unwrap());
    let mut answer = String::new();
    frugal_testkit::wait_until(
        std::time::Duration::from_secs(300),
        || {
            let (_, _, body) = server.request("GET", &path, "");
            answer = body;
            answer.contains(r#""status":"failed""#)
        },
        || format!("the batch did not fail: {}", server.logs()),
    );
    let peak = vm(server.pid(), "VmHWM");
    let failed: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(failed["status"], "failed", "{failed}");
    let errors = &failed["errors"];
    assert_eq!(errors["data"].as_array().unwrap().len(), 100);
    assert_eq!(
        errors["total"],
        lines / 2 + 3 * (lines / 2) + 1,
        "and too_many_tasks"
    );
    assert!(answer.len() < 64 << 10, "{} bytes", answer.len());
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    eprintln!(
        "a 200 MiB hostile upload and its batch: RSS {idle} kB idle, VmHWM {peak} kB after ({} MB more); GET /v1/batches/{{id}} {} bytes",
        peak.saturating_sub(idle) / 1024,
        answer.len()
    );
    assert!(
        peak.saturating_sub(idle) < 300 << 10,
        "idle {idle} kB, peak {peak} kB"
    );
}
