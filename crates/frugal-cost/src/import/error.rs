//! Why an import stored nothing: a file that cannot be read, a bad header, bad rows, or
//! rows (or the whole file) imported before.

use std::path::PathBuf;

use serde::Serialize;

use crate::ledger::{LedgerError, PriorImport};
use crate::money::Millis;

/// A row that could not be imported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RowError {
    /// 1-based line in the file (the CSV header is line 1).
    pub line: u64,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Header { path: PathBuf, message: String },
    #[error("{path}: {} bad row{}, nothing imported (pass --skip-invalid to import the good rows):\n{}",
        .total, if *.total == 1 { "" } else { "s" }, list(.rows, *.total))]
    BadRows {
        path: PathBuf,
        rows: Vec<RowError>,
        total: u64,
    },
    #[error(
        "{path} was already imported on {} from {} (sha256 {}); nothing imported (pass --allow-duplicates to import it again)",
        utc_minute(.prior.at_ms), .prior.source, short_sha(.prior.sha256.as_deref())
    )]
    AlreadyImported {
        path: PathBuf,
        prior: Box<PriorImport>,
    },
    #[error(
        "{path}: {} already imported (the first by {} on {}); nothing imported (pass --allow-duplicates to import {} again): {}",
        rows_text(*.total), .first.source, utc_minute(.first.at_ms),
        if *.total == 1 { "it" } else { "them" }, lines_text(.lines, *.total)
    )]
    DuplicateRows {
        path: PathBuf,
        /// Lines of the first rows imported before.
        lines: Vec<u64>,
        total: u64,
        /// The import that stored the first of them.
        first: Box<PriorImport>,
    },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

fn rows_text(total: u64) -> String {
    match total {
        1 => "1 row was".to_owned(),
        n => format!("{n} rows were"),
    }
}

fn lines_text(lines: &[u64], total: u64) -> String {
    let named: Vec<String> = lines.iter().map(u64::to_string).collect();
    let word = if total == 1 { "line" } else { "lines" };
    let more = total.saturating_sub(lines.len() as u64);
    let rest = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!("{word} {}{rest}", named.join(", "))
}

fn short_sha(sha256: Option<&str>) -> &str {
    sha256.map_or("?", |s| s.get(..12).unwrap_or(s))
}

fn utc_minute(ms: Millis) -> String {
    crate::present::utc(ms, "%Y-%m-%d %H:%M UTC")
}

fn list(rows: &[RowError], total: u64) -> String {
    let mut s: Vec<String> = rows
        .iter()
        .map(|r| format!("  line {}: {}", r.line, r.message))
        .collect();
    if total as usize > rows.len() {
        s.push(format!("  ... and {} more", total as usize - rows.len()));
    }
    s.join("\n")
}
