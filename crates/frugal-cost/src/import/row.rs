//! A row as the readers hand it over, and the rules of the fields both column sets share.

use chrono::{DateTime, NaiveDate, NaiveDateTime};
use sha2::{Digest, Sha256};

use super::error::ImportError;
use crate::event::Event;
use crate::money::Millis;

/// The one currency the ledger holds.
const CURRENCY: &str = "USD";

/// A row as read: where it is, what it holds, and the event it makes.
pub(super) struct Parsed {
    /// 1-based line in the file (the CSV header is line 1).
    pub(super) line: u64,
    /// SHA-256 of the row's content; see `content_hash`.
    pub(super) content: [u8; 32],
    pub(super) event: Result<Option<Event>, String>,
}

/// The hash of a row's content: its non-empty fields as (lower-case name, value), in name
/// order, so neither column order, quoting, line endings nor an added empty column changes it.
pub(super) fn content_hash<'a>(fields: impl Iterator<Item = (&'a str, &'a str)>) -> [u8; 32] {
    let mut fields: Vec<(&str, &str)> = fields.filter(|(_, v)| !v.is_empty()).collect();
    fields.sort_unstable();
    let mut sha = Sha256::new();
    for (name, value) in fields {
        for part in [name, value] {
            sha.update((part.len() as u64).to_le_bytes());
            sha.update(part.as_bytes());
        }
    }
    sha.finalize().into()
}

pub(super) type Accept<'a> = dyn FnMut(Parsed) -> Result<(), ImportError> + 'a;

/// Parses a timestamp: RFC 3339, a UTC date-time without offset, a date, or epoch ms.
pub fn parse_ts(text: &str) -> Result<Millis, String> {
    let t = text.trim();
    if let Ok(dt) = DateTime::parse_from_rfc3339(t) {
        return Ok(dt.timestamp_millis());
    }
    for fmt in [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(dt) = NaiveDateTime::parse_from_str(t, fmt) {
            return Ok(dt.and_utc().timestamp_millis());
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        return Ok(d
            .and_hms_opt(0, 0, 0)
            .map_or(0, |dt| dt.and_utc().timestamp_millis()));
    }
    if let Ok(ms) = t.parse::<i64>() {
        return Ok(ms);
    }
    Err(format!(
        "`{text}` is not a timestamp (use RFC 3339, e.g. 2026-11-16T18:17:03Z)"
    ))
}

/// The ledger sums dollars; a cost in another currency would be added to them as if it were.
pub(super) fn usd_only(column: &str, currency: &str) -> Result<(), String> {
    if currency.trim().eq_ignore_ascii_case(CURRENCY) {
        return Ok(());
    }
    Err(format!(
        "{column}: `{currency}`, but the ledger is in {CURRENCY} only; convert the costs to {CURRENCY} (or export them in {CURRENCY}) and import again"
    ))
}
