//! Importers: usage from CSV and JSONL in frugal's own columns, and FOCUS billing exports.
//!
//! An import is one ledger transaction: a file with a bad row stores nothing (every bad row
//! up to `MAX_REPORTED` is named, with its line and why), unless the caller asks to skip
//! bad rows. Rows without a cost are priced from the catalog: by instance type, capacity
//! and duration, or by a model's per-token prices.
//!
//! Nothing is billed twice unless the caller asks: a file whose content (SHA-256) was
//! imported before is refused, and so is a file with rows an earlier file imported (billing
//! exports often overlap). A row is known by its content, its non-empty fields by name, and
//! which occurrence of that content in its file it is, so identical rows within one file
//! are all kept. The ledger is in US dollars: a row in another currency is a bad row.
//!
//! Native columns (CSV header or JSON keys, case-insensitive): `ts` (RFC 3339,
//! `YYYY-MM-DD HH:MM:SS[.f]` in UTC, or epoch milliseconds), `end` or `duration_s`, `kind`,
//! `workload`, `model`, `run_id`, `instance_type`, `region`, `capacity`, `instances`,
//! `requests`, `input_tokens`, `output_tokens`, `cached_input_tokens`, `utilization`,
//! `cost_usd`, `currency` (USD only), `outcome`, `lost_s`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::Progress;
use crate::catalog::Catalog;
use crate::event::Event;
use crate::ledger::{Ledger, LedgerError, PriorImport, RowHash, Sink};
use crate::money::Money;

pub use error::{ImportError, RowError};
use focus::FocusColumns;
use native::{NativeColumns, read_jsonl};
pub use row::parse_ts;
use row::{Accept, Parsed, content_hash};

mod error;
mod focus;
mod native;
mod row;

/// Bad rows named in one error; the rest are counted.
const MAX_REPORTED: usize = 20;
/// Lines of rows imported before named in one error.
const MAX_DUPLICATE_LINES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Csv,
    Jsonl,
    Focus,
}

impl Format {
    /// The format a file name suggests: `.jsonl`/`.ndjson`, else CSV; FOCUS is chosen by
    /// its header, see `import_file`.
    pub fn from_path(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl" | "ndjson" | "json") => Format::Jsonl,
            _ => Format::Csv,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Jsonl => "jsonl",
            Format::Focus => "focus",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ImportSummary {
    pub path: PathBuf,
    pub format: Format,
    pub imported: u64,
    /// Rows left out on purpose (FOCUS prepaid purchases, amortized into usage rows).
    pub skipped: u64,
    /// Bad rows left out because the caller asked to skip them.
    pub invalid: Vec<RowError>,
    pub invalid_total: u64,
    /// Rows imported although an earlier import stored them, because the caller allowed it.
    pub duplicates: u64,
    /// Hex SHA-256 of the file's content.
    pub sha256: String,
    pub cost: Money,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ImportOptions {
    /// `None`: from the file's name and header.
    pub format: Option<Format>,
    pub skip_invalid: bool,
    /// Import a file, or rows, that an earlier import stored already.
    pub allow_duplicates: bool,
}

/// Reads `path` into the ledger in one transaction. One thread reads, parses, prices and
/// hashes the rows while this one stores the batch before (the database works while the
/// next batch is parsed); both stop at the first error of either.
pub fn import_file(
    ledger: &mut Ledger,
    catalog: &Catalog,
    path: &Path,
    options: ImportOptions,
    progress: &dyn Progress,
) -> Result<ImportSummary, ImportError> {
    let read_err = |source| ImportError::Read {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(read_err)?;
    if let Ok(meta) = file.metadata() {
        progress.start(meta.len());
    }
    let read = AtomicU64::new(0);
    let mut reader = BufReader::with_capacity(
        1 << 20,
        Counting {
            inner: file,
            read: &read,
            sha256: Sha256::new(),
        },
    );
    let format = match options.format {
        Some(f) => f,
        None => sniff(&mut reader, path).map_err(read_err)?,
    };
    let mut summary = ImportSummary {
        path: path.to_owned(),
        format,
        imported: 0,
        skipped: 0,
        invalid: Vec::new(),
        invalid_total: 0,
        duplicates: 0,
        sha256: String::new(),
        cost: Money::ZERO,
    };
    let source = path.display().to_string();
    let result = std::thread::scope(|scope| {
        let (send, batches) = std::sync::mpsc::sync_channel::<Vec<Hashed>>(BATCHES_AHEAD);
        let parser = scope.spawn(move || parse_file(reader, path, format, catalog, send));
        ledger.import(&source, format.as_str(), |sink| {
            let mut bad: Vec<RowError> = Vec::new();
            let mut bad_total = 0u64;
            let mut rows = Rows::default();
            let mut shown = 0;
            for batch in batches {
                let now = read.load(Ordering::Relaxed);
                progress.advance(now - shown);
                shown = now;
                for row in batch {
                    match row.event {
                        Ok(Some((event, hash))) if bad_total == 0 || options.skip_invalid => {
                            rows.waiting.push((event, hash, row.line));
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => summary.skipped += 1,
                        Err(message) => {
                            bad_total += 1;
                            if bad.len() < MAX_REPORTED {
                                bad.push(RowError {
                                    line: row.line,
                                    message,
                                });
                            }
                        }
                    }
                }
                rows.settle(sink, options.allow_duplicates)?;
            }
            summary.sha256 = match parser.join() {
                Ok(parsed) => parsed?,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            progress.advance(read.load(Ordering::Relaxed) - shown);
            summary.cost = rows.cost;
            summary.duplicates = rows.duplicates;
            let Rows {
                duplicate_lines,
                duplicates_total,
                first_duplicate,
                ..
            } = rows;
            if !options.allow_duplicates
                && let Some(prior) = sink.file_imported(&summary.sha256)?
            {
                return Err(ImportError::AlreadyImported {
                    path: path.to_owned(),
                    prior: Box::new(prior),
                });
            }
            if bad_total > 0 && !options.skip_invalid {
                return Err(ImportError::BadRows {
                    path: path.to_owned(),
                    rows: bad,
                    total: bad_total,
                });
            }
            if let Some(hash) = first_duplicate {
                let first = sink.row_imported(hash)?.unwrap_or_else(|| PriorImport {
                    at_ms: 0,
                    source: "an earlier import".to_owned(),
                    format: String::new(),
                    rows: 0,
                    sha256: None,
                });
                return Err(ImportError::DuplicateRows {
                    path: path.to_owned(),
                    lines: duplicate_lines,
                    total: duplicates_total,
                    first: Box::new(first),
                });
            }
            sink.set_file_sha256(summary.sha256.clone());
            summary.invalid = bad;
            summary.invalid_total = bad_total;
            Ok(())
        })
    });
    progress.finish();
    let (rows, ()) = result?;
    summary.imported = rows;
    Ok(summary)
}

/// Batches parsed ahead of the one being stored.
const BATCHES_AHEAD: usize = 2;

/// A row as the parsing thread hands it over: an event with its row hash, a row left out
/// on purpose, or why the row is bad.
struct Hashed {
    line: u64,
    event: Result<Option<(Event, RowHash)>, String>,
}

/// Reads and parses the whole file, sending rows `ROWS_AT_ONCE` at a time; returns the
/// file's SHA-256 (hex). Stops, with an error nobody reads, when the receiver has gone.
fn parse_file(
    mut reader: BufReader<Counting<'_, File>>,
    path: &Path,
    format: Format,
    catalog: &Catalog,
    send: std::sync::mpsc::SyncSender<Vec<Hashed>>,
) -> Result<String, ImportError> {
    let read_err = |source| ImportError::Read {
        path: path.to_owned(),
        source,
    };
    let mut occurrences = Occurrences::default();
    let mut batch = Vec::with_capacity(ROWS_AT_ONCE);
    let stopped = || read_err(std::io::Error::other("the ledger stopped the import"));
    let mut accept = |row: Parsed| -> Result<(), ImportError> {
        let event = match row.event {
            Ok(Some(event)) => {
                let hash = occurrences.row_hash(&row.content);
                Ok(Some((event, hash)))
            }
            Ok(None) => Ok(None),
            Err(message) => Err(message),
        };
        batch.push(Hashed {
            line: row.line,
            event,
        });
        if batch.len() >= ROWS_AT_ONCE {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(ROWS_AT_ONCE));
            send.send(full).map_err(|_| stopped())?;
        }
        Ok(())
    };
    parse_rows(&mut reader, path, format, catalog, &mut accept)?;
    if !batch.is_empty() {
        send.send(batch).map_err(|_| stopped())?;
    }
    // The file's hash covers all of it, read or not (a broken CSV stops the parse).
    std::io::copy(&mut reader, &mut std::io::sink()).map_err(read_err)?;
    Ok(hex(&reader.get_mut().sha256.finalize_reset()))
}

/// Reads every row of `reader` in `format`, handing each to `accept`.
fn parse_rows(
    reader: &mut impl BufRead,
    path: &Path,
    format: Format,
    catalog: &Catalog,
    accept: &mut Accept<'_>,
) -> Result<(), ImportError> {
    match format {
        Format::Jsonl => read_jsonl(reader, path, catalog, accept)?,
        Format::Csv | Format::Focus => {
            let mut csv = csv::ReaderBuilder::new()
                .flexible(false)
                .from_reader(reader);
            let headers = csv
                .headers()
                .map_err(|e| ImportError::Header {
                    path: path.to_owned(),
                    message: format!("cannot read the header: {e}"),
                })?
                .clone();
            let header_err = |message| ImportError::Header {
                path: path.to_owned(),
                message,
            };
            let names = ContentNames::new(&headers);
            if format == Format::Csv {
                let columns = NativeColumns::new(&headers).map_err(header_err)?;
                let parse = |rec: &_| columns.event(rec, catalog);
                read_csv(&mut csv, &names, parse, accept)?;
            } else {
                let columns = FocusColumns::new(&headers).map_err(header_err)?;
                read_csv(&mut csv, &names, |rec| columns.event(rec), accept)?;
            }
        }
    }
    Ok(())
}

/// Rows stored at once: a backend stores them in one statement (PostgreSQL: one `COPY`
/// and one `INSERT`, so fewer round trips and statements per row as it grows).
const ROWS_AT_ONCE: usize = 10_000;

/// Rows read and not yet stored, and what storing the others found.
#[derive(Default)]
struct Rows {
    waiting: Vec<(Event, RowHash, u64)>,
    cost: Money,
    duplicates: u64,
    duplicate_lines: Vec<u64>,
    duplicates_total: u64,
    first_duplicate: Option<RowHash>,
}

impl Rows {
    /// Stores the waiting rows; one an earlier import stored is counted as a duplicate, or
    /// stored again (without its hash) when duplicates are allowed.
    fn settle(&mut self, sink: &mut Sink<'_>, allow_duplicates: bool) -> Result<(), LedgerError> {
        let waiting = std::mem::take(&mut self.waiting);
        let rows: Vec<(&Event, RowHash)> = waiting.iter().map(|(e, h, _)| (e, *h)).collect();
        let stored = sink.push_rows(&rows)?;
        for ((event, hash, line), stored) in waiting.iter().zip(stored) {
            if stored {
                self.cost += event.cost;
            } else if allow_duplicates {
                sink.push(event)?;
                self.cost += event.cost;
                self.duplicates += 1;
            } else {
                self.duplicates_total += 1;
                self.first_duplicate.get_or_insert(*hash);
                if self.duplicate_lines.len() < MAX_DUPLICATE_LINES {
                    self.duplicate_lines.push(*line);
                }
            }
        }
        Ok(())
    }
}

/// Counts bytes read, for the progress bar (drawn by the storing thread), and hashes them,
/// to know the file again.
struct Counting<'a, R> {
    inner: R,
    read: &'a AtomicU64,
    sha256: Sha256,
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sha256.update(&buf[..n]);
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How often each content was seen so far in one file.
#[derive(Default)]
struct Occurrences(HashMap<u64, u32>);

impl Occurrences {
    /// The row's hash: its content and which occurrence of that content in the file it is.
    fn row_hash(&mut self, content: &[u8; 32]) -> RowHash {
        let mut key = [0u8; 8];
        key.copy_from_slice(&content[..8]);
        // A 64-bit key: two contents that share one only number their occurrences together.
        let seen = self.0.entry(u64::from_le_bytes(key)).or_insert(0);
        let occurrence = *seen;
        *seen += 1;
        let mut sha = Sha256::new();
        sha.update(content);
        sha.update(occurrence.to_le_bytes());
        let mut hash = [0u8; 16];
        hash.copy_from_slice(&sha.finalize()[..16]);
        RowHash(hash)
    }
}

/// The lower-case names of a CSV header's columns, for `content_hash`.
struct ContentNames(Vec<String>);

impl ContentNames {
    fn new(headers: &csv::StringRecord) -> ContentNames {
        ContentNames(
            headers
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
        )
    }

    fn hash(&self, record: &csv::StringRecord) -> [u8; 32] {
        let names = self.0.iter().map(String::as_str);
        content_hash(names.zip(record.iter().map(str::trim)))
    }
}

/// JSONL by name; a CSV whose header has FOCUS's mandatory cost columns is FOCUS.
fn sniff(reader: &mut impl BufRead, path: &Path) -> std::io::Result<Format> {
    let format = Format::from_path(path);
    if format != Format::Csv {
        return Ok(format);
    }
    let head = String::from_utf8_lossy(reader.fill_buf()?);
    let first = head.lines().next().unwrap_or("");
    let is_focus = ["EffectiveCost", "ChargePeriodStart"]
        .iter()
        .all(|c| first.split(',').any(|h| h.trim().trim_matches('"') == *c));
    Ok(if is_focus { Format::Focus } else { Format::Csv })
}

fn read_csv<R: Read>(
    csv: &mut csv::Reader<R>,
    names: &ContentNames,
    mut parse: impl FnMut(&csv::StringRecord) -> Result<Option<Event>, String>,
    accept: &mut Accept<'_>,
) -> Result<(), ImportError> {
    let mut record = csv::StringRecord::new();
    loop {
        let line = csv.position().line() + 1;
        match csv.read_record(&mut record) {
            Ok(false) => return Ok(()),
            Ok(true) => {
                let line = record.position().map_or(line, |p| p.line());
                let event = parse(&record);
                let content = names.hash(&record);
                accept(Parsed {
                    line,
                    content,
                    event,
                })?;
            }
            Err(e) => {
                let line = e.position().map_or(line, |p| p.line());
                let message = match e.kind() {
                    csv::ErrorKind::UnequalLengths {
                        expected_len, len, ..
                    } => format!("{len} fields where the header has {expected_len}"),
                    csv::ErrorKind::Utf8 { .. } => "not valid UTF-8".to_owned(),
                    _ => e.to_string(),
                };
                accept(Parsed {
                    line,
                    content: [0; 32],
                    event: Err(message),
                })?;
                if !matches!(
                    e.kind(),
                    csv::ErrorKind::UnequalLengths { .. } | csv::ErrorKind::Utf8 { .. }
                ) {
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
