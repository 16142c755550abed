//! The usage ledger: an append-only store of usage events, and of the spans of pool
//! replicas' lives beside them, in a SQLite file (one machine, the default) or a
//! PostgreSQL database (many writers: gateways, training runs), behind one interface.
//!
//! Where it lives is a [`Location`]: a path, or a `postgres://` URL. Both backends keep the
//! same logical schema at the same [`SCHEMA_VERSION`] (a newer one is refused), refuse
//! UPDATE and DELETE on events and spans in the database itself, and store every write in
//! one transaction: once `append`, `append_with_spans` or `import` returns, the rows are
//! durable, and a write that did not return leaves nothing behind. Names (workloads,
//! models, runs, instance types) are stored once in `dims` and referenced by integer, which
//! keeps rows small and reports fast; hourly rollups (see `rollup`) are updated in the same
//! transaction as the events.
//!
//! An event may carry a key, unique in the ledger: a file import's content hash of the row
//! (see `RowHash`, with the SHA-256 of the file recorded, so the same usage is not billed
//! twice), or a writer's id for the event (`Event::id`: the gateway's meter gives each
//! request one, so a retried group commit stores it once). Spans may carry a writer's
//! id the same way (`ReplicaSpan::id`). A keyed row already in the ledger is skipped, and
//! only rows actually stored reach the rollups.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::event::{Event, ReplicaSpan, waste};
use crate::money::{Millis, Money};
use crate::rollup::{self, Ids, Key, Pending, Sums};
use crate::secret_url::{Hide, SecretUrl};
use crate::{Capacity, Kind, Outcome};

mod decode;
mod migrate;
mod postgres;
mod quality;
mod segments;
mod sqlite;
#[cfg(test)]
pub(crate) mod testing;

pub use migrate::{Migrated, migrate};
pub use quality::QualityRow;
pub use segments::TrainingSegment;

/// The schema this build writes. Older ledgers are migrated on open; newer ones refused.
pub const SCHEMA_VERSION: i64 = 11;

/// Where a ledger lives: a SQLite file, or a PostgreSQL database. Shown (and put in
/// errors) with any password hidden.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    Sqlite(PathBuf),
    /// A `postgres://` or `postgresql://` URL, as given.
    Postgres(String),
}

impl Location {
    /// A `postgres://` or `postgresql://` URL is a PostgreSQL ledger; anything else a path.
    pub fn parse(text: &str) -> Location {
        let lower = text.get(..13).unwrap_or(text).to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            Location::Postgres(text.to_owned())
        } else {
            Location::Sqlite(PathBuf::from(text))
        }
    }

    /// The file of a SQLite ledger.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Location::Sqlite(path) => Some(path),
            Location::Postgres(_) => None,
        }
    }

    /// The folder a SQLite ledger's file goes in, where it names one: what to create
    /// before a first write.
    pub fn folder(&self) -> Option<&Path> {
        self.path()
            .and_then(Path::parent)
            .filter(|d| !d.as_os_str().is_empty())
    }

    /// The location as messages show it: a URL's password replaced by `***`.
    pub fn redacted(&self) -> String {
        match self {
            Location::Sqlite(path) => path.display().to_string(),
            Location::Postgres(url) => postgres::redact(url),
        }
    }

    /// Whether the location holds a password (in a URL's user part or its query): what
    /// must be kept in a secret store, never in a plain file.
    pub fn has_credentials(&self) -> bool {
        match self {
            Location::Sqlite(_) => false,
            Location::Postgres(url) => SecretUrl::parse(url).has_secret(Hide::Password),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Location({})", self.redacted())
    }
}

impl From<&Path> for Location {
    fn from(path: &Path) -> Location {
        Location::Sqlite(path.to_owned())
    }
}

impl From<&PathBuf> for Location {
    fn from(path: &PathBuf) -> Location {
        Location::Sqlite(path.clone())
    }
}

impl From<PathBuf> for Location {
    fn from(path: PathBuf) -> Location {
        Location::Sqlite(path)
    }
}

impl From<&Location> for Location {
    fn from(location: &Location) -> Location {
        location.clone()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("cannot open ledger {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot write ledger {path}")]
    Unwritable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no ledger at {0}: fill one with `frugal ledger import FILE`")]
    Missing(PathBuf),
    #[error("{0} is not a frugal ledger")]
    NotALedger(PathBuf),
    /// `path` is a file's path, or a database's URL without its password.
    #[error(
        "ledger {path} has schema version {found}, newer than this frugal understands ({supported}); upgrade frugal"
    )]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("cannot write to ledger {path}{}; nothing from this write was stored", sqlite::hint(.source))]
    Write {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot read ledger {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("ledger {path} holds a value this frugal cannot read: {what}")]
    Corrupt { path: PathBuf, what: String },
    #[error("ledger URL {url} is not valid: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("cannot connect to ledger {url} (host {host}){}", postgres::hint(.source))]
    Connect {
        url: String,
        host: String,
        #[source]
        source: ::postgres::Error,
    },
    /// A PostgreSQL ledger's statement failed; `op` says what it was doing.
    #[error("cannot {op} ledger {url}{}", postgres::nothing_stored(.op))]
    Postgres {
        url: String,
        op: &'static str,
        #[source]
        source: ::postgres::Error,
    },
    #[error("no connection to ledger {url}: {reason}")]
    Pool { url: String, reason: String },
}

/// The named axes of `dims`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Axis {
    Workload = 0,
    Model = 1,
    Run = 2,
    Instance = 3,
    Region = 4,
    Tenant = 5,
    Server = 6,
}

impl Axis {
    const COUNT: usize = Axis::Server as usize + 1;
}

/// A half-open time window `[since, until)` in epoch milliseconds; `None` is unbounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Window {
    pub since_ms: Option<Millis>,
    pub until_ms: Option<Millis>,
}

impl Window {
    /// The whole hours the window touches, as the rollups count it: `since` rounds down to
    /// the hour, `until` up.
    pub fn whole_hours(self) -> Window {
        let hour = rollup::HOUR_MS;
        Window {
            since_ms: self.since_ms.map(|s| s - s.rem_euclid(hour)),
            until_ms: self
                .until_ms
                .map(|u| u.saturating_add(hour - 1).div_euclid(hour) * hour),
        }
    }

    fn bounds(self) -> (Millis, Millis) {
        (
            self.since_ms.unwrap_or(i64::MIN),
            self.until_ms.unwrap_or(i64::MAX),
        )
    }
}

/// One event as a report reads it: names as ids into `Names`.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub ts_ms: Millis,
    pub duration_ms: Millis,
    pub kind: Kind,
    pub workload: u32,
    pub model: Option<u32>,
    pub run: Option<u32>,
    pub instance: Option<u32>,
    pub region: Option<u32>,
    pub capacity: Option<Capacity>,
    pub instances: u32,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    pub utilization: Option<f64>,
    pub cost: Money,
    pub input_cost: Option<Money>,
    pub list_cost: Option<Money>,
    pub outcome: Option<Outcome>,
    pub lost_ms: Millis,
    pub wait_ms: Millis,
    /// The API key's tenant, where keys are in use.
    pub tenant: Option<u32>,
    /// A verified semantic hit's chance of being wrong (`Event::wrong_chance`).
    pub wrong_chance: Option<f64>,
}

impl Row {
    pub fn waste(&self) -> Money {
        waste(self.kind, self.utilization, self.cost)
    }
}

/// Names of the ids in `Row`.
#[derive(Debug, Clone, Default)]
pub struct Names(HashMap<u32, String>);

impl Names {
    pub fn get(&self, id: u32) -> &str {
        self.0.get(&id).map_or("?", String::as_str)
    }
}

/// The content hash of one imported row: 16 bytes of a SHA-256, unique in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RowHash(pub [u8; 16]);

/// An earlier import, as a refusal to import again names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PriorImport {
    pub at_ms: Millis,
    /// The path the file was imported from.
    pub source: String,
    pub format: String,
    pub rows: u64,
    /// Hex SHA-256 of the file; `None` for imports before schema v4.
    pub sha256: Option<String>,
}

/// What the ledger holds, for `frugal ledger info`.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerInfo {
    /// The file, or the database's URL without its password.
    pub path: PathBuf,
    pub schema_version: i64,
    pub events: u64,
    pub imports: u64,
    /// Files imported (not the writes of `frugal serve` and `frugal train`), oldest first.
    pub files: Vec<PriorImport>,
    pub first_ms: Option<Millis>,
    pub last_ms: Option<Millis>,
    pub total_cost: Money,
    pub bytes: u64,
}

/// A rollup row's values, handed to a visitor that may find them corrupt.
type VisitRollup<'a> = dyn FnMut(&[i64; rollup::COLUMNS]) -> Result<(), String> + 'a;

/// The values `#1`..`#8` of `decode::POOL_REQUESTS`, in order: a pool's requests in a
/// window (inference events of a workload whose model is the pool, failed ones left out).
struct PoolRequests<'a>(i64, i64, i64, i64, &'a str, i64, &'a str, i64);

impl<'a> PoolRequests<'a> {
    fn new(window: Window, workload: &'a str, pool: &'a str) -> PoolRequests<'a> {
        let (since, until) = window.bounds();
        let (kind, failed) = (Kind::Inference.code(), Outcome::Failed.code());
        let (workload_axis, model_axis) = (Axis::Workload as i64, Axis::Model as i64);
        PoolRequests(
            since,
            until,
            kind,
            workload_axis,
            workload,
            model_axis,
            pool,
            failed,
        )
    }
}

/// What a backend stores and reads; `Ledger` is the one front for both. Visitors are
/// `dyn` so a backend is an object.
trait Store: Send {
    /// Starts one write's transaction, recording it in `imports`.
    fn begin(&mut self, source: &str, format: &str) -> Result<Box<dyn Tx + '_>, LedgerError>;
    fn names(&self) -> Result<Names, LedgerError>;
    fn tenant_spend(&self, since_ms: Millis) -> Result<Vec<(String, Money)>, LedgerError>;
    fn scan(&self, window: Window, visit: &mut dyn FnMut(&Row)) -> Result<u64, LedgerError>;
    fn spans(
        &self,
        window: Window,
        visit: &mut dyn FnMut(&ReplicaSpan),
    ) -> Result<u64, LedgerError>;
    /// See `Ledger::wait_percentiles`.
    fn wait_percentiles(
        &self,
        requests: &PoolRequests<'_>,
        percents: &[u32],
    ) -> Result<Vec<Option<Millis>>, LedgerError>;
    /// Rollup rows of the hours in `hours`, as `rollup::COLUMNS` values.
    fn rollups(&self, hours: Window, visit: &mut VisitRollup<'_>) -> Result<u64, LedgerError>;
    /// `quality::QUALITY`'s rows over `window`.
    fn quality(
        &self,
        window: Window,
        visit: &mut dyn FnMut(&QualityRow),
    ) -> Result<u64, LedgerError>;
    /// Training segments with watchdog figures that overlap `hours`, in time order.
    fn training_segments(
        &self,
        hours: Window,
        visit: &mut dyn FnMut(&TrainingSegment),
    ) -> Result<u64, LedgerError>;
    fn info(&self) -> Result<LedgerInfo, LedgerError>;
    /// Up to `limit` events whose row id is above `after_id`, in id order, with their
    /// names and keys: what a copy to another ledger reads.
    fn export_events(&self, after_id: i64, limit: i64) -> Result<Vec<Stored>, LedgerError>;
    fn integrity_check(&self) -> Result<String, LedgerError>;
    #[cfg(test)]
    fn as_sqlite(&self) -> Option<&sqlite::SqliteStore> {
        None
    }
    /// How long a read or write waits for a connection, where it needs one.
    fn set_connection_wait(&mut self, _wait: std::time::Duration) {}
    /// See `Ledger::for_meter`.
    fn for_meter(&mut self, _statement_timeout: std::time::Duration) -> Result<(), LedgerError> {
        Ok(())
    }
    /// Whether its client must not run on a thread that drives an async runtime.
    fn blocks_on_own_runtime(&self) -> bool {
        false
    }
}

/// One write's transaction; dropped without `commit`, it stores nothing.
trait Tx {
    /// The id of a name on an axis, added if new.
    fn dim(&mut self, axis: Axis, name: &str) -> Result<i64, LedgerError>;
    /// Stores events, each unless its key is in the ledger already (or earlier in
    /// `rows`); returns, in order, whether each was stored.
    fn insert_events(&mut self, rows: &[EventRow<'_>]) -> Result<Vec<bool>, LedgerError>;
    /// Stores a span unless its id (`ReplicaSpan::id`) is in the ledger already; returns
    /// whether it was stored.
    fn insert_span(&mut self, span: &ReplicaSpan, ids: &SpanIds) -> Result<bool, LedgerError>;
    fn file_imported(&mut self, sha256: &str) -> Result<Option<PriorImport>, LedgerError>;
    fn row_imported(&mut self, key: &[u8; 16]) -> Result<Option<PriorImport>, LedgerError>;
    /// Records a file another ledger imported (its rows come over as events), unless a
    /// record of the same file at the same time is here already; returns whether it was
    /// recorded.
    fn copy_import(&mut self, file: &PriorImport) -> Result<bool, LedgerError>;
    /// Adds the rollups, records the import's rows and file hash, and commits.
    fn commit(
        self: Box<Self>,
        rollups: Pending,
        rows: u64,
        sha256: Option<&str>,
    ) -> Result<(), LedgerError>;
}

/// An event as the ledger stored it: its row id there, the event, and its key.
pub struct Stored {
    pub row_id: i64,
    pub event: Event,
    pub key: Option<[u8; 16]>,
}

/// The columns `export_events` reads, after `FROM`, for both backends; `{AFTER}` and
/// `{LIMIT}` are the placeholders.
const EXPORT: &str = "SELECT e.id, e.ts_ms, e.duration_ms, e.kind, w.name, m.name, r.name,
        i.name, g.name, e.capacity, e.instances, e.requests, e.input_tokens, e.output_tokens,
        e.cached_tokens, e.utilization, e.cost, e.input_cost, e.list_cost, e.outcome, e.lost_ms,
        e.saved, e.lever, t.name, e.row_hash, e.wait_ms, e.mfu, e.precision, e.data_stall,
        e.sync_stall, e.wrong_chance, e.shadow_lever, e.shadow_agreed, e.shadow_method
    FROM events e
    JOIN dims w ON w.id = e.workload
    LEFT JOIN dims m ON m.id = e.model
    LEFT JOIN dims r ON r.id = e.run
    LEFT JOIN dims i ON i.id = e.instance
    LEFT JOIN dims g ON g.id = e.region
    LEFT JOIN dims t ON t.id = e.tenant
    WHERE e.id > {AFTER} ORDER BY e.id LIMIT {LIMIT}";

/// The raw values of one `EXPORT` row, as either backend reads them.
struct ExportRow {
    ints: [Option<i64>; ExportRow::COLUMNS],
    names: [Option<String>; 6],
    floats: [Option<f64>; 5],
    key: Option<Vec<u8>>,
}

impl ExportRow {
    /// Indices of `EXPORT`'s columns by type.
    const NAMES: [usize; 6] = [4, 5, 6, 7, 8, 23];
    const FLOATS: [usize; 5] = [15, 26, 28, 29, 30];
    const COLUMNS: usize = 34;
    const KEY: usize = 24;

    fn into_stored(self) -> Result<Stored, String> {
        let int = |i: usize| self.ints[i].unwrap_or(0);
        let code = |i: usize| self.ints[i];
        let [workload, model, run, instance, region, tenant] = self.names.clone();
        let kind = Kind::from_code(int(3)).ok_or_else(|| format!("kind {}", int(3)))?;
        let mut e = Event::new(int(1), kind, workload.unwrap_or_default(), Money::ZERO);
        e.duration_ms = int(2);
        e.model = model;
        e.run_id = run;
        e.instance_type = instance;
        e.region = region;
        e.capacity = from_code(code(9), "capacity", Capacity::from_code)?;
        e.instances = int(10).clamp(0, i64::from(u32::MAX)) as u32;
        e.requests = int(11).max(0) as u64;
        e.input_tokens = int(12).max(0) as u64;
        e.output_tokens = int(13).max(0) as u64;
        e.cached_input_tokens = int(14).max(0) as u64;
        e.utilization = self.floats[0];
        e.cost = Money::from_nanos(int(16));
        e.input_cost = code(17).map(Money::from_nanos);
        e.list_cost = code(18).map(Money::from_nanos);
        e.outcome = from_code(code(19), "outcome", Outcome::from_code)?;
        e.lost_ms = int(20);
        e.saved = Money::from_nanos(int(21));
        e.lever = from_code(code(22), "lever", crate::event::Lever::from_code)?;
        e.tenant = tenant;
        e.wait_ms = int(25);
        e.mfu = self.floats[1];
        e.precision = from_code(code(27), "precision", crate::event::Precision::from_code)?;
        e.data_stall = self.floats[2];
        e.sync_stall = self.floats[3];
        e.wrong_chance = self.floats[4];
        e.shadow = quality::shadow_from_codes([code(31), code(32), code(33)])?;
        let key = match self.key {
            None => None,
            Some(k) => {
                Some(<[u8; 16]>::try_from(k.as_slice()).map_err(|_| "a row key".to_owned())?)
            }
        };
        Ok(Stored {
            row_id: int(0),
            event: e,
            key,
        })
    }
}

/// A stored code as its enum; `Err` names a code this build does not know.
fn from_code<T>(
    code: Option<i64>,
    what: &str,
    decode: fn(i64) -> Option<T>,
) -> Result<Option<T>, String> {
    code.map(|c| decode(c).ok_or_else(|| format!("{what} {c}")))
        .transpose()
}

/// A span's stored id as `ReplicaSpan::id`; `Err` says what is wrong with it.
fn span_key(key: Option<Vec<u8>>) -> Result<Option<[u8; 16]>, String> {
    key.map(|k| <[u8; 16]>::try_from(k.as_slice()).map_err(|_| "a span's id".to_owned()))
        .transpose()
}

/// An event to store, with its names' ids and its key.
struct EventRow<'a> {
    event: &'a Event,
    ids: EventIds,
    key: Option<[u8; 16]>,
}

/// Events a `Sink` holds back to store many in one statement.
const BATCH: usize = 2_000;

/// The dims ids of an event's names.
#[derive(Clone, Copy)]
struct EventIds {
    workload: i64,
    model: Option<i64>,
    run: Option<i64>,
    instance: Option<i64>,
    region: Option<i64>,
    tenant: Option<i64>,
}

/// The dims ids of a span's names.
struct SpanIds {
    workload: i64,
    pool: i64,
    instance: Option<i64>,
    server: Option<i64>,
}

/// A count as the ledger stores it (a signed 64-bit integer).
fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub struct Ledger {
    store: Box<dyn Store>,
    location: Location,
}

impl Ledger {
    /// Opens the ledger at `at` (a path or a `postgres://` URL), creating and migrating it
    /// as needed.
    pub fn open(at: impl Into<Location>) -> Result<Ledger, LedgerError> {
        let location = at.into();
        let store: Box<dyn Store> = match &location {
            Location::Sqlite(path) => Box::new(sqlite::SqliteStore::open(path)?),
            Location::Postgres(url) => Box::new(postgres::PgStore::open(url)?),
        };
        Ok(Ledger { store, location })
    }

    /// Opens an existing ledger; a missing file is an error rather than a new empty ledger.
    /// (A PostgreSQL database is created by its administrator; an empty one is a ledger
    /// with nothing in it.)
    pub fn open_existing(at: impl Into<Location>) -> Result<Ledger, LedgerError> {
        let location = at.into();
        if let Location::Sqlite(path) = &location
            && !path.exists()
        {
            return Err(LedgerError::Missing(path.clone()));
        }
        Ledger::open(location)
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    /// How long a read or write waits for a connection to a PostgreSQL ledger (a SQLite
    /// one needs none) before it fails: the gateway's meter waits little, as it spools
    /// what it cannot write rather than hold requests back.
    pub fn set_connection_wait(&mut self, wait: std::time::Duration) {
        self.store.set_connection_wait(wait);
    }

    /// Sets this handle up for a gateway's meter, which commits small batches often and
    /// must never wait long: a SQLite ledger commits without an fsync per transaction
    /// (`synchronous = NORMAL` in WAL mode: a commit survives a killed process, and the
    /// WAL is synced at each checkpoint, so only a power loss can take the last ones); a
    /// PostgreSQL ledger's writes end after `statement_timeout` if the server is slow.
    pub fn for_meter(&mut self, statement_timeout: std::time::Duration) -> Result<(), LedgerError> {
        self.store.for_meter(statement_timeout)
    }

    /// Appends events in one transaction; all of them are stored or none.
    pub fn append(&mut self, source: &str, events: &[Event]) -> Result<u64, LedgerError> {
        self.append_with_spans(source, events, &[])
    }

    /// Appends events and pool replicas' spans in one transaction; all of them are stored
    /// or none. Returns the rows stored, events and spans together (an event whose id is
    /// in the ledger already is not stored again).
    pub fn append_with_spans(
        &mut self,
        source: &str,
        events: &[Event],
        spans: &[ReplicaSpan],
    ) -> Result<u64, LedgerError> {
        if self.store.blocks_on_own_runtime() && tokio::runtime::Handle::try_current().is_ok() {
            // A caller inside an async runtime (`frugal train` records segments from one):
            // the blocking client runs its own, which may not start on that thread.
            return std::thread::scope(|s| {
                s.spawn(|| self.append_here(source, events, spans))
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            });
        }
        self.append_here(source, events, spans)
    }

    fn append_here(
        &mut self,
        source: &str,
        events: &[Event],
        spans: &[ReplicaSpan],
    ) -> Result<u64, LedgerError> {
        self.import(source, "api", |sink| {
            for e in events {
                sink.push(e)?;
            }
            for span in spans {
                sink.push_span(span)?;
            }
            Ok::<_, LedgerError>(())
        })
        .map(|(n, ())| n)
    }

    /// Runs `fill` inside one transaction; commits what it pushed if it returns `Ok`,
    /// stores nothing if it returns `Err`. Returns the number of rows stored.
    pub fn import<T, E: From<LedgerError>>(
        &mut self,
        source: &str,
        format: &str,
        fill: impl FnOnce(&mut Sink<'_>) -> Result<T, E>,
    ) -> Result<(u64, T), E> {
        let tx = self.store.begin(source, format)?;
        let mut sink = Sink {
            tx,
            held: Vec::new(),
            dims: Default::default(),
            pending: Pending::default(),
            rows: 0,
            sha256: None,
        };
        let value = fill(&mut sink)?;
        sink.flush()?;
        let Sink {
            tx,
            pending,
            rows,
            sha256,
            ..
        } = sink;
        tx.commit(pending, rows, sha256.as_deref())?;
        Ok((rows, value))
    }

    /// The names behind the ids of `Row`.
    pub fn names(&self) -> Result<Names, LedgerError> {
        self.store.names()
    }

    /// What each tenant spent in events from `since_ms` on: what budgets count.
    pub fn tenant_spend(&self, since_ms: Millis) -> Result<Vec<(String, Money)>, LedgerError> {
        self.store.tenant_spend(since_ms)
    }

    /// Calls `visit` for every raw event that starts in the window.
    pub fn scan(&self, window: Window, mut visit: impl FnMut(&Row)) -> Result<u64, LedgerError> {
        self.store.scan(window, &mut visit)
    }

    /// Calls `visit` for every pool replica span that starts in the window, in time order.
    pub fn spans(
        &self,
        window: Window,
        mut visit: impl FnMut(&ReplicaSpan),
    ) -> Result<u64, LedgerError> {
        self.store.spans(window, &mut visit)
    }

    /// Nearest-rank percentiles (`percents` in 1..=100) of the activator waits of a pool's
    /// requests that start in the window (inference events of `workload` whose model is
    /// `pool`, failed ones left out); `None` when it has none. Most requests did not wait:
    /// one pass counts them, and the ranks among those that did are read off the index of
    /// waits, so no wait is held in memory.
    pub fn wait_percentiles(
        &self,
        window: Window,
        workload: &str,
        pool: &str,
        percents: &[u32],
    ) -> Result<Vec<Option<Millis>>, LedgerError> {
        self.store
            .wait_percentiles(&PoolRequests::new(window, workload, pool), percents)
    }

    /// Calls `visit` for the hourly rollups of the whole hours the window touches (see
    /// `Window::whole_hours`).
    pub fn rollups(
        &self,
        window: Window,
        mut visit: impl FnMut(&Key, &Sums),
    ) -> Result<u64, LedgerError> {
        self.store.rollups(window.whole_hours(), &mut |values| {
            let (key, sums) = rollup::decode(values)?;
            visit(&key, &sums);
            Ok(())
        })
    }

    /// What the shadows found over the whole hours the window touches (as the rollups
    /// count them), per lever, workload and model, in that order.
    pub fn quality(&self, window: Window) -> Result<Vec<QualityRow>, LedgerError> {
        let mut rows = Vec::new();
        self.store
            .quality(window.whole_hours(), &mut |r| rows.push(r.clone()))?;
        Ok(rows)
    }

    /// Calls `visit` for each training segment with watchdog figures that overlaps the whole
    /// hours `window` touches (as the rollups count it), in time order.
    pub fn training_segments(
        &self,
        window: Window,
        mut visit: impl FnMut(&TrainingSegment),
    ) -> Result<u64, LedgerError> {
        self.store
            .training_segments(window.whole_hours(), &mut visit)
    }

    pub fn info(&self) -> Result<LedgerInfo, LedgerError> {
        self.store.info()
    }

    /// The database's own check (SQLite's `integrity_check`), for tests and `frugal
    /// ledger info --check`; "ok" when it finds nothing.
    pub fn integrity_check(&self) -> Result<String, LedgerError> {
        self.store.integrity_check()
    }
}

#[cfg(test)]
impl Ledger {
    /// A SQLite ledger's connection, for tests that look under the interface.
    fn sqlite_conn(&self) -> &rusqlite::Connection {
        match self.store.as_sqlite() {
            Some(store) => store.conn(),
            None => unreachable!("a test of the SQLite ledger opened another"),
        }
    }

    fn sqlite(&self) -> &sqlite::SqliteStore {
        match self.store.as_sqlite() {
            Some(store) => store,
            None => unreachable!("a test of the SQLite ledger opened another"),
        }
    }
}

/// Receives the rows of one import; see `Ledger::import`.
pub struct Sink<'a> {
    tx: Box<dyn Tx + 'a>,
    /// Events pushed and not yet stored: stored `BATCH` at a time, and before anything
    /// that reads what is stored.
    held: Vec<(Event, EventIds)>,
    /// Ids already known in this import, one map per axis.
    dims: [HashMap<String, i64>; Axis::COUNT],
    pending: Pending,
    rows: u64,
    /// The SHA-256 of the file being imported, recorded with the import.
    sha256: Option<String>,
}

impl Sink<'_> {
    fn dim(&mut self, axis: Axis, name: &str) -> Result<i64, LedgerError> {
        if let Some(&id) = self.dims[axis as usize].get(name) {
            return Ok(id);
        }
        let id = self.tx.dim(axis, name)?;
        self.dims[axis as usize].insert(name.to_owned(), id);
        Ok(id)
    }

    fn opt_dim(&mut self, axis: Axis, name: Option<&str>) -> Result<Option<i64>, LedgerError> {
        name.map(|n| self.dim(axis, n)).transpose()
    }

    /// Stores an event, unless it carries an id (`Event::id`) that is in the ledger
    /// already (by the time the import commits).
    pub fn push(&mut self, e: &Event) -> Result<(), LedgerError> {
        let ids = self.ids(e)?;
        self.held.push((e.clone(), ids));
        if self.held.len() >= BATCH {
            self.flush()?;
        }
        Ok(())
    }

    /// Stores an imported row unless a row with its hash is in the ledger already; returns
    /// whether it was stored.
    pub fn push_row(&mut self, e: &Event, hash: RowHash) -> Result<bool, LedgerError> {
        Ok(self
            .push_rows(&[(e, hash)])?
            .first()
            .copied()
            .unwrap_or(false))
    }

    /// Stores imported rows, each unless a row with its hash is in the ledger already (or
    /// earlier among them); returns, in order, whether each was stored.
    pub fn push_rows(&mut self, rows: &[(&Event, RowHash)]) -> Result<Vec<bool>, LedgerError> {
        self.flush()?;
        let mut prepared = Vec::with_capacity(rows.len());
        for &(event, hash) in rows {
            prepared.push(EventRow {
                event,
                ids: self.ids(event)?,
                key: Some(hash.0),
            });
        }
        let stored = self.tx.insert_events(&prepared)?;
        for (row, &ok) in prepared.iter().zip(&stored) {
            if ok {
                add(&mut self.pending, &mut self.rows, row);
            }
        }
        Ok(stored)
    }

    /// Stores the events held back.
    fn flush(&mut self) -> Result<(), LedgerError> {
        if self.held.is_empty() {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        let rows: Vec<EventRow<'_>> = held
            .iter()
            .map(|(event, ids)| EventRow {
                event,
                ids: *ids,
                key: event.id,
            })
            .collect();
        let stored = self.tx.insert_events(&rows)?;
        for (row, &ok) in rows.iter().zip(&stored) {
            if ok {
                add(&mut self.pending, &mut self.rows, row);
            }
        }
        Ok(())
    }

    /// Records the SHA-256 (hex) of the file this import reads.
    pub fn set_file_sha256(&mut self, sha256: String) {
        self.sha256 = Some(sha256);
    }

    /// The earliest import of a file with this SHA-256 (hex), if any.
    pub fn file_imported(&mut self, sha256: &str) -> Result<Option<PriorImport>, LedgerError> {
        self.flush()?;
        self.tx.file_imported(sha256)
    }

    /// The import that stored the row with this hash, if any.
    pub fn row_imported(&mut self, hash: RowHash) -> Result<Option<PriorImport>, LedgerError> {
        self.flush()?;
        self.tx.row_imported(&hash.0)
    }

    /// Records a file another ledger imported: see `Tx::copy_import`.
    fn copy_import(&mut self, file: &PriorImport) -> Result<bool, LedgerError> {
        self.tx.copy_import(file)
    }

    /// Stores a pool replica's span, unless it carries an id (`ReplicaSpan::id`) that is
    /// in the ledger already. Spans are not rolled up: their money is already in
    /// the pool's request and idle events, so a report reads them apart and adds none of it.
    pub fn push_span(&mut self, span: &ReplicaSpan) -> Result<(), LedgerError> {
        let ids = SpanIds {
            workload: self.dim(Axis::Workload, &span.workload)?,
            pool: self.dim(Axis::Model, &span.pool)?,
            instance: self.opt_dim(Axis::Instance, span.instance_type.as_deref())?,
            server: self.opt_dim(Axis::Server, span.server.as_deref())?,
        };
        if self.tx.insert_span(span, &ids)? {
            self.rows += 1;
        }
        Ok(())
    }

    fn ids(&mut self, e: &Event) -> Result<EventIds, LedgerError> {
        Ok(EventIds {
            workload: self.dim(Axis::Workload, &e.workload)?,
            model: self.opt_dim(Axis::Model, e.model.as_deref())?,
            run: self.opt_dim(Axis::Run, e.run_id.as_deref())?,
            instance: self.opt_dim(Axis::Instance, e.instance_type.as_deref())?,
            region: self.opt_dim(Axis::Region, e.region.as_deref())?,
            tenant: self.opt_dim(Axis::Tenant, e.tenant.as_deref())?,
        })
    }
}

/// Folds a stored event into the write's rollups and counts it.
fn add(pending: &mut Pending, rows: &mut u64, row: &EventRow<'_>) {
    let id = |v: Option<i64>| v.map_or(0, |v| v as u32);
    pending.add(
        row.event,
        Ids {
            workload: row.ids.workload as u32,
            model: id(row.ids.model),
            run: id(row.ids.run),
            instance: id(row.ids.instance),
            region: id(row.ids.region),
        },
    );
    *rows += 1;
}
