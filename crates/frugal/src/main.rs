//! The `frugal` binary: parses the command line, resolves configuration once, and runs
//! one command. Business logic lives in the library crates.

mod batch;
mod bench;
mod cli;
mod commands;
mod config;
mod data;
#[cfg(test)]
mod hints;
mod progress;
mod serve;
mod table;
mod train;
mod tune;
mod watch;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    init_tracing(args.verbose);
    match select_isa().and_then(|()| commands::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // A closed pipe (`frugal report --json | head -1`) is not a failure.
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            let mut stderr = std::io::stderr().lock();
            if err.downcast_ref::<train::Stopped>().is_some()
                || err.downcast_ref::<batch::Stopped>().is_some()
                || err.downcast_ref::<tune::Stopped>().is_some()
            {
                let _ = writeln!(stderr, "{err}");
                return ExitCode::from(train::EXIT_RESUMABLE);
            }
            let _ = writeln!(stderr, "error: {err}");
            for cause in err.chain().skip(1) {
                let _ = writeln!(stderr, "  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Whether writing stdout failed because its reader went away, written through `std::io`
/// or through `serde_json`.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == BrokenPipe)
            || e.downcast_ref::<serde_json::Error>()
                .is_some_and(|e| e.io_error_kind() == Some(BrokenPipe))
    })
}

/// Colour and other escapes only for a terminal, and never under `NO_COLOR`
/// (https://no-color.org: set and not empty).
fn ansi_for(stream: &impl IsTerminal) -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    stream.is_terminal() && !no_color
}

/// `FRUGAL_ISA` picks the local engine's kernels ([`frugal_engine::quant::Kernel`]) and
/// `FRUGAL_PREFETCH` their prefetch ([`frugal_engine::quant::Prefetch`]).
fn select_isa() -> anyhow::Result<()> {
    use anyhow::Context;
    let var = |name| {
        let value = std::env::var_os(name).unwrap_or_default();
        format!("{name}={}", value.to_string_lossy())
    };
    frugal_engine::quant::Kernel::select_from_env().with_context(|| var("FRUGAL_ISA"))?;
    frugal_engine::quant::Prefetch::set_from_env().with_context(|| var("FRUGAL_PREFETCH"))
}

fn init_tracing(verbose: u8) {
    // The tuner's trials and rung results are its progress: shown unless asked otherwise.
    let default = match verbose {
        0 => "warn,frugal_train::tune::run=info",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("FRUGAL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi_for(&std::io::stderr()))
        .init();
}
