//! The watchdog on deliberately starved runs of the example trainer, and on a healthy one.
//! Its own test binary: the runs measure CPU use, so nothing else may run beside them.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod supervised;

use supervised::*;

#[test]
fn the_watchdog_names_why_the_cpu_idles_and_is_quiet_when_busy() {
    // Runs of a few seconds in either profile: the trainer is built as the tests are.
    let steps = |debug: u32, release: u32| {
        if cfg!(debug_assertions) {
            debug
        } else {
            release
        }
        .to_string()
    };
    let (healthy_steps, tiny_steps) = (steps(200, 3000), steps(1500, 40000));
    // Each run is a run of its own: a store and a ledger apiece.
    let run = |trainer: &[&str]| {
        let shared = Shared2::new();
        let m = Machine::new();
        let out = finish(m.train(&shared, &["--notice", "none"], trainer));
        assert!(out.status.success());
        let busy = shared.segments()[0].4.unwrap();
        (String::from_utf8_lossy(&out.stdout).into_owned(), busy)
    };
    // Healthy: batches that fill every core, no sleeping.
    let (healthy, busy) = run(&[
        "--step-delay-ms",
        "0",
        "--steps",
        &healthy_steps,
        "--batch",
        "64",
        "--hidden",
        "128",
    ]);
    assert!(!healthy.contains("watchdog:"), "{healthy}");
    assert!(busy > 0.75, "the healthy run keeps the cores busy: {busy}");
    // Starved: every batch takes 10 ms to load.
    let (starved, busy) = run(&["--step-delay-ms", "0", "--data-delay-ms", "10"]);
    assert!(
        starved.contains("watchdog:") && starved.contains("waits for data"),
        "{starved}"
    );
    assert!(
        busy < 0.5,
        "the ledger prices the idle share as waste: {busy}"
    );
    // Tiny batches: one chunk of work a step, so one core of two.
    let (tiny, busy) = run(&[
        "--step-delay-ms",
        "0",
        "--steps",
        &tiny_steps,
        "--batch",
        "1",
        "--hidden",
        "128",
    ]);
    assert!(tiny.contains("batch is too small"), "{tiny}");
    assert!(busy < 0.75, "{busy}");
}
