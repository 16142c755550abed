//! `frugal batch run` end to end on the default model: `kill -9` at random moments, a spot
//! notice that moves the job to a fresh directory through a store, and the faults and bad
//! inputs a job must refuse or survive.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod supervised;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use supervised::common::{self, model, said};
use supervised::{Metadata, wait_until};

const FRUGAL: &str = env!("CARGO_BIN_EXE_frugal");

/// A batch of `n` greedy chat lines, one per question of the cascade set.
fn write_input(path: &Path, n: usize, max_tokens: u32) {
    let questions = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/cascade/questions.jsonl"),
    )
    .unwrap();
    let text: String = questions
        .lines()
        .take(n)
        .enumerate()
        .map(|(i, q)| {
            let q: serde_json::Value = serde_json::from_str(q).unwrap();
            let body = serde_json::json!({
                "model": "SmolLM2-135M-Instruct.Q4_1",
                "messages": [{ "role": "user", "content": q["question"] }],
                "max_tokens": max_tokens,
                "temperature": 0,
            });
            format!(
                "{}\n",
                serde_json::json!({ "custom_id": format!("q{i}"), "method": "POST", "url": "/v1/chat/completions", "body": body })
            )
        })
        .collect();
    assert_eq!(text.lines().count(), n);
    std::fs::write(path, text).unwrap();
}

/// `frugal batch run INPUT --output OUT ...` in `dir`, with its ledger there.
fn batch(dir: &Path, input: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(FRUGAL);
    c.current_dir(dir)
        .arg("--ledger")
        .arg(dir.join("ledger.sqlite"))
        .args(["batch", "run"])
        .arg(input)
        .args(["--output", "out.jsonl", "--model-file"])
        .arg(model())
        .args(["--concurrency", "4", "--price-per-hour", "0.40"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Each output line's answer by custom_id; a custom_id twice fails.
fn answers(path: &Path) -> HashMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut seen = HashMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let id = v["custom_id"].as_str().unwrap().to_owned();
        let answer = v["response"]["body"]["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(v["response"]["status_code"], 200, "{line}");
        assert!(seen.insert(id.clone(), answer).is_none(), "{id} twice");
    }
    seen
}

fn lines_in(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// Starts a run and kills it (SIGKILL) once `at` more lines than before are in its output.
fn kill_after(dir: &Path, input: &Path, at: usize) {
    let before = lines_in(&dir.join("out.jsonl"));
    let mut child = batch(dir, input, &[]).spawn().unwrap();
    wait_until(
        Duration::from_secs(120),
        || lines_in(&dir.join("out.jsonl")) >= before + at,
        || format!("no progress past {before} lines"),
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

fn finish(child: Child) -> Output {
    let out = child.wait_with_output().unwrap();
    eprintln!("--- frugal batch\n{}", said(&out));
    out
}

#[test]
fn kills_and_a_spot_notice_with_a_move_leave_each_line_once_with_the_uninterrupted_answers() {
    const LINES: usize = 80;
    let reference = tempfile::tempdir().unwrap();
    let input = reference.path().join("in.jsonl");
    write_input(&input, LINES, 8);
    let out = batch(reference.path(), &input, &[]).output().unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let expected = answers(&reference.path().join("out.jsonl"));
    assert_eq!(expected.len(), LINES);

    // Two kill -9s at moments that depend on how fast the machine is, then a notice.
    let first = tempfile::tempdir().unwrap();
    let input = first.path().join("in.jsonl");
    std::fs::copy(reference.path().join("in.jsonl"), &input).unwrap();
    let seed = std::process::id() as usize;
    kill_after(first.path(), &input, 3 + seed % 7);
    kill_after(first.path(), &input, 5 + seed % 11);
    let after_kills = answers(&first.path().join("out.jsonl"));
    assert!(after_kills.len() < LINES, "{}", after_kills.len());

    let metadata = Metadata::start();
    let store = tempfile::tempdir().unwrap();
    let store_url = store.path().to_str().unwrap();
    let spot = [
        "--spot",
        "--notice",
        "aws",
        "--metadata-url",
        &metadata.url,
        "--poll",
        "0.2",
        "--store",
        store_url,
        "--store-every",
        "1s",
    ];
    let before = lines_in(&first.path().join("out.jsonl"));
    let child = batch(first.path(), &input, &spot).spawn().unwrap();
    wait_until(
        Duration::from_secs(120),
        || lines_in(&first.path().join("out.jsonl")) >= before + 5,
        || "no progress before the notice".into(),
    );
    let noticed = Instant::now();
    metadata.preempt(Duration::from_secs(40));
    let out = finish(child);
    assert_eq!(out.status.code(), Some(75), "{}", said(&out));
    assert!(
        noticed.elapsed() < Duration::from_secs(25),
        "{:?}",
        noticed.elapsed()
    );
    eprintln!(
        "batch run --spot: notice to exit 75 in {:.2} s",
        noticed.elapsed().as_secs_f64()
    );
    let text = said(&out);
    assert!(text.contains("aws preemption notice"), "{text}");
    assert!(text.contains("run the same command to resume"), "{text}");
    let at_notice = answers(&first.path().join("out.jsonl"));
    assert!(
        at_notice.len() < LINES,
        "the notice came too late to test a move"
    );

    // A fresh machine: the input copied there, the state only in the store.
    let fresh = tempfile::tempdir().unwrap();
    let input = fresh.path().join("in.jsonl");
    std::fs::copy(reference.path().join("in.jsonl"), &input).unwrap();
    let out = batch(fresh.path(), &input, &["--store", store_url])
        .output()
        .unwrap();
    let text = said(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("resuming from"), "{text}");
    let done = answers(&fresh.path().join("out.jsonl"));
    assert_eq!(done.len(), LINES, "each line exactly once");
    for (id, answer) in &expected {
        assert_eq!(
            done.get(id),
            Some(answer),
            "{id}: not the uninterrupted answer"
        );
    }
    // What was answered before the move is not answered again after it.
    for (id, answer) in &at_notice {
        assert_eq!(done.get(id), Some(answer));
    }
}

#[test]
fn bad_inputs_and_a_second_run_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let line = |id: &str| {
        format!(
            r#"{{"custom_id": "{id}", "method": "POST", "url": "/v1/chat/completions", "body": {{"messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 2}}}}"#
        )
    };
    std::fs::write(
        &input,
        format!("{}\n{}\n{}\nnot json\n", line("a"), line("b"), line("a")),
    )
    .unwrap();
    let out = batch(dir.path(), &input, &[]).output().unwrap();
    let text = said(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("duplicate_custom_id"), "{text}");
    assert!(text.contains("line 3") && text.contains("line 1"), "{text}");
    assert!(text.contains("invalid_json_line"), "{text}");
    assert!(!dir.path().join("out.jsonl").exists(), "nothing ran");

    // An output in a folder that does not exist.
    std::fs::write(&input, format!("{}\n{}\n", line("a"), line("b"))).unwrap();
    let out = Command::new(FRUGAL)
        .current_dir(dir.path())
        .arg("--ledger")
        .arg(dir.path().join("ledger.sqlite"))
        .args(["batch", "run"])
        .arg(&input)
        .args(["--output", "nowhere/out.jsonl", "--no-model", "--no-meter"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));

    // A second run of a job that is running is refused by its lock.
    let long = dir.path().join("long.jsonl");
    write_input(&long, 60, 16);
    let first = batch(dir.path(), &long, &[]).spawn().unwrap();
    wait_until(
        Duration::from_secs(120),
        || lines_in(&dir.path().join("out.jsonl")) >= 1,
        || "the first run did not start".into(),
    );
    let second = batch(dir.path(), &long, &[]).output().unwrap();
    let text = said(&second);
    assert_eq!(second.status.code(), Some(1), "{text}");
    assert!(text.contains("already running"), "{text}");
    // SIGTERM: lines in flight finish, the job stops resumable.
    nix_term(first.id());
    let out = first.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", said(&out));
    let kept = answers(&dir.path().join("out.jsonl"));
    let out = batch(dir.path(), &long, &[]).output().unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let done = answers(&dir.path().join("out.jsonl"));
    assert_eq!(done.len(), 60);
    for (id, a) in kept {
        assert_eq!(done[&id], a);
    }
    // Every line is in the ledger once, as batch work.
    let lines_in_ledger = |dir: &Path| {
        let report = common::report(dir.join("ledger.sqlite"), &["--json"]);
        let report: serde_json::Value = serde_json::from_str(&report).unwrap();
        report["batch"].as_array().unwrap().clone()
    };
    let jobs = lines_in_ledger(dir.path());
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["lines"], 60, "{jobs:?}");
    assert_eq!(jobs[0]["workload"], "batch");

    // On spot, priced against the instance's on-demand price: the report says what spot saved.
    let spot = tempfile::tempdir().unwrap();
    let small = spot.path().join("in.jsonl");
    write_input(&small, 4, 4);
    let flags = ["--spot", "--instance", "g5.xlarge", "--notice", "none"];
    let out = batch(spot.path(), &small, &flags).output().unwrap();
    let text = said(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("on demand (saved"), "{text}");
    // The same job again, done: `--json` says so, money in dollars.
    let json_flags = [&flags[..], &["--json"]].concat();
    let out = batch(spot.path(), &small, &json_flags).output().unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let counts = ["lines", "finished", "failed", "answered"].map(|k| summary[k].as_u64());
    assert_eq!(counts, [Some(4), Some(4), Some(0), Some(0)], "{summary}");
    assert_eq!(summary["cost_usd"], "0.00", "{summary}");
    let jobs = lines_in_ledger(spot.path());
    let (cost, on_demand) = (
        jobs[0]["cost"].as_i64().unwrap(),
        jobs[0]["on_demand_cost"].as_i64().unwrap(),
    );
    assert!(cost > 0 && on_demand > cost, "{jobs:?}");
    assert_eq!(jobs[0]["spot_share"], 1.0);
}

/// Issue 32: `--model M.gguf` answered "no model at models/smollm2/...: pass --model
/// FILE.gguf", as `batch run` took `--model` for a served name only. Now a GGUF file runs, as
/// in `frugal serve`, and every line asks for it; a served name still names one.
#[test]
fn model_takes_a_gguf_file_as_serve_does_or_a_served_name() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    write_input(&input, 2, 2);
    // The lines ask for a model this machine does not serve by that name.
    let text = std::fs::read_to_string(&input).unwrap();
    std::fs::write(
        &input,
        text.replace("SmolLM2-135M-Instruct.Q4_1", "elsewhere"),
    )
    .unwrap();
    let run = |model: &std::ffi::OsStr, extra: &[&str]| {
        Command::new(FRUGAL)
            .current_dir(dir.path())
            .arg("--ledger")
            .arg(dir.path().join("ledger.sqlite"))
            .args(["batch", "run"])
            .arg(&input)
            .args([
                "--output",
                "out.jsonl",
                "--price-per-hour",
                "0.40",
                "--model",
            ])
            .arg(model)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(model().as_os_str(), &[]);
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(answers(&dir.path().join("out.jsonl")).len(), 2);
    let first = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    assert_eq!(
        first["response"]["body"]["model"], "SmolLM2-135M-Instruct.Q4_1",
        "{first}"
    );
    // Two files named: refused before anything loads.
    let out = run(
        model().as_os_str(),
        &["--model-file", "other.gguf", "--output", "two.jsonl"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(said(&out).contains("two model files"), "{}", said(&out));
    // A served name the gateway lacks is each line's error, not a file to load.
    let out = run(
        "elsewhere".as_ref(),
        &[
            "--model-file",
            model().to_str().unwrap(),
            "--output",
            "named.jsonl",
        ],
    );
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(lines_in(&dir.path().join("named.errors.jsonl")), 2);
}

fn nix_term(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_store_that_goes_away_mid_run_costs_nothing_and_the_job_moves_once_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    write_input(&input, 120, 16);
    let stores = tempfile::tempdir().unwrap();
    let store = stores.path().join("store");
    let away = stores.path().join("away");
    let url = store.to_str().unwrap();
    let child = batch(dir.path(), &input, &["--store", url, "--store-every", "1s"])
        .spawn()
        .unwrap();
    wait_until(
        Duration::from_secs(120),
        || store.exists() && lines_in(&dir.path().join("out.jsonl")) >= 3,
        || "no copy to the store".into(),
    );
    // The store goes away: a file where its folder was.
    std::fs::rename(&store, &away).unwrap();
    std::fs::write(&store, "not a folder").unwrap();
    let at = lines_in(&dir.path().join("out.jsonl"));
    wait_until(
        Duration::from_secs(120),
        || lines_in(&dir.path().join("out.jsonl")) >= at + 5,
        || "the job stopped while the store was away".into(),
    );
    // Longer than --store-every: a periodic copy is tried while the store is away (the job
    // has lines enough to still be running).
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::remove_file(&store).unwrap();
    std::fs::rename(&away, &store).unwrap();
    let out = finish(child);
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("was not copied"), "{}", said(&out));
    assert_eq!(answers(&dir.path().join("out.jsonl")).len(), 120);
    // The last copy holds the whole job: a fresh machine has nothing left to run.
    let fresh = tempfile::tempdir().unwrap();
    let moved = fresh.path().join("in.jsonl");
    std::fs::copy(&input, &moved).unwrap();
    let out = batch(fresh.path(), &moved, &["--store", url])
        .output()
        .unwrap();
    let text = said(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("120 lines, 0 left"), "{text}");
    assert_eq!(answers(&fresh.path().join("out.jsonl")).len(), 120);
}
