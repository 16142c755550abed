//! The watchdog on deliberately starved runs of the example trainer, and on a healthy one.
//! Its own test binary: the runs measure CPU use, so nothing else may run beside them.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod supervised;

use frugal_train::watchdog::{HostLoad, HostTicks};
use supervised::*;

/// Share of the cores others and steal must have taken, as the test measured it over a run,
/// for a contention diagnosis to stand (the watchdog's own bar is 25% over its last 30 s).
const MEASURED_CONTENTION: f64 = 0.15;

/// The host's CPUs over a run, and what the run (this process's waited-for children) used.
struct Measure {
    host: HostTicks,
    children_s: f64,
}

fn children_cpu_s() -> f64 {
    // utime and stime of the waited-for children: fields 16 and 17 of /proc/self/stat.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    (f[13] + f[14]) / ticks()
}

fn ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64
}

impl Measure {
    fn start() -> Measure {
        Measure {
            host: HostTicks::parse(&std::fs::read_to_string("/proc/stat").unwrap()).unwrap(),
            children_s: children_cpu_s(),
        }
    }

    /// Others and steal over the run, as a share of the cores.
    fn contention(&self) -> (f64, HostLoad) {
        let now = HostTicks::parse(&std::fs::read_to_string("/proc/stat").unwrap()).unwrap();
        let own = children_cpu_s() - self.children_s;
        let load = HostLoad::between(self.host, now, own, ticks()).unwrap();
        ((load.others + load.steal) / load.cpus, load)
    }
}

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
    // Each run is a run of its own: a store and a ledger apiece. Also what the host's other
    // processes and the hypervisor took meanwhile, as a share of the cores.
    let run = |trainer: &[&str]| {
        let shared = Shared2::new();
        let m = Machine::new();
        let measure = Measure::start();
        let out = finish(m.train(&shared, &["--notice", "none"], trainer));
        let (contended, load) = measure.contention();
        eprintln!("host over the run: {load:?}, others and steal {contended:.2} of the cores");
        assert!(out.status.success());
        let busy = shared.segments()[0].4.unwrap();
        // The share of step time the trainer says it waited for data.
        let metrics = std::fs::read_to_string(m.metrics()).unwrap();
        let (mut step_s, mut data_s) = (0.0, 0.0);
        for line in metrics.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            step_s += v["step_s"].as_f64().unwrap();
            data_s += v["data_s"].as_f64().unwrap();
        }
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            busy,
            contended,
            data_s / step_s,
        )
    };
    // A contention diagnosis stands only on a host that was measured to be contended.
    let contention_is_real = |out: &str, contended: f64| {
        if out.contains("host contention") {
            assert!(
                contended >= MEASURED_CONTENTION,
                "host contention claimed, but others and steal took only {contended:.2} of the cores: {out}"
            );
            true
        } else {
            false
        }
    };
    // Healthy: batches that fill every core, no sleeping, batches built inline (loader
    // threads would take their turns on the same two cores, between steps of ~1 ms).
    let (healthy, busy, contended, _) = run(&[
        "--loader-threads",
        "0",
        "--step-delay-ms",
        "0",
        "--steps",
        &healthy_steps,
        "--batch",
        "64",
        "--hidden",
        "128",
    ]);
    assert!(!healthy.contains("batch is too small"), "{healthy}");
    if !contention_is_real(&healthy, contended) {
        assert!(!healthy.contains("watchdog:"), "{healthy}");
        // On a host others share, the run gets only what they leave it.
        if contended < MEASURED_CONTENTION {
            assert!(busy > 0.75, "the healthy run keeps the cores busy: {busy}");
        }
    }
    // Starved: every batch takes 10 ms to load in the training loop; its own waits,
    // contended host or not.
    let (starved, busy, _, _) = run(&[
        "--step-delay-ms",
        "0",
        "--data-delay-ms",
        "10",
        "--loader-threads",
        "0",
    ]);
    assert!(
        starved.contains("watchdog:") && starved.contains("waits for data"),
        "{starved}"
    );
    assert!(
        busy < 0.5,
        "the ledger prices the idle share as waste: {busy}"
    );
    // Tiny batches: one chunk of work a step, so one core of two.
    let (tiny, busy, contended, _) = run(&[
        "--step-delay-ms",
        "0",
        "--steps",
        &tiny_steps,
        "--batch",
        "1",
        "--hidden",
        "128",
    ]);
    assert!(
        tiny.contains("batch is too small") || contention_is_real(&tiny, contended),
        "{tiny}"
    );
    assert!(busy < 0.75, "{busy}");
    // The same 10 ms a batch beside a step that sleeps 4 ms (a noisy host cannot shorten
    // it): loaded in the training loop, the steps wait for the data...
    let slow = |loaders| {
        let knobs = ["--step-delay-ms", "4", "--data-delay-ms", "10"];
        [&knobs[..], &["--loader-threads", loaders]].concat()
    };
    let (inline, _, _, waiting) = run(&[&slow("0")[..], &["--steps", "200"]].concat());
    assert!(inline.contains("waits for data"), "{waiting:.2}: {inline}");
    // ...while four loader threads, 2.5 ms of delay a batch each, build them ahead: the
    // watchdog still speaks (the run sleeps), but not of data.
    // (800 steps of ~4 ms: past the 2 s a diagnosis needs.)
    let (ahead, _, _, waiting) = run(&[&slow("4")[..], &["--steps", "800"]].concat());
    assert!(
        waiting < 0.1,
        "{waiting:.2} of the step time waits for data"
    );
    assert!(
        ahead.contains("watchdog:") && !ahead.contains("waits for data"),
        "{ahead}"
    );
}
