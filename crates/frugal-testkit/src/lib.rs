//! Test support for frugal's crates, used only as a dev-dependency (`publish = false`):
//! nothing here is compiled into a product.
//!
//! - Servers a test starts and drops: [`postgres`] (a throwaway PostgreSQL), [`redis`],
//!   [`prometheus`]; [`upstream`], a mock OpenAI-compatible upstream; [`loopback`], an
//!   axum router on a loopback port, or a port that refuses or never answers.
//! - Files of the checkout: [`repo`], [`model`], [`test_model`]; [`example_trainer`], the
//!   `frugal-example-trainer` binary beside the test's own.
//! - [`free_port`], [`wait_until`], and [`signal_tree`] (freezing a server); [`secrets`],
//!   passwords for property tests.
//! - [`fuzz`]: case counts of the fuzz targets, and an allocator that caps what a parser
//!   under test may allocate.
//! - [`events`] (feature `events`): builders of ledger rows, `frugal_cost::Event` and
//!   `ReplicaSpan`.
//!
//! # Layout
//! Product crates' own unit tests use this crate too (frugal-cost's ledger tests start
//! PostgreSQL, frugal-engine's find the test model), so all of it but [`events`] depends on
//! no product crate: a testkit that depended on frugal-cost would give frugal-cost's unit
//! tests a second copy of frugal-cost, whose types are not theirs. [`events`] builds
//! frugal-cost's types, so it sits behind the `events` feature, which the tests of the
//! crates above frugal-cost enable; frugal-cost's unit tests compile the same file into
//! their own crate (a `#[path]` module, with `extern crate self as frugal_cost`), so each
//! builder is written once and builds the types of the crate that uses it.
// Test support: a failure here is the failure of the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[cfg(feature = "events")]
pub mod events;
pub mod fuzz;
pub mod loopback;
pub mod postgres;
pub mod prometheus;
pub mod redis;
pub mod secrets;
pub mod upstream;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A loopback port free when asked (the listener that found it is closed again).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Polls `done` every 20 ms until it holds; fails the test with `why()` after `limit`.
pub fn wait_until(limit: Duration, mut done: impl FnMut() -> bool, why: impl Fn() -> String) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{}", why());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` (a name `kill` knows: `STOP`, `CONT`, `KILL`) to `pid` and every process
/// below it, read from /proc: `STOP` on a server freezes it as a hung host looks to its
/// clients (connections stay open; nothing answers), `CONT` thaws it.
pub fn signal_tree(pid: u32, signal: &str) -> std::io::Result<()> {
    let mut pids = vec![pid];
    let mut i = 0;
    while i < pids.len() {
        let parent = pids[i];
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // `pid (comm) state ppid ...`: the name may hold spaces and parentheses.
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(parent) && !pids.contains(&child) {
                pids.push(child);
            }
        }
        i += 1;
    }
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids.iter().map(u32::to_string))
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "kill -{signal} {pids:?}: {status}"
        )))
    }
}

/// `relative` in the checkout (the workspace's root folder).
pub fn repo(relative: impl AsRef<Path>) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}

/// The model file at `relative` in the checkout (as `frugal_engine::LARGE_MODEL`). Fails
/// (never skips) when it is missing: CI fetches the models before testing.
pub fn model(relative: &str) -> PathBuf {
    present(repo(relative))
}

/// The test model: `FRUGAL_TEST_MODEL`, else `default` in the checkout (the engine's
/// `DEFAULT_MODEL`, which this crate does not depend on).
pub fn test_model(default: &str) -> PathBuf {
    present(std::env::var_os("FRUGAL_TEST_MODEL").map_or_else(|| repo(default), PathBuf::from))
}

fn present(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "no test model at {}: run `make models`",
        path.display()
    );
    path
}

/// The `frugal-example-trainer` binary, from the target folder this test binary runs from
/// (`target/<profile>/deps/<test>`). Cargo names a package's binaries to its own tests
/// only (`CARGO_BIN_EXE_*`), and the trainer is a package of its own; `cargo test
/// --workspace` builds it before any test runs.
pub fn example_trainer() -> PathBuf {
    let me = std::env::current_exe().expect("the test binary's path");
    let profile = me
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary in target/<profile>/deps");
    let trainer = profile.join(format!(
        "frugal-example-trainer{}",
        std::env::consts::EXE_SUFFIX
    ));
    assert!(
        trainer.is_file(),
        "no {}: run `cargo build -p frugal-example-trainer` with this test's profile \
         (`cargo test --workspace` builds it)",
        trainer.display()
    );
    trainer
}
