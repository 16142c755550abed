//! The trainer as the supervisor runs it: a process with the `frugal train` environment.
//! This test target also makes `cargo test --workspace` build the trainer's binary, which
//! the supervisor's and tuner's tests in other packages start (`frugal_testkit::example_trainer`).
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

fn train(dir: &Path, out: &str, env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_frugal-example-trainer"));
    cmd.args(["--steps", "12", "--checkpoint-every", "5", "--threads", "1"])
        .arg("--out")
        .arg(dir.join(out))
        .env("FRUGAL_CHECKPOINT_DIR", dir.join("checkpoints"))
        .env_remove("FRUGAL_RESUME_FROM")
        .env_remove("FRUGAL_STOP_AT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn a_run_is_deterministic_metered_and_refuses_a_broken_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let first = train(dir.path(), "a.bin", &[("FRUGAL_METRICS", &metrics)]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 12, "a metrics line per step");
    assert_eq!(lines[11]["step"], 12);
    assert!(
        lines
            .iter()
            .all(|l| l["loss"].as_f64().is_some_and(f64::is_finite))
    );

    let again = train(dir.path(), "b.bin", &[]);
    assert!(again.status.success());
    assert_eq!(
        std::fs::read(dir.path().join("a.bin")).unwrap(),
        std::fs::read(dir.path().join("b.bin")).unwrap(),
        "the same arguments compute the same bits"
    );

    let broken = dir.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("state.bin"), b"not a checkpoint").unwrap();
    let refused = train(dir.path(), "c.bin", &[("FRUGAL_RESUME_FROM", &broken)]);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "a corrupt checkpoint exits 2"
    );
}
