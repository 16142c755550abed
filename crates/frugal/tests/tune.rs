//! `frugal tune` end to end: real processes under the supervisor, a real SQLite state and
//! ledger, kills and a preemption notice. The trainer is tests/tune_trainer.py, whose
//! held-out loss is a fixed function of its parameters and step, so every rung result of
//! an interrupted search can be checked against an uninterrupted one.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod supervised;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use supervised::{Metadata, finish, stderr, wait_until};

const TRAINER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tune_trainer.py");

const SPACE: &str = r#"
metric = "eval_loss"
mode = "min"
resource = "step"
min_resource = 50
max_resource = 800
reduction_factor = 4
trials = 16
[space]
lr = { loguniform = [1e-4, 3e-1] }
hidden = { choice = [32, 64, 128] }
"#;

/// A machine's working directory with the space file; the ledger and store live in it.
struct Bench {
    dir: tempfile::TempDir,
}

impl Bench {
    fn new(space: &str) -> Bench {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("space.toml"), space).unwrap();
        Bench { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn state(&self) -> PathBuf {
        self.path().join("state")
    }

    /// `frugal tune` with `flags`, over the test trainer with `trainer` args.
    fn tune(&self, flags: &[&str], trainer: &[&str]) -> Child {
        Command::new(env!("CARGO_BIN_EXE_frugal"))
            .current_dir(self.path())
            .env("FRUGAL_LOG", "info")
            .args(["--ledger", "ledger.db", "tune", "--space", "space.toml"])
            .args(["--dir", "state", "--id", "t1", "--json", "--no-gpu"])
            .args(["--price-per-hour", "3.60", "--poll", "0.1"])
            .args(flags)
            .args([
                "--", "python3", TRAINER, "--lr", "{lr}", "--hidden", "{hidden}",
            ])
            .args(["--steps", "800"])
            .args(trainer)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn run(&self, flags: &[&str], trainer: &[&str]) -> Output {
        finish(self.tune(flags, trainer))
    }

    /// Rung results in the state: trial -> metric per rung (none while it is being made).
    fn results(&self) -> BTreeMap<i64, Vec<f64>> {
        let read = || -> rusqlite::Result<BTreeMap<i64, Vec<f64>>> {
            let db = rusqlite::Connection::open_with_flags(
                self.state().join("tune.db"),
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )?;
            let mut out: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
            let mut q = db.prepare("SELECT trial, metric FROM results ORDER BY trial, rung")?;
            for row in q.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, f64>(1)?)))? {
                let (t, m) = row?;
                out.entry(t).or_default().push(m);
            }
            Ok(out)
        };
        read().unwrap_or_default()
    }

    /// Every step line each trial's command wrote, in order.
    fn steps(&self, trial: u32) -> Vec<u64> {
        let path = self
            .state()
            .join(format!("trials/t{trial:03}/metrics.jsonl"));
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["step"].as_u64())
            .collect()
    }

    fn ledger(&self, sql: &str) -> Vec<(i64, String, f64)> {
        let db = rusqlite::Connection::open(self.path().join("ledger.db")).unwrap();
        let mut q = db.prepare(sql).unwrap();
        q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }
}

fn summary(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(out)
        )
    })
}

/// The trainer's held-out loss, as tune_trainer.py computes it.
fn loss(lr: f64, hidden: f64, step: f64) -> f64 {
    (lr.log10() + 2.5).powi(2) + 10.0 / step.sqrt() + 1.0 / hidden
}

#[test]
fn asha_keeps_the_best_resumes_promotions_and_bills_every_segment() {
    let bench = Bench::new(SPACE);
    let out = bench.run(&["--parallel", "2"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r = summary(&out);
    let trials = r["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 16);
    // Each rung result is the trainer's loss at the rung: the metric was read at the rung.
    for t in trials {
        let (lr, hidden) = (
            t["params"]["lr"].as_f64().unwrap(),
            t["params"]["hidden"].as_f64().unwrap(),
        );
        for x in t["results"].as_array().unwrap() {
            let step = x["resource"].as_f64().unwrap();
            let want = loss(lr, hidden, step);
            assert!((x["metric"].as_f64().unwrap() - want).abs() < 1e-9, "{t}");
        }
    }
    // The best of the trials that reached the end is the best of all trials there.
    let best_full = trials
        .iter()
        .map(|t| {
            let (lr, h) = (
                t["params"]["lr"].as_f64().unwrap(),
                t["params"]["hidden"].as_f64().unwrap(),
            );
            loss(lr, h, 800.0)
        })
        .fold(f64::INFINITY, f64::min);
    let chosen = r["best"]["metric"].as_f64().unwrap();
    assert_eq!(r["best"]["resource"], 800);
    assert!(
        chosen <= best_full * 1.01,
        "chose {chosen}, the best is {best_full}"
    );
    // Promotions resume: no trial's command starts over from step 1 twice.
    for t in 0..16 {
        let steps = bench.steps(t);
        assert_eq!(
            steps.iter().filter(|&&s| s == 1).count(),
            1,
            "trial {t} started from scratch more than once"
        );
    }
    let total = r["total_steps"].as_u64().unwrap();
    let full = r["full_steps"].as_u64().unwrap();
    assert_eq!(full, 16 * 800);
    assert!(total * 100 < full * 40, "{total} of {full}");
    // Every segment is in the ledger under the tune's id, with the trial's run; idle slot
    // time too; the summary's cost is the segments'.
    let rows = bench.ledger(
        "SELECT e.kind, coalesce(r.name, ''), CAST(e.cost AS REAL) / 1e9 FROM events e \
         JOIN dims w ON w.id = e.workload LEFT JOIN dims r ON r.id = e.run \
         WHERE w.name = 't1'",
    );
    let training_kind = frugal_cost::event::Kind::Training.code();
    let idle_kind = frugal_cost::event::Kind::Idle.code();
    let training: f64 = rows
        .iter()
        .filter(|r| r.0 == training_kind)
        .map(|r| r.2)
        .sum();
    let segments: u64 = trials.iter().map(|t| t["segments"].as_u64().unwrap()).sum();
    assert_eq!(
        rows.iter().filter(|r| r.0 == training_kind).count() as u64,
        segments
    );
    assert!(
        rows.iter().any(|r| r.0 == idle_kind),
        "idle slot time: {rows:?}"
    );
    assert!(
        rows.iter()
            .all(|r| r.0 != training_kind || r.1.starts_with("t1-t0"))
    );
    assert!(
        (training - r["cost_usd"].as_f64().unwrap()).abs() < 1e-6,
        "{rows:?}"
    );
    assert!(r["saved_usd"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["slot_utilization"].as_f64().unwrap() > 0.5, "{r}");
}

#[test]
fn kills_and_a_notice_lose_no_rung_result_and_restart_no_trial_from_scratch() {
    let reference = Bench::new(SPACE);
    let out = reference.run(&[], &["--step-ms", "4"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let want = reference.results();

    let meta = Metadata::start();
    let bench = Bench::new(SPACE);
    let spot = [
        "--spot",
        "--notice",
        "aws",
        "--metadata-url",
        meta.url.as_str(),
    ];
    let trainer = ["--step-ms", "4"];
    let results = || bench.results().values().map(Vec::len).sum::<usize>();
    for kill in 1..=3 {
        let mut child = bench.tune(&spot, &trainer);
        let before = results();
        wait_until(
            Duration::from_secs(60),
            || results() >= before + 2,
            || format!("kill {kill}: no rung results came ({})", results()),
        );
        // Mid-trial: a segment runs (its pid file stands until it is billed).
        std::thread::sleep(Duration::from_millis(150));
        wait_until(
            Duration::from_secs(30),
            || (0..16).any(|t| bench.state().join(format!("trials/t{t:03}/pid")).exists()),
            || "no trial is running".into(),
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let child = bench.tune(&spot, &trainer);
    // Each kill left a trial's segment unbilled; the next tuner bills it.
    wait_until(
        Duration::from_secs(30),
        || {
            let failed = frugal_cost::event::Outcome::Failed.code();
            bench
                .ledger("SELECT kind, '', CAST(outcome AS REAL) FROM events")
                .iter()
                .filter(|r| r.2 == failed as f64)
                .count()
                >= 3
        },
        || "the killed tuners' segments are not in the ledger".into(),
    );
    let before = results();
    wait_until(
        Duration::from_secs(60),
        || results() > before,
        || "no rung result after the kills".into(),
    );
    // The notice stands (a fixed time): the trials checkpoint and the tuner exits 75 well
    // before its deadline, without waiting for the machine to go.
    let noticed = Instant::now();
    meta.preempt(Duration::from_secs(120));
    let out = finish(child);
    let took = noticed.elapsed();
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(took < Duration::from_secs(120), "exit 75 after {took:?}");
    eprintln!("tune: notice to exit 75 in {:.2} s", took.as_secs_f64());
    assert!(stderr(&out).contains("aws notice"), "{}", stderr(&out));
    meta.clear();
    // The machine is gone: a new one with the same store picks the search up.
    let store = bench.path().join("checkpoints");
    let new = Bench::new(SPACE);
    let flags = [&spot[..], &["--store", store.to_str().unwrap()]].concat();
    let out = new.run(&flags, &trainer);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("restored the search's state"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        new.results(),
        want,
        "the same search as without interruptions"
    );
    // A killed trial goes on from its last checkpoint (the trainer publishes one at each
    // rung and every 100 steps); only one killed before its first starts over.
    for t in 0..16 {
        let steps = [bench.steps(t), new.steps(t)].concat();
        for (i, pair) in steps.windows(2).enumerate() {
            if pair[1] == 1 {
                let reached = steps[..=i].iter().max().unwrap();
                assert!(*reached < 50, "trial {t} restarted from step 0: {steps:?}");
            }
        }
    }
}

#[test]
fn a_crash_is_retried_once_then_fails_with_its_log_and_a_hang_times_out() {
    let bench = Bench::new(&SPACE.replace("trials = 16", "trials = 3"));
    let out = bench.run(&[], &["--crash-at", "120"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r = summary(&out);
    assert!(
        r["trials"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["status"] != "failed"),
        "one crash is retried: {r}"
    );

    let bench = Bench::new(&SPACE.replace("trials = 16", "trials = 2"));
    let out = bench.run(&[], &["--crash-at", "30", "--crash-always"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("every trial failed"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("diverged at step 30"),
        "the log's tail: {}",
        stderr(&out)
    );

    let bench = Bench::new(&SPACE.replace("trials = 16", "trials = 1"));
    let flags = [
        "--trial-timeout",
        "1",
        "--signal-deadline",
        "2",
        "--stop-grace",
        "1",
    ];
    let out = bench.run(&flags, &["--hang-at", "20"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no step reported for 1 s"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn faults_in_the_command_or_the_space_are_named() {
    let bench = Bench::new(SPACE);
    let out = bench.run(&[], &["--ignore-resume"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("ignores FRUGAL_RESUME_FROM: resumed from checkpoint 50"),
        "{}",
        stderr(&out)
    );

    let bench = Bench::new(SPACE);
    let out = bench.run(&[], &["--no-metric"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("never reported `eval_loss` by step 50") && err.contains("step, step_s"),
        "said after the first rung, naming the fields seen: {err}"
    );

    let bench = Bench::new(&SPACE.replace("[1e-4, 3e-1]", "[1e-2, 1e-2]"));
    let out = bench.run(&[], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("lr"), "{}", stderr(&out));

    // A second tuner on the same state is refused while the first runs.
    let bench = Bench::new(SPACE);
    let mut first = bench.tune(&[], &["--step-ms", "20"]);
    wait_until(
        Duration::from_secs(30),
        || bench.state().join("tune.db").exists(),
        || "the first tuner did not start".into(),
    );
    let out = bench.run(&[], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("another tuner is running"),
        "{}",
        stderr(&out)
    );
    first.kill().unwrap();
    first.wait().unwrap();
}

#[test]
fn a_launcher_runs_each_trial_with_the_contract_in_its_words() {
    let bench = Bench::new(&SPACE.replace("trials = 16", "trials = 4"));
    // `env -i` passes nothing on: the trial sees only what {env} says.
    let launcher = "env -i PATH=\"$PATH\" {env} {command}";
    let out = bench.run(&["--launcher", launcher, "--parallel", "2"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r = summary(&out);
    assert_eq!(
        r["best"]["resource"], 200,
        "one trial of four is promoted: {r}"
    );
}

#[test]
fn a_dollar_budget_starts_no_trial_once_spent() {
    // $3.60 an hour is $0.001 a second: a budget of a few seconds of one slot.
    let bench = Bench::new(&SPACE.replace("trials = 16", "budget_usd = \"0.002\""));
    let out = bench.run(&[], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r = summary(&out);
    let trials = r["trials"].as_array().unwrap().len();
    assert!((1..16).contains(&trials), "{trials} trials: {r}");
    assert!(
        stderr(&out).contains("no more trials start"),
        "{}",
        stderr(&out)
    );
    // Spent, then overshot only by what ran on: the trial running when the budget ran out
    // and the promotions of the trials already started.
    let cost = r["cost_usd"].as_f64().unwrap();
    assert!((0.002..0.01).contains(&cost), "{cost}: {r}");
}
