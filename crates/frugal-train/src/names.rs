//! How runs, searches and signals are named on the command line. A run's or a search's
//! default id is a hash of what it runs, so the same command resumes the same run on any
//! machine.

use std::ffi::OsString;

use nix::sys::signal::Signal;
use sha2::{Digest, Sha256};

/// `run-` and the first 12 hex digits of the command's hash.
pub fn run_id(command: &[OsString]) -> String {
    let mut h = Sha256::new();
    for a in command {
        h.update(a.as_encoded_bytes());
        h.update([0]);
    }
    short("run", h)
}

/// `tune-` and the first 12 hex digits of the search space's and the command's hash.
pub fn search_id(space: &str, command: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(space.as_bytes());
    for a in command {
        h.update([0]);
        h.update(a.as_bytes());
    }
    short("tune", h)
}

fn short(prefix: &str, h: Sha256) -> String {
    let hex: String = h.finalize()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{prefix}-{hex}")
}

/// A signal by its name, with or without `SIG`, in any case (`usr1`, `SIGUSR1`).
pub fn signal(name: &str) -> Result<Signal, String> {
    let upper = name.trim().to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    full.parse()
        .map_err(|_| format!("`{name}` is not a signal name (e.g. SIGUSR1)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_signals_read_by_name() {
        let command = [OsString::from("python"), OsString::from("train.py")];
        assert_eq!(run_id(&command), run_id(&command));
        assert!(run_id(&command).starts_with("run-") && run_id(&command).len() == 16);
        assert_ne!(search_id("a", &[]), search_id("b", &[]));
        assert_eq!(signal("usr1"), Ok(Signal::SIGUSR1));
        assert_eq!(signal(" SIGTERM "), Ok(Signal::SIGTERM));
        assert!(signal("SIGNOPE").unwrap_err().contains("not a signal name"));
    }
}
