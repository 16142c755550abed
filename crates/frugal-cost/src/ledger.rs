//! The usage ledger: an append-only SQLite file of usage events, and of the spans of pool
//! replicas' lives beside them.
//!
//! Every write is one transaction in WAL mode with `synchronous = FULL`: once `append`,
//! `append_with_spans` or `import` returns, the rows survive a killed process or a power
//! cut, and a write that did not return leaves nothing behind. Triggers refuse UPDATE and
//! DELETE on events and spans, so the ledger only grows. Names (workloads, models, runs, instance types) are stored once
//! in `dims` and referenced by integer, which keeps rows small and reports fast.
//!
//! A file import records the SHA-256 of the file, and each row it stores a content hash
//! under a unique index (see `RowHash`), so the same usage is not billed twice; events
//! written by `frugal serve` and `frugal train` carry no row hash.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, params};
use serde::Serialize;

use crate::event::{Capacity, Event, Kind, Outcome, ReplicaSpan, ReplicaState, waste};
use crate::money::{Millis, Money};
use crate::rollup::{self, Ids, Key, Pending, Sums};

mod segments;

pub use segments::TrainingSegment;

/// The schema this build writes. Older ledgers are migrated on open; newer ones refused.
pub const SCHEMA_VERSION: i64 = 7;

/// `PRAGMA application_id` of a frugal ledger: "FRUG".
const APPLICATION_ID: i64 = 0x4652_5547;

/// Migration `i` takes a ledger from version `i` to `i + 1`; `{ROLLUP}` stands for the
/// rollup table's schema.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE dims (
    id   INTEGER PRIMARY KEY,
    axis INTEGER NOT NULL,
    name TEXT NOT NULL,
    UNIQUE (axis, name)
);
CREATE TABLE imports (
    id       INTEGER PRIMARY KEY,
    at_ms    INTEGER NOT NULL,
    source   TEXT NOT NULL,
    format   TEXT NOT NULL,
    rows     INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE events (
    id            INTEGER PRIMARY KEY,
    ts_ms         INTEGER NOT NULL,
    duration_ms   INTEGER NOT NULL,
    kind          INTEGER NOT NULL,
    workload      INTEGER NOT NULL REFERENCES dims (id),
    model         INTEGER REFERENCES dims (id),
    run           INTEGER REFERENCES dims (id),
    instance      INTEGER REFERENCES dims (id),
    region        INTEGER REFERENCES dims (id),
    capacity      INTEGER,
    instances     INTEGER NOT NULL,
    requests      INTEGER NOT NULL,
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    utilization   REAL,
    cost          INTEGER NOT NULL,
    input_cost    INTEGER,
    list_cost     INTEGER,
    outcome       INTEGER,
    lost_ms       INTEGER NOT NULL,
    import        INTEGER NOT NULL REFERENCES imports (id)
);
CREATE INDEX events_ts ON events (ts_ms);
{ROLLUP}
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
"#,
    r#"
-- v2: what each lever (cache, semantic cache, routing) saved, per event and per rollup;
-- the tenant of each request, so budgets survive a restart.
ALTER TABLE events ADD COLUMN saved INTEGER NOT NULL DEFAULT 0;
ALTER TABLE events ADD COLUMN lever INTEGER;
ALTER TABLE events ADD COLUMN tenant INTEGER REFERENCES dims (id);
CREATE INDEX events_tenant ON events (tenant, ts_ms) WHERE tenant IS NOT NULL;
ALTER TABLE rollup ADD COLUMN saved_cache INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollup ADD COLUMN saved_semantic INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollup ADD COLUMN saved_routing INTEGER NOT NULL DEFAULT 0;
"#,
    r#"
-- v3: what batching saved: a request's decode steps priced alone, less its share.
ALTER TABLE rollup ADD COLUMN saved_batching INTEGER NOT NULL DEFAULT 0;
"#,
    r#"
-- v4: a file is not imported twice (the SHA-256 of its content), nor a row (its content
-- hash, unique); imports before v4 and writes by serve and train have neither.
ALTER TABLE imports ADD COLUMN sha256 TEXT;
CREATE INDEX imports_sha256 ON imports (sha256) WHERE sha256 IS NOT NULL;
ALTER TABLE events ADD COLUMN row_hash BLOB;
CREATE UNIQUE INDEX events_row_hash ON events (row_hash) WHERE row_hash IS NOT NULL;
"#,
    r#"
-- v5: pools of replicas. How long a pool's activator held each request, indexed where it
-- did (few rows) so a pool's wait percentiles read only those; and each replica's life in
-- spans, whose pool is a model name (the pool's requests' model).
ALTER TABLE events ADD COLUMN wait_ms INTEGER NOT NULL DEFAULT 0;
CREATE INDEX events_waited ON events (model, wait_ms) WHERE wait_ms > 0;
CREATE TABLE replica_spans (
    id           INTEGER PRIMARY KEY,
    ts_ms        INTEGER NOT NULL,
    duration_ms  INTEGER NOT NULL,
    workload     INTEGER NOT NULL REFERENCES dims (id),
    pool         INTEGER NOT NULL REFERENCES dims (id),
    replica      INTEGER NOT NULL,
    state        INTEGER NOT NULL,
    busy_ms      INTEGER NOT NULL,
    cost         INTEGER NOT NULL,
    instance     INTEGER REFERENCES dims (id),
    min_replicas INTEGER NOT NULL,
    max_replicas INTEGER NOT NULL,
    need_bytes   INTEGER,
    failed       INTEGER NOT NULL,
    import       INTEGER NOT NULL REFERENCES imports (id)
);
CREATE INDEX replica_spans_ts ON replica_spans (ts_ms);
CREATE TRIGGER replica_spans_no_update BEFORE UPDATE ON replica_spans
    BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER replica_spans_no_delete BEFORE DELETE ON replica_spans
    BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
"#,
    r#"
-- v6: how a training segment used its accelerators (model FLOPs utilization, precision,
-- the shares of step time spent waiting on data and syncs), for the report's precision
-- and input-pipeline levers; indexed where known (a few rows), so the report reads only
-- those. Older rows have none.
ALTER TABLE events ADD COLUMN mfu REAL;
ALTER TABLE events ADD COLUMN precision INTEGER;
ALTER TABLE events ADD COLUMN data_stall REAL;
ALTER TABLE events ADD COLUMN sync_stall REAL;
CREATE INDEX events_advised ON events (ts_ms) WHERE {ADVISED};
"#,
    r#"
-- v7: servers `frugal watch` measures, as spans of one replica: the server's name (none
-- for a pool's replicas) and the requests and tokens it served in the span, so the report
-- tells apart servers that share a workload and a model.
ALTER TABLE replica_spans ADD COLUMN server INTEGER REFERENCES dims (id);
ALTER TABLE replica_spans ADD COLUMN requests INTEGER NOT NULL DEFAULT 0;
ALTER TABLE replica_spans ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE replica_spans ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
"#,
];

/// A migration with its placeholders filled in.
fn schema(migration: &str) -> String {
    migration
        .replace("{ROLLUP}", crate::rollup::SCHEMA)
        .replace("{ADVISED}", segments::ADVISED)
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
    #[error(
        "ledger {path} has schema version {found}, newer than this frugal understands ({supported}); upgrade frugal"
    )]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("cannot write to ledger {path}{}; nothing from this write was stored", hint(.source))]
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
}

fn hint(e: &rusqlite::Error) -> &'static str {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DiskFull) => " (the disk is full)",
        Some(rusqlite::ErrorCode::ReadOnly) => " (it is read-only)",
        Some(rusqlite::ErrorCode::CannotOpen) => " (its folder cannot be written)",
        _ => "",
    }
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

pub struct Ledger {
    conn: Connection,
    path: PathBuf,
}

impl Ledger {
    /// A read's SQLite error as this ledger's.
    fn read_err(&self) -> impl Fn(rusqlite::Error) -> LedgerError + Copy + '_ {
        |source| LedgerError::Read {
            path: self.path.clone(),
            source,
        }
    }

    /// Opens the ledger at `path`, creating and migrating it as needed.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        let open_err = |source| LedgerError::Open {
            path: path.to_owned(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        let mut ledger = Ledger {
            conn,
            path: path.to_owned(),
        };
        match ledger.prepare() {
            // SQLite says only "unable to open database file"; the OS says why.
            Err(LedgerError::Open { source, .. } | LedgerError::Write { source, .. })
                if matches!(
                    source.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::ReadOnly)
                ) =>
            {
                let probe = std::fs::OpenOptions::new().append(true).open(path);
                Err(match probe {
                    Err(io) => LedgerError::Unwritable {
                        path: path.to_owned(),
                        source: io,
                    },
                    Ok(_) => open_err(source),
                })
            }
            other => other.map(|()| ledger),
        }
    }

    /// Opens an existing ledger; a missing file is an error rather than a new empty ledger.
    pub fn open_existing(path: &Path) -> Result<Ledger, LedgerError> {
        if !path.exists() {
            return Err(LedgerError::Missing(path.to_owned()));
        }
        Ledger::open(path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn prepare(&mut self) -> Result<(), LedgerError> {
        let path = self.path.clone();
        let not_ledger = |e: rusqlite::Error| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::NotADatabase) => LedgerError::NotALedger(path.clone()),
            _ => LedgerError::Open {
                path: path.clone(),
                source: e,
            },
        };
        let pragma = |name: &str| -> Result<i64, LedgerError> {
            self.conn
                .query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
                .map_err(not_ledger)
        };
        let version = pragma("user_version")?;
        let app_id = pragma("application_id")?;
        let tables: i64 = self
            .conn
            .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
            .map_err(not_ledger)?;
        if app_id != APPLICATION_ID && (tables > 0 || app_id != 0) {
            return Err(LedgerError::NotALedger(self.path.clone()));
        }
        if version > SCHEMA_VERSION {
            return Err(LedgerError::NewerSchema {
                path: self.path.clone(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        let write_err = |source| LedgerError::Write {
            path: self.path.clone(),
            source,
        };
        self.conn
            .execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;")
            .map_err(write_err)?;
        self.conn
            .busy_timeout(std::time::Duration::from_secs(10))
            .map_err(write_err)?;
        if version < SCHEMA_VERSION {
            let tx = self.conn.transaction().map_err(write_err)?;
            for migration in &MIGRATIONS[version as usize..] {
                tx.execute_batch(&schema(migration)).map_err(write_err)?;
            }
            tx.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION};"
            ))
            .map_err(write_err)?;
            tx.commit().map_err(write_err)?;
        }
        Ok(())
    }

    /// Appends events in one transaction; all of them are stored or none.
    pub fn append(&mut self, source: &str, events: &[Event]) -> Result<u64, LedgerError> {
        self.append_with_spans(source, events, &[])
    }

    /// Appends events and pool replicas' spans in one transaction; all of them are stored
    /// or none. Returns the rows stored, events and spans together.
    pub fn append_with_spans(
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
        let path = self.path.clone();
        let write_err = |source| LedgerError::Write {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(write_err)?;
        tx.execute(
            "INSERT INTO imports (at_ms, source, format) VALUES (?1, ?2, ?3)",
            params![chrono::Utc::now().timestamp_millis(), source, format],
        )
        .map_err(write_err)?;
        let import_id = tx.last_insert_rowid();
        let (rows, value) = {
            let mut sink = Sink {
                tx: &tx,
                path: &path,
                import_id,
                dims: Default::default(),
                pending: Pending::default(),
                rows: 0,
                sha256: None,
            };
            let value = fill(&mut sink)?;
            sink.pending.flush(&tx).map_err(write_err)?;
            (sink.rows, (value, sink.sha256))
        };
        let (value, sha256) = value;
        tx.execute(
            "UPDATE imports SET rows = ?1, sha256 = ?2 WHERE id = ?3",
            params![rows as i64, sha256, import_id],
        )
        .map_err(write_err)?;
        tx.commit().map_err(write_err)?;
        Ok((rows, value))
    }

    /// The names behind the ids of `Row`.
    pub fn names(&self) -> Result<Names, LedgerError> {
        let read_err = self.read_err();
        let mut stmt = self
            .conn
            .prepare("SELECT id, name FROM dims")
            .map_err(read_err)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, u32>(0)?, r.get::<_, String>(1)?)))
            .map_err(read_err)?;
        let mut names = HashMap::new();
        for row in rows {
            let (id, name) = row.map_err(read_err)?;
            names.insert(id, name);
        }
        Ok(Names(names))
    }

    /// What each tenant spent in events from `since_ms` on: what budgets count.
    pub fn tenant_spend(&self, since_ms: Millis) -> Result<Vec<(String, Money)>, LedgerError> {
        let read_err = self.read_err();
        let mut stmt = self
            .conn
            .prepare(
                "SELECT d.name, sum(e.cost) FROM events e JOIN dims d ON d.id = e.tenant
                 WHERE e.tenant IS NOT NULL AND e.ts_ms >= ?1 GROUP BY e.tenant",
            )
            .map_err(read_err)?;
        let rows = stmt
            .query_map(params![since_ms], |r| {
                Ok((r.get::<_, String>(0)?, Money::from_nanos(r.get(1)?)))
            })
            .map_err(read_err)?;
        rows.collect::<Result<_, _>>().map_err(read_err)
    }

    /// Calls `visit` for every raw event that starts in the window.
    pub fn scan(&self, window: Window, mut visit: impl FnMut(&Row)) -> Result<u64, LedgerError> {
        let read_err = self.read_err();
        let corrupt = |what: String| LedgerError::Corrupt {
            path: self.path.clone(),
            what,
        };
        let mut stmt = self
            .conn
            .prepare(
                "SELECT ts_ms, duration_ms, kind, workload, model, run, instance, region, capacity,
                        instances, requests, input_tokens, output_tokens, cached_tokens,
                        utilization, cost, input_cost, list_cost, outcome, lost_ms, wait_ms
                 FROM events WHERE ts_ms >= ?1 AND ts_ms < ?2",
            )
            .map_err(read_err)?;
        let (since, until) = window.bounds();
        let mut rows = stmt.query(params![since, until]).map_err(read_err)?;
        let mut n = 0;
        while let Some(r) = rows.next().map_err(read_err)? {
            let int = |i: usize| r.get::<_, i64>(i).map_err(read_err);
            let opt = |i: usize| r.get::<_, Option<i64>>(i).map_err(read_err);
            let kind_code = int(2)?;
            let kind =
                Kind::from_code(kind_code).ok_or_else(|| corrupt(format!("kind {kind_code}")))?;
            let capacity = match opt(8)? {
                None => None,
                Some(c) => {
                    Some(Capacity::from_code(c).ok_or_else(|| corrupt(format!("capacity {c}")))?)
                }
            };
            let outcome = match opt(18)? {
                None => None,
                Some(c) => {
                    Some(Outcome::from_code(c).ok_or_else(|| corrupt(format!("outcome {c}")))?)
                }
            };
            let row = Row {
                ts_ms: int(0)?,
                duration_ms: int(1)?,
                kind,
                workload: int(3)? as u32,
                model: opt(4)?.map(|v| v as u32),
                run: opt(5)?.map(|v| v as u32),
                instance: opt(6)?.map(|v| v as u32),
                region: opt(7)?.map(|v| v as u32),
                capacity,
                instances: int(9)? as u32,
                requests: int(10)? as u64,
                input_tokens: int(11)? as u64,
                output_tokens: int(12)? as u64,
                cached_tokens: int(13)? as u64,
                utilization: r.get::<_, Option<f64>>(14).map_err(read_err)?,
                cost: Money::from_nanos(int(15)?),
                input_cost: opt(16)?.map(Money::from_nanos),
                list_cost: opt(17)?.map(Money::from_nanos),
                outcome,
                lost_ms: int(19)?,
                wait_ms: int(20)?,
            };
            visit(&row);
            n += 1;
        }
        Ok(n)
    }

    /// Calls `visit` for every pool replica span that starts in the window, in time order.
    pub fn spans(
        &self,
        window: Window,
        mut visit: impl FnMut(&ReplicaSpan),
    ) -> Result<u64, LedgerError> {
        let read_err = self.read_err();
        let mut stmt = self
            .conn
            .prepare(
                "SELECT s.ts_ms, s.duration_ms, w.name, p.name, s.replica, s.state, s.busy_ms,
                        s.cost, i.name, s.min_replicas, s.max_replicas, s.need_bytes, s.failed,
                        v.name, s.requests, s.input_tokens, s.output_tokens
                 FROM replica_spans s
                 JOIN dims w ON w.id = s.workload
                 JOIN dims p ON p.id = s.pool
                 LEFT JOIN dims i ON i.id = s.instance
                 LEFT JOIN dims v ON v.id = s.server
                 WHERE s.ts_ms >= ?1 AND s.ts_ms < ?2
                 ORDER BY s.ts_ms, s.id",
            )
            .map_err(read_err)?;
        let (since, until) = window.bounds();
        let mut rows = stmt.query(params![since, until]).map_err(read_err)?;
        let mut n = 0;
        while let Some(r) = rows.next().map_err(read_err)? {
            let code: i64 = r.get(5).map_err(read_err)?;
            let state = ReplicaState::from_code(code).ok_or_else(|| LedgerError::Corrupt {
                path: self.path.clone(),
                what: format!("replica state {code}"),
            })?;
            let span = ReplicaSpan {
                ts_ms: r.get(0).map_err(read_err)?,
                duration_ms: r.get(1).map_err(read_err)?,
                workload: r.get(2).map_err(read_err)?,
                pool: r.get(3).map_err(read_err)?,
                replica: r.get(4).map_err(read_err)?,
                state,
                busy_ms: r.get(6).map_err(read_err)?,
                cost: Money::from_nanos(r.get(7).map_err(read_err)?),
                instance_type: r.get(8).map_err(read_err)?,
                min_replicas: r.get(9).map_err(read_err)?,
                max_replicas: r.get(10).map_err(read_err)?,
                need_bytes: r
                    .get::<_, Option<i64>>(11)
                    .map_err(read_err)?
                    .map(|b| b.max(0) as u64),
                failed: r.get::<_, i64>(12).map_err(read_err)? != 0,
                server: r.get(13).map_err(read_err)?,
                requests: r.get::<_, i64>(14).map_err(read_err)?.max(0) as u64,
                input_tokens: r.get::<_, i64>(15).map_err(read_err)?.max(0) as u64,
                output_tokens: r.get::<_, i64>(16).map_err(read_err)?.max(0) as u64,
            };
            visit(&span);
            n += 1;
        }
        Ok(n)
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
        let read_err = self.read_err();
        const REQUESTS: &str = "FROM events
             WHERE ts_ms >= ?1 AND ts_ms < ?2 AND kind = ?3
               AND workload = (SELECT id FROM dims WHERE axis = ?4 AND name = ?5)
               AND model = (SELECT id FROM dims WHERE axis = ?6 AND name = ?7)
               AND (outcome IS NULL OR outcome <> ?8)";
        let (since, until) = window.bounds();
        let (kind, failed) = (Kind::Inference.code(), Outcome::Failed.code());
        let (workload_axis, model_axis) = (Axis::Workload as i64, Axis::Model as i64);
        let args: [&dyn rusqlite::ToSql; 8] = [
            &since,
            &until,
            &kind,
            &workload_axis,
            &workload,
            &model_axis,
            &pool,
            &failed,
        ];
        let (all, waited): (i64, i64) = self
            .conn
            .query_row(
                &format!("SELECT count(*), count(CASE WHEN wait_ms > 0 THEN 1 END) {REQUESTS}"),
                &args[..],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(read_err)?;
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT wait_ms {REQUESTS} AND wait_ms > 0 ORDER BY wait_ms LIMIT 1 OFFSET ?9"
            ))
            .map_err(read_err)?;
        let not_waited = all - waited;
        let mut out = Vec::with_capacity(percents.len());
        for &p in percents {
            let rank = (u64::from(p.clamp(1, 100)) * all.max(0) as u64).div_ceil(100) as i64;
            let wait = if all == 0 {
                None
            } else if rank <= not_waited {
                Some(0)
            } else {
                let offset = rank - not_waited - 1;
                let mut with_offset = args.to_vec();
                with_offset.push(&offset);
                Some(
                    stmt.query_row(&with_offset[..], |r| r.get(0))
                        .map_err(read_err)?,
                )
            };
            out.push(wait);
        }
        Ok(out)
    }

    /// Calls `visit` for the hourly rollups of the whole hours the window touches (see
    /// `Window::whole_hours`).
    pub fn rollups(
        &self,
        window: Window,
        visit: impl FnMut(&Key, &Sums),
    ) -> Result<u64, LedgerError> {
        let (since, until) = window.whole_hours().bounds();
        rollup::read(&self.conn, since, until, visit).map_err(|e| match e {
            rollup::ReadError::Sql(source) => LedgerError::Read {
                path: self.path.clone(),
                source,
            },
            rollup::ReadError::Corrupt(what) => LedgerError::Corrupt {
                path: self.path.clone(),
                what,
            },
        })
    }

    pub fn info(&self) -> Result<LedgerInfo, LedgerError> {
        let read_err = self.read_err();
        let (events, first_ms, last_ms, total): (i64, Option<i64>, Option<i64>, Option<i64>) = self
            .conn
            .query_row(
                "SELECT count(*), min(ts_ms), max(ts_ms), sum(cost) FROM events",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .map_err(read_err)?;
        let imports: i64 = self
            .conn
            .query_row("SELECT count(*) FROM imports", [], |r| r.get(0))
            .map_err(read_err)?;
        let files = prior_imports(
            &self.conn,
            "WHERE format <> 'api' ORDER BY at_ms, id",
            params![],
        )
        .map_err(read_err)?;
        let bytes = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        Ok(LedgerInfo {
            path: self.path.clone(),
            schema_version: SCHEMA_VERSION,
            events: events as u64,
            imports: imports as u64,
            files,
            first_ms,
            last_ms,
            total_cost: Money::from_nanos(total.unwrap_or(0)),
            bytes,
        })
    }

    /// SQLite's own check of the file, for tests and `frugal ledger info --check`.
    pub fn integrity_check(&self) -> Result<String, LedgerError> {
        self.conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(|source| LedgerError::Read {
                path: self.path.clone(),
                source,
            })
    }

    /// Caps the file's size in pages, so tests can meet a full disk on demand.
    #[cfg(test)]
    fn set_max_pages(&self, pages: i64) -> rusqlite::Result<()> {
        self.conn
            .query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))
    }
}

/// Imports matching `filter` (SQL after `FROM imports`), as `PriorImport`s.
fn prior_imports(
    conn: &Connection,
    filter: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<Vec<PriorImport>> {
    let sql = format!("SELECT at_ms, source, format, rows, sha256 FROM imports {filter}");
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(params, |r| {
        Ok(PriorImport {
            at_ms: r.get(0)?,
            source: r.get(1)?,
            format: r.get(2)?,
            rows: r.get::<_, i64>(3)? as u64,
            sha256: r.get(4)?,
        })
    })?;
    rows.collect()
}

/// Receives the rows of one import; see `Ledger::import`.
pub struct Sink<'a> {
    tx: &'a rusqlite::Transaction<'a>,
    path: &'a Path,
    import_id: i64,
    /// Ids already known in this import, one map per axis.
    dims: [HashMap<String, i64>; Axis::COUNT],
    pending: Pending,
    rows: u64,
    /// The SHA-256 of the file being imported, recorded with the import.
    sha256: Option<String>,
}

impl Sink<'_> {
    fn write_err(&self, source: rusqlite::Error) -> LedgerError {
        LedgerError::Write {
            path: self.path.to_owned(),
            source,
        }
    }

    fn dim(&mut self, axis: Axis, name: &str) -> Result<i64, LedgerError> {
        if let Some(&id) = self.dims[axis as usize].get(name) {
            return Ok(id);
        }
        let id: i64 = self
            .tx
            .prepare_cached(
                "INSERT INTO dims (axis, name) VALUES (?1, ?2)
                 ON CONFLICT (axis, name) DO UPDATE SET name = excluded.name RETURNING id",
            )
            .and_then(|mut s| s.query_row(params![axis as i64, name], |r| r.get(0)))
            .map_err(|e| self.write_err(e))?;
        self.dims[axis as usize].insert(name.to_owned(), id);
        Ok(id)
    }

    fn opt_dim(&mut self, axis: Axis, name: Option<&str>) -> Result<Option<i64>, LedgerError> {
        name.map(|n| self.dim(axis, n)).transpose()
    }

    /// Stores an event that no earlier import can have stored (it has no row hash).
    pub fn push(&mut self, e: &Event) -> Result<(), LedgerError> {
        self.insert(e, None).map(|_| ())
    }

    /// Stores an imported row unless a row with its hash is in the ledger already; returns
    /// whether it was stored.
    pub fn push_row(&mut self, e: &Event, hash: RowHash) -> Result<bool, LedgerError> {
        self.insert(e, Some(hash))
    }

    /// Records the SHA-256 (hex) of the file this import reads.
    pub fn set_file_sha256(&mut self, sha256: String) {
        self.sha256 = Some(sha256);
    }

    /// The earliest import of a file with this SHA-256 (hex), if any.
    pub fn file_imported(&self, sha256: &str) -> Result<Option<PriorImport>, LedgerError> {
        let found = prior_imports(
            self.tx,
            "WHERE sha256 = ?1 ORDER BY at_ms, id LIMIT 1",
            params![sha256],
        );
        found
            .map(|v| v.into_iter().next())
            .map_err(|e| self.write_err(e))
    }

    /// The import that stored the row with this hash, if any.
    pub fn row_imported(&self, hash: RowHash) -> Result<Option<PriorImport>, LedgerError> {
        let found = prior_imports(
            self.tx,
            "WHERE id = (SELECT import FROM events WHERE row_hash = ?1)",
            params![&hash.0[..]],
        );
        found
            .map(|v| v.into_iter().next())
            .map_err(|e| self.write_err(e))
    }

    /// Stores a pool replica's span. Spans are not rolled up: their money is already in
    /// the pool's request and idle events, so a report reads them apart and adds none of it.
    pub fn push_span(&mut self, span: &ReplicaSpan) -> Result<(), LedgerError> {
        let workload = self.dim(Axis::Workload, &span.workload)?;
        let pool = self.dim(Axis::Model, &span.pool)?;
        let instance = self.opt_dim(Axis::Instance, span.instance_type.as_deref())?;
        let server = self.opt_dim(Axis::Server, span.server.as_deref())?;
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.tx
            .prepare_cached(
                "INSERT INTO replica_spans (ts_ms, duration_ms, workload, pool, replica, state,
                    busy_ms, cost, instance, min_replicas, max_replicas, need_bytes, failed, import,
                    server, requests, input_tokens, output_tokens)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                    ?17, ?18)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    span.ts_ms,
                    span.duration_ms,
                    workload,
                    pool,
                    span.replica,
                    span.state.code(),
                    span.busy_ms,
                    span.cost.nanos(),
                    instance,
                    span.min_replicas,
                    span.max_replicas,
                    span.need_bytes
                        .map(|b| i64::try_from(b).unwrap_or(i64::MAX)),
                    i64::from(span.failed),
                    self.import_id,
                    server,
                    count(span.requests),
                    count(span.input_tokens),
                    count(span.output_tokens),
                ])
            })
            .map_err(|err| self.write_err(err))?;
        self.rows += 1;
        Ok(())
    }

    fn insert(&mut self, e: &Event, hash: Option<RowHash>) -> Result<bool, LedgerError> {
        let workload = self.dim(Axis::Workload, &e.workload)?;
        let model = self.opt_dim(Axis::Model, e.model.as_deref())?;
        let run = self.opt_dim(Axis::Run, e.run_id.as_deref())?;
        let instance = self.opt_dim(Axis::Instance, e.instance_type.as_deref())?;
        let region = self.opt_dim(Axis::Region, e.region.as_deref())?;
        let tenant = self.opt_dim(Axis::Tenant, e.tenant.as_deref())?;
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let stored = self
            .tx
            .prepare_cached(
                "INSERT INTO events (ts_ms, duration_ms, kind, workload, model, run, instance,
                    region, capacity, instances, requests, input_tokens, output_tokens,
                    cached_tokens, utilization, cost, input_cost, list_cost, outcome, lost_ms,
                    import, saved, lever, tenant, row_hash, wait_ms, mfu, precision, data_stall,
                    sync_stall)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                    ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30)
                 ON CONFLICT (row_hash) WHERE row_hash IS NOT NULL DO NOTHING",
            )
            .and_then(|mut s| {
                s.execute(params![
                    e.ts_ms,
                    e.duration_ms,
                    e.kind.code(),
                    workload,
                    model,
                    run,
                    instance,
                    region,
                    e.capacity.map(Capacity::code),
                    e.instances,
                    clamp(e.requests),
                    clamp(e.input_tokens),
                    clamp(e.output_tokens),
                    clamp(e.cached_input_tokens),
                    e.utilization,
                    e.cost.nanos(),
                    e.input_cost.map(Money::nanos),
                    e.list_cost.map(Money::nanos),
                    e.outcome.map(Outcome::code),
                    e.lost_ms,
                    self.import_id,
                    e.saved.nanos(),
                    e.lever.map(crate::event::Lever::code),
                    tenant,
                    hash.as_ref().map(|h| &h.0[..]),
                    e.wait_ms,
                    e.mfu,
                    e.precision.map(crate::event::Precision::code),
                    e.data_stall,
                    e.sync_stall,
                ])
            })
            .map_err(|err| self.write_err(err))?;
        if stored == 0 {
            return Ok(false);
        }
        let id = |v: Option<i64>| v.map_or(0, |v| v as u32);
        self.pending.add(
            e,
            Ids {
                workload: workload as u32,
                model: id(model),
                run: id(run),
                instance: id(instance),
                region: id(region),
            },
        );
        self.rows += 1;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ts: i64, cents: i64) -> Event {
        let mut e = Event::new(ts, Kind::Inference, "chat", Money::from_cents(cents));
        e.model = Some("m".into());
        e.requests = 1;
        e
    }

    #[test]
    fn append_then_scan_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite");
        let mut ledger = Ledger::open(&path).unwrap();
        let mut e = event(10, 5);
        e.capacity = Some(Capacity::Spot);
        e.outcome = Some(Outcome::Preempted);
        e.utilization = Some(0.5);
        e.list_cost = Some(Money::from_cents(9));
        assert_eq!(ledger.append("t", &[e.clone(), event(5, 1)]).unwrap(), 2);
        drop(ledger);
        let ledger = Ledger::open_existing(&path).unwrap();
        let names = ledger.names().unwrap();
        let mut seen = Vec::new();
        ledger.scan(Window::default(), |r| seen.push(*r)).unwrap();
        assert_eq!(seen.len(), 2);
        let r = *seen.iter().find(|r| r.ts_ms == 10).unwrap();
        assert_eq!(names.get(r.workload), "chat");
        assert_eq!(names.get(r.model.unwrap()), "m");
        assert_eq!(r.capacity, Some(Capacity::Spot));
        assert_eq!(r.outcome, Some(Outcome::Preempted));
        assert_eq!(r.cost, Money::from_cents(5));
        assert_eq!(r.waste(), Money::from_nanos(25_000_000));
        let window = Window {
            since_ms: Some(6),
            until_ms: Some(11),
        };
        assert_eq!(ledger.scan(window, |_| {}).unwrap(), 1);
        assert_eq!(ledger.info().unwrap().total_cost, Money::from_cents(6));
    }

    #[test]
    fn a_failed_import_stores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(&dir.path().join("l.sqlite")).unwrap();
        ledger.append("ok", &[event(1, 1)]).unwrap();
        let result: Result<(u64, ()), LedgerError> = ledger.import("bad", "csv", |sink| {
            sink.push(&event(2, 1))?;
            Err(LedgerError::Missing("stand-in for a bad row".into()))
        });
        assert!(result.is_err());
        let info = ledger.info().unwrap();
        assert_eq!((info.events, info.imports), (1, 1));
    }

    #[test]
    fn events_cannot_be_changed_or_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(&dir.path().join("l.sqlite")).unwrap();
        ledger.append("ok", &[event(1, 1)]).unwrap();
        for sql in ["UPDATE events SET cost = 0", "DELETE FROM events"] {
            let err = ledger.conn.execute(sql, []).unwrap_err().to_string();
            assert!(err.contains("append-only"), "{err}");
        }
    }

    #[test]
    fn a_v1_ledger_is_upgraded_in_place_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite");
        {
            // A ledger as frugal wrote it before savings were kept.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(&MIGRATIONS[0].replace("{ROLLUP}", crate::rollup::SCHEMA))
                .unwrap();
            conn.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = 1;
                 INSERT INTO dims (id, axis, name) VALUES (1, 0, 'chat');
                 INSERT INTO imports (id, at_ms, source, format) VALUES (1, 0, 't', 'api');
                 INSERT INTO events (ts_ms, duration_ms, kind, workload, instances, requests,
                     input_tokens, output_tokens, cached_tokens, cost, lost_ms, import)
                     VALUES (5, 0, 0, 1, 1, 1, 0, 0, 0, 7, 0, 1);"
            ))
            .unwrap();
        }
        let mut ledger = Ledger::open(&path).unwrap();
        let mut hit = event(10, 0);
        hit.saved = Money::from_cents(3);
        hit.lever = Some(crate::event::Lever::Cache);
        let mut batched = event(20, 1);
        batched.saved = Money::from_cents(2);
        batched.lever = Some(crate::event::Lever::Batching);
        ledger.append("t", &[hit, batched]).unwrap();
        let version: i64 = ledger
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let rows: Vec<(i64, i64, Option<i64>)> = ledger
            .conn
            .prepare("SELECT cost, saved, lever FROM events ORDER BY ts_ms")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            rows,
            [
                (7, 0, None),
                (0, 30_000_000, Some(0)),
                (10_000_000, 20_000_000, Some(3))
            ]
        );
        let saved: (i64, i64) = ledger
            .conn
            .query_row(
                "SELECT sum(saved_cache), sum(saved_batching) FROM rollup",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(saved, (30_000_000, 20_000_000));
    }

    #[test]
    fn a_v3_ledger_gains_row_hashes_and_keeps_its_rows_and_imports() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite");
        {
            // A ledger as frugal wrote it before imports were known again.
            let conn = Connection::open(&path).unwrap();
            for m in &MIGRATIONS[..3] {
                conn.execute_batch(&m.replace("{ROLLUP}", crate::rollup::SCHEMA))
                    .unwrap();
            }
            conn.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = 3;
                 INSERT INTO dims (id, axis, name) VALUES (1, 0, 'chat');
                 INSERT INTO imports (id, at_ms, source, format, rows)
                     VALUES (1, 1000, 'old.csv', 'csv', 1), (2, 2000, 'frugal serve', 'api', 1);
                 INSERT INTO events (ts_ms, duration_ms, kind, workload, instances, requests,
                     input_tokens, output_tokens, cached_tokens, cost, lost_ms, import)
                     VALUES (5, 0, 0, 1, 1, 1, 0, 0, 0, 7, 0, 1),
                            (6, 0, 0, 1, 1, 1, 0, 0, 0, 8, 0, 2);"
            ))
            .unwrap();
        }
        let mut ledger = Ledger::open(&path).unwrap();
        let hash = RowHash([7; 16]);
        let (rows, stored) = ledger
            .import("new.csv", "csv", |sink| {
                sink.set_file_sha256("ab".repeat(32));
                let first = sink.push_row(&event(10, 1), hash)?;
                let again = sink.push_row(&event(11, 1), hash)?;
                sink.push(&event(12, 1))?;
                Ok::<_, LedgerError>((first, again))
            })
            .unwrap();
        assert_eq!(
            (rows, stored),
            (2, (true, false)),
            "a row hash is stored once"
        );
        ledger.append("frugal serve", &[event(20, 1)]).unwrap();
        let info = ledger.info().unwrap();
        assert_eq!((info.schema_version, info.events), (SCHEMA_VERSION, 5));
        assert_eq!(info.total_cost, Money::from_nanos(15 + 30_000_000));
        let files: Vec<_> = info
            .files
            .iter()
            .map(|f| (f.source.as_str(), f.rows, f.sha256.clone()))
            .collect();
        assert_eq!(
            files,
            [("old.csv", 1, None), ("new.csv", 2, Some("ab".repeat(32)))],
            "files only, not the writes of serve"
        );
        let hashed: i64 = ledger
            .conn
            .query_row("SELECT count(row_hash) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(hashed, 1, "only imported rows carry a row hash");
        let err = ledger
            .conn
            .execute("INSERT INTO events (ts_ms, duration_ms, kind, workload, instances, requests,
                          input_tokens, output_tokens, cached_tokens, cost, lost_ms, import, row_hash)
                      VALUES (1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1, ?1)", [&hash.0[..]])
            .unwrap_err()
            .to_string();
        assert!(err.contains("UNIQUE"), "{err}");
        let prior = ledger.conn.transaction().unwrap();
        let sink = Sink {
            tx: &prior,
            path: &path,
            import_id: 0,
            dims: Default::default(),
            pending: Pending::default(),
            rows: 0,
            sha256: None,
        };
        let by = sink.row_imported(hash).unwrap().unwrap();
        assert_eq!(by.source, "new.csv");
        let file = sink.file_imported(&"ab".repeat(32)).unwrap().unwrap();
        assert_eq!(file.source, "new.csv");
        assert!(sink.file_imported("cd").unwrap().is_none());
    }

    fn span(ts: i64, replica: u32, state: ReplicaState) -> ReplicaSpan {
        ReplicaSpan {
            ts_ms: ts,
            duration_ms: 60_000,
            workload: "chat".into(),
            pool: "qwen".into(),
            replica,
            state,
            busy_ms: 0,
            cost: Money::from_cents(2),
            instance_type: None,
            min_replicas: 0,
            max_replicas: 4,
            need_bytes: None,
            failed: false,
            server: None,
            requests: 0,
            input_tokens: 0,
            output_tokens: 0,
        }
    }

    #[test]
    fn a_v4_ledger_gains_waits_and_replica_spans_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite");
        {
            // A ledger as frugal wrote it before pools.
            let conn = Connection::open(&path).unwrap();
            for m in &MIGRATIONS[..4] {
                conn.execute_batch(&m.replace("{ROLLUP}", crate::rollup::SCHEMA))
                    .unwrap();
            }
            conn.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = 4;
                 INSERT INTO dims (id, axis, name) VALUES (1, 0, 'chat'), (2, 1, 'qwen');
                 INSERT INTO imports (id, at_ms, source, format, rows, sha256)
                     VALUES (1, 1000, 'old.csv', 'csv', 1, 'ab');
                 INSERT INTO events (ts_ms, duration_ms, kind, workload, model, instances,
                     requests, input_tokens, output_tokens, cached_tokens, cost, lost_ms, import,
                     row_hash)
                     VALUES (5, 0, 0, 1, 2, 1, 1, 0, 0, 0, 7, 0, 1, x'01');"
            ))
            .unwrap();
        }
        let mut ledger = Ledger::open(&path).unwrap();
        let mut waited = event(10, 1);
        waited.model = Some("qwen".into());
        waited.wait_ms = 1_500;
        let stored = ledger
            .append_with_spans(
                "frugal serve",
                &[waited],
                &[span(10, 1, ReplicaState::Starting)],
            )
            .unwrap();
        assert_eq!(stored, 2, "an event and a span");
        let info = ledger.info().unwrap();
        assert_eq!((info.schema_version, info.events), (SCHEMA_VERSION, 2));
        assert_eq!(info.total_cost, Money::from_nanos(7 + 10_000_000));
        assert_eq!(info.files[0].sha256.as_deref(), Some("ab"));
        let mut waits = Vec::new();
        ledger
            .scan(Window::default(), |r| waits.push((r.ts_ms, r.wait_ms)))
            .unwrap();
        waits.sort();
        assert_eq!(waits, [(5, 0), (10, 1_500)], "old rows waited 0");
        assert_eq!(ledger.spans(Window::default(), |_| {}).unwrap(), 1);
    }

    #[test]
    fn spans_and_waits_round_trip_in_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite");
        let mut ledger = Ledger::open(&path).unwrap();
        let mut ready = span(100, 2, ReplicaState::Ready);
        ready.busy_ms = 45_000;
        ready.instance_type = Some("g5.xlarge".into());
        ready.need_bytes = Some(5 << 30);
        ready.min_replicas = 1;
        // A watched server's interval, with what it served.
        ready.server = Some("chat-a100-1".into());
        (ready.requests, ready.input_tokens, ready.output_tokens) = (3, 400, 90);
        let mut failed = span(50, 1, ReplicaState::Starting);
        failed.failed = true;
        let spans = [ready, failed, span(7_000, 2, ReplicaState::Draining)];
        ledger.append_with_spans("t", &[], &spans).unwrap();
        drop(ledger);
        let ledger = Ledger::open_existing(&path).unwrap();
        let mut seen = Vec::new();
        let window = Window {
            since_ms: Some(0),
            until_ms: Some(1_000),
        };
        assert_eq!(ledger.spans(window, |s| seen.push(s.clone())).unwrap(), 2);
        assert_eq!(seen, [spans[1].clone(), spans[0].clone()], "in time order");
        for sql in [
            "UPDATE replica_spans SET cost = 0",
            "DELETE FROM replica_spans",
        ] {
            let err = ledger.conn.execute(sql, []).unwrap_err().to_string();
            assert!(err.contains("append-only"), "{err}");
        }
    }

    #[test]
    fn a_failed_write_stores_neither_events_nor_spans() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(&dir.path().join("l.sqlite")).unwrap();
        let result: Result<(u64, ()), LedgerError> = ledger.import("bad", "api", |sink| {
            sink.push(&event(1, 1))?;
            sink.push_span(&span(1, 1, ReplicaState::Ready))?;
            Err(LedgerError::Missing("stand-in for a failed write".into()))
        });
        assert!(result.is_err());
        assert_eq!(ledger.info().unwrap().events, 0);
        assert_eq!(ledger.spans(Window::default(), |_| {}).unwrap(), 0);
    }

    #[test]
    fn wait_percentiles_rank_a_pools_requests_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(&dir.path().join("l.sqlite")).unwrap();
        // 100 requests of pool qwen: 90 not held, 10 held 100 ms .. 1,000 ms; one failed
        // request held 60 s and another pool's request held longer are not the pool's.
        let mut events: Vec<Event> = (0..100)
            .map(|i| {
                let mut e = event(i, 1);
                e.model = Some("qwen".into());
                e.wait_ms = if i < 90 { 0 } else { (i - 89) * 100 };
                e
            })
            .collect();
        let mut failed = events[0].clone();
        (failed.outcome, failed.wait_ms) = (Some(Outcome::Failed), 60_000);
        let mut other = event(5, 1);
        other.wait_ms = 90_000;
        events.extend([failed, other]);
        ledger.append("t", &events).unwrap();
        let all = ledger
            .wait_percentiles(Window::default(), "chat", "qwen", &[50, 90, 91, 99, 100])
            .unwrap();
        assert_eq!(all, [Some(0), Some(0), Some(100), Some(900), Some(1_000)]);
        let late = Window {
            since_ms: Some(95),
            until_ms: None,
        };
        // 600 .. 1,000 ms: the median of five is the third.
        let p50 = ledger
            .wait_percentiles(late, "chat", "qwen", &[50])
            .unwrap();
        assert_eq!(p50, [Some(800)]);
        let none = ledger
            .wait_percentiles(Window::default(), "chat", "nope", &[50])
            .unwrap();
        assert_eq!(none, [None]);
    }

    #[test]
    fn spend_is_summed_per_tenant_from_a_time_on() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(&dir.path().join("l.sqlite")).unwrap();
        let of = |ts, cents, tenant: Option<&str>| {
            let mut e = event(ts, cents);
            e.tenant = tenant.map(str::to_owned);
            e
        };
        ledger
            .append(
                "t",
                &[
                    of(5, 100, Some("a")),
                    of(10, 2, Some("a")),
                    of(11, 3, Some("a")),
                    of(12, 4, Some("b")),
                    of(13, 50, None),
                ],
            )
            .unwrap();
        let mut spend = ledger.tenant_spend(10).unwrap();
        spend.sort();
        assert_eq!(
            spend,
            [
                ("a".to_owned(), Money::from_cents(5)),
                ("b".to_owned(), Money::from_cents(4))
            ]
        );
    }

    #[test]
    fn a_newer_schema_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite");
        let mut ledger = Ledger::open(&path).unwrap();
        ledger.append("ok", &[event(1, 1)]).unwrap();
        ledger
            .conn
            .execute_batch("PRAGMA user_version = 8")
            .unwrap();
        drop(ledger);
        let err = Ledger::open(&path).err().unwrap().to_string();
        let want =
            format!("schema version 8, newer than this frugal understands ({SCHEMA_VERSION})");
        assert!(err.contains(&want), "{err}");
        let conn = Connection::open(&path).unwrap();
        let n: i64 = conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn other_files_are_not_ledgers() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("notes.txt");
        std::fs::write(
            &text,
            "this is not a database, just some text that is long enough",
        )
        .unwrap();
        let err = Ledger::open(&text).err().unwrap().to_string();
        assert!(err.contains("is not a frugal ledger"), "{err}");
        let other = dir.path().join("other.sqlite");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        let err = Ledger::open(&other).err().unwrap().to_string();
        assert!(err.contains("is not a frugal ledger"), "{err}");
        assert!(matches!(
            Ledger::open_existing(&dir.path().join("none.sqlite")),
            Err(LedgerError::Missing(_))
        ));
    }

    #[test]
    fn a_full_disk_is_a_clear_error_and_keeps_what_was_stored() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(&dir.path().join("l.sqlite")).unwrap();
        ledger.append("ok", &[event(1, 1)]).unwrap();
        let pages: i64 = ledger
            .conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap();
        ledger.set_max_pages(pages).unwrap();
        let many: Vec<Event> = (0..50_000).map(|i| event(i, 1)).collect();
        let err = ledger.append("big", &many).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("(the disk is full); nothing from this write was stored"),
            "{text}"
        );
        assert_eq!(ledger.info().unwrap().events, 1);
        assert_eq!(ledger.integrity_check().unwrap(), "ok");
    }
}
