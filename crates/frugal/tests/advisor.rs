//! The precision and utilization advisor end to end: trainers that claim to compute in FP32
//! on an instance with A100s, or to starve on data, under `frugal train`; the watchdog's
//! diagnosis, the ledger's MFU against a hand computation, and `frugal report --json`'s
//! levers with their dollars. And the example trainer's MFU against its model's FLOPs
//! counted by hand.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod supervised;

use std::process::{Command, Output};

use supervised::*;

/// A trainer in a few lines of shell: `steps` steps of `step_s` seconds each, of which
/// `data_s` wait for data, each claiming `flops` model FLOPs at `precision`.
fn script(steps: u32, step_s: f64, data_s: f64, flops: f64, precision: &str) -> String {
    format!(
        r#"i=1
while [ $i -le {steps} ]; do
  sleep {step_s}
  echo "{{\"step\":$i,\"step_s\":{step_s},\"data_s\":{data_s},\"sync_s\":0,\"tokens\":4096,\"flops\":{flops},\"precision\":\"{precision}\"}}" >> "$FRUGAL_METRICS"
  i=$((i+1))
done"#
    )
}

/// `frugal train --run RUN FLAGS -- sh -c SCRIPT` in a fresh working directory.
fn train(shared: &Shared2, run: &str, flags: &[&str], script: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let child = shared
        .train_in(dir.path())
        .args(["--run", run, "--no-gpu", "--notice", "none"])
        .args(flags)
        .args(["--", "sh", "-c", script])
        .spawn()
        .unwrap();
    let out = finish(child);
    assert!(out.status.success());
    out
}

/// A segment in the ledger: cost in nano-dollars, mfu, precision code, data stall.
type Advised = (i64, Option<f64>, Option<i64>, Option<f64>);

/// A run's segments in the ledger.
fn advised(shared: &Shared2, run: &str) -> Vec<Advised> {
    let db = rusqlite::Connection::open(&shared.ledger).unwrap();
    let mut q = db
        .prepare(
            "SELECT e.cost, e.mfu, e.precision, e.data_stall
             FROM events e JOIN dims d ON d.id = e.run
             WHERE d.name = ?1 ORDER BY e.id",
        )
        .unwrap();
    q.query_map([run], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs()
}

/// The report's lever called `name`, with its dollars in nano-dollars; fails if missing.
fn lever(report: &serde_json::Value, name: &str) -> (i64, String) {
    let levers = report["levers"].as_array().unwrap();
    let l = levers
        .iter()
        .find(|l| l["lever"] == name)
        .unwrap_or_else(|| panic!("no `{name}` lever in {levers:#?}"));
    (
        l["dollars"].as_i64().unwrap(),
        l["basis"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn fp32_on_a100s_and_a_starved_loader_become_levers_with_dollars() {
    let shared = Shared2::new();
    // 40 steps of 0.1 s at 4.8e11 FLOPs: 4.8 TFLOP/s. On p4d.24xlarge's 8 A100s in FP32
    // (19.5 TFLOPS each, 156 together) that is an MFU of 4.8 / 156 = 3.08%.
    let fp32 = train(
        &shared,
        "fp32",
        &["--instance", "p4d.24xlarge"],
        &script(40, 0.1, 0.0, 4.8e11, "fp32"),
    );
    let log = String::from_utf8_lossy(&fp32.stdout);
    assert!(
        log.contains(
            "watchdog: the run computes in FP32 on 8 x A100: BF16 autocast raises the peak 16x \
             (19.5 -> 312 TFLOPS); MFU 3.1%; try: autocast"
        ),
        "{log}"
    );
    let segments = advised(&shared, "fp32");
    assert_eq!(segments.len(), 1, "{segments:?}");
    let (fp32_cost, mfu, precision, stall) = segments[0];
    assert!(close(mfu.unwrap(), 4.8 / 156.0), "{mfu:?}");
    assert_eq!(precision, Some(frugal_cost::Precision::Fp32.code()));
    assert_eq!(stall, Some(0.0));

    // A BF16 run on an A10G whose loader takes 40% of every step.
    train(
        &shared,
        "starved",
        &["--instance", "g5.xlarge"],
        &script(40, 0.1, 0.04, 1e11, "bf16"),
    );
    let (starved_cost, _, _, stall) = advised(&shared, "starved")[0];
    assert!(close(stall.unwrap(), 0.4), "{stall:?}");

    let report: serde_json::Value = serde_json::from_str(&shared.report(&["--json"])).unwrap();
    // Precision: the whole segment computes (no waits), and at 3% MFU the 16x rise is
    // believable: 15/16 of its cost.
    let (dollars, basis) = lever(&report, "train in a faster precision");
    assert!(dollars > 0, "{dollars}");
    assert!(
        (dollars - fp32_cost * 15 / 16).abs() <= 1,
        "{dollars} of {fp32_cost}"
    );
    assert!(
        basis.starts_with(
            "run `fp32` computes in FP32 on 8 x A100: BF16 autocast raises the peak 16x \
             (19.5 -> 312 TFLOPS); at its MFU of 3.1% that is about $"
        ),
        "{basis}"
    );
    // The input pipeline: 40% of the starved run's cost waited on data.
    let (dollars, basis) = lever(&report, "keep the input pipeline ahead");
    assert!(dollars > 0, "{dollars}");
    assert!(
        (dollars - starved_cost * 2 / 5).abs() <= 1,
        "{dollars} of {starved_cost}"
    );
    assert!(
        basis.starts_with(
            "input pipeline stalls 40% of each step of run `starved`: more loader workers / prefetch"
        ),
        "{basis}"
    );
    let runs = report["training"].as_array().unwrap();
    let run = runs.iter().find(|r| r["run"] == "fp32").unwrap();
    assert_eq!(run["precision"], "fp32");
    assert!(close(run["mfu"].as_f64().unwrap(), 4.8 / 156.0), "{run}");
    // The terminal report says the same.
    let text = shared.report(&[]);
    assert!(text.contains("train in a faster precision"), "{text}");
    assert!(text.contains("3.1% fp32"), "{text}");
}

#[test]
fn a_cpu_run_measures_mfu_against_a_given_peak() {
    let shared = Shared2::new();
    let out = train(
        &shared,
        "cpu",
        &["--price-per-hour", "0.5", "--peak-tflops", "0.5"],
        &script(12, 0.05, 0.0, 1e9, "fp32"),
    );
    // 1e9 FLOPs in 0.05 s are 20 GFLOP/s: 4% of 0.5 TFLOPS. No catalog accelerator: nothing
    // to say about precision.
    let (_, mfu, _, _) = advised(&shared, "cpu")[0];
    assert!(close(mfu.unwrap(), 0.04), "{mfu:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("4.0% fp32"));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("autocast raises"));
    let report: serde_json::Value = serde_json::from_str(&shared.report(&["--json"])).unwrap();
    let names: Vec<&str> = report["levers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["lever"].as_str())
        .collect();
    assert!(!names.contains(&"train in a faster precision"), "{names:?}");
    // A peak that is no peak is refused.
    let bad = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .arg("--ledger")
        .arg(&shared.ledger)
        .args(["train", "--peak-tflops", "0", "--", "true"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("--peak-tflops: `0` is not a positive number"),
        "{err}"
    );
}

/// The example trainer's model FLOPs a step, counted by hand from its model (model.rs): per
/// sample, context·embed·hidden multiply-adds into the hidden layer and hidden·vocab out of
/// it; backward does each twice (the weights' gradient and the input's), and a
/// multiply-add is 2 FLOPs: 6 FLOPs per multiply-add, times the batch.
fn example_trainer_flops(batch: f64, context: f64, embed: f64, hidden: f64, vocab: f64) -> f64 {
    6.0 * batch * (context * embed * hidden + hidden * vocab)
}

#[test]
fn the_example_trainers_mfu_matches_a_hand_computation() {
    let shared = Shared2::new();
    let m = Machine::new();
    let out = finish(m.train(&shared, &["--notice", "none", "--peak-tflops", "0.05"], &[]));
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(m.metrics())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let step_s: f64 = lines.iter().map(|l| l["step_s"].as_f64().unwrap()).sum();
    let (_, mfu, _, _) = advised(&shared, "r1")[0];
    if lines[0].get("flops").is_none() {
        // A trainer that reports no FLOPs gets no MFU: nothing is made up.
        eprintln!("the example trainer reports no `flops` yet: no MFU to check");
        assert_eq!(mfu, None);
        return;
    }
    // MODEL's shape: batch 16, context 8, embed 16, hidden 32, tinyshakespeare's 65 letters.
    let per_step = example_trainer_flops(16.0, 8.0, 16.0, 32.0, 65.0);
    for l in &lines {
        assert_eq!(l["flops"].as_f64(), Some(per_step), "{l}");
    }
    let by_hand = per_step * lines.len() as f64 / step_s / 0.05e12;
    assert!(close(mfu.unwrap(), by_hand), "{mfu:?} against {by_hand}");
}
