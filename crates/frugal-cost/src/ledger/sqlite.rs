//! The SQLite backend of the ledger: one file in WAL mode with `synchronous = FULL` (a
//! committed row survives a killed process or a power cut), the schema's versions in
//! `PRAGMA user_version`, triggers that refuse UPDATE and DELETE on events and spans.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, params};

use super::{
    Axis, EXPORT, EventIds, EventRow, LedgerError, LedgerInfo, Names, PoolRequests, PriorImport,
    QualityRow, Row, SCHEMA_VERSION, SpanIds, Store, Stored, TrainingSegment, Tx, VisitRollup,
    Window, clamp,
};
use crate::event::{Capacity, Event, Kind, Outcome, Precision, ReplicaSpan};
use crate::money::{Millis, Money};
use crate::rollup::{self, Pending};

use super::decode::{self, Unread};
use super::quality::{self, shadow_codes};
use super::segments;

/// `PRAGMA application_id` of a frugal ledger: "FRUG".
pub(super) const APPLICATION_ID: i64 = 0x4652_5547;

/// Migration `i` takes a ledger from version `i` to `i + 1`; `{ROLLUP}` stands for the
/// rollup table's schema.
pub(super) const MIGRATIONS: &[&str] = &[
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
    r#"
-- v8: a writer's id for each span, unique, as events have one (the gateway's meter gives
-- each), so a retried or replayed commit stores it once; spans written before have none.
ALTER TABLE replica_spans ADD COLUMN row_hash BLOB;
CREATE UNIQUE INDEX replica_spans_row_hash ON replica_spans (row_hash) WHERE row_hash IS NOT NULL;
"#,
    r#"
-- v9: what the prefix cache saved: prompt tokens whose work was reused (the engine's
-- prefill spared, an upstream's cached-input discount).
ALTER TABLE rollup ADD COLUMN saved_prefix INTEGER NOT NULL DEFAULT 0;
"#,
    r#"
-- v10: a semantic hit's chance of being wrong, as the paraphrase verifier judged it; per
-- rollup, the hits judged, their chances summed and the variance of their number wrong
-- (in billionths), for the report's estimate of the wrong-hit rate. Older rows have none.
ALTER TABLE events ADD COLUMN wrong_chance REAL;
ALTER TABLE rollup ADD COLUMN verified_hits INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollup ADD COLUMN expected_wrong INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollup ADD COLUMN wrong_variance INTEGER NOT NULL DEFAULT 0;
"#,
    r#"
-- v11: shadows' rows (the lever whose served answer was run again on the reference path)
-- and the quality samples' verdicts: agreed (0 or 1) and how it was judged. Older rows
-- have none; the index keeps the report's read of them short.
ALTER TABLE events ADD COLUMN shadow_lever INTEGER;
ALTER TABLE events ADD COLUMN shadow_agreed INTEGER;
ALTER TABLE events ADD COLUMN shadow_method INTEGER;
CREATE INDEX events_shadow ON events (ts_ms) WHERE shadow_lever IS NOT NULL;
"#,
];

/// A migration with its placeholders filled in.
pub(super) fn schema(migration: &str) -> String {
    migration
        .replace("{ROLLUP}", crate::rollup::SCHEMA)
        .replace("{ADVISED}", segments::ADVISED)
}

pub(super) fn hint(e: &rusqlite::Error) -> &'static str {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DiskFull) => " (the disk is full)",
        Some(rusqlite::ErrorCode::ReadOnly) => " (it is read-only)",
        Some(rusqlite::ErrorCode::CannotOpen) => " (its folder cannot be written)",
        _ => "",
    }
}

pub(super) struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

impl SqliteStore {
    /// A read's SQLite error as this ledger's.
    fn read_err(&self) -> impl Fn(rusqlite::Error) -> LedgerError + Copy + '_ {
        |source| LedgerError::Read {
            path: self.path.clone(),
            source,
        }
    }

    fn corrupt(&self, what: String) -> LedgerError {
        LedgerError::Corrupt {
            path: self.path.clone(),
            what,
        }
    }

    /// Decodes each of `rows` and hands it to `visit`, which may find it corrupt; how many.
    fn each<T>(
        &self,
        rows: rusqlite::Result<rusqlite::Rows<'_>>,
        row: impl Fn(&rusqlite::Row<'_>) -> Result<T, Unread<rusqlite::Error>>,
        mut visit: impl FnMut(T) -> Result<(), String>,
    ) -> Result<u64, LedgerError> {
        let read_err = self.read_err();
        let mut rows = rows.map_err(read_err)?;
        let mut n = 0;
        while let Some(r) = rows.next().map_err(read_err)? {
            let value = row(r).map_err(|e| e.into_error(read_err, |w| self.corrupt(w)))?;
            visit(value).map_err(|what| self.corrupt(what))?;
            n += 1;
        }
        Ok(n)
    }

    /// Visits the rows of `sql` (a `decode` query) for `window`'s bounds.
    fn in_window<T>(
        &self,
        sql: &str,
        window: Window,
        row: impl Fn(&rusqlite::Row<'_>) -> Result<T, Unread<rusqlite::Error>>,
        visit: &mut dyn FnMut(&T),
    ) -> Result<u64, LedgerError> {
        let mut stmt = self
            .conn
            .prepare(&decode::placeholders(sql, "?"))
            .map_err(self.read_err())?;
        let (since, until) = window.bounds();
        self.each(stmt.query(params![since, until]), row, |value| {
            visit(&value);
            Ok(())
        })
    }

    /// Opens the ledger at `path`, creating and migrating it as needed.
    pub(super) fn open(path: &Path) -> Result<SqliteStore, LedgerError> {
        let open_err = |source| LedgerError::Open {
            path: path.to_owned(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        let mut store = SqliteStore {
            conn,
            path: path.to_owned(),
        };
        match store.prepare() {
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
            other => other.map(|()| store),
        }
    }

    /// The connection, for tests that look under the interface.
    #[cfg(test)]
    pub(super) fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Caps the file's size in pages, so tests can meet a full disk on demand.
    #[cfg(test)]
    pub(super) fn set_max_pages(&self, pages: i64) -> rusqlite::Result<()> {
        self.conn
            .query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))
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
}

impl Store for SqliteStore {
    fn for_meter(&mut self, _statement_timeout: std::time::Duration) -> Result<(), LedgerError> {
        self.conn
            .execute_batch("PRAGMA synchronous = NORMAL;")
            .map_err(|source| LedgerError::Write {
                path: self.path.clone(),
                source,
            })
    }

    fn begin(&mut self, source: &str, format: &str) -> Result<Box<dyn Tx + '_>, LedgerError> {
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
        Ok(Box::new(SqliteTx {
            tx,
            path,
            import_id,
        }))
    }

    fn names(&self) -> Result<Names, LedgerError> {
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
    fn tenant_spend(&self, since_ms: Millis) -> Result<Vec<(String, Money)>, LedgerError> {
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
    fn quality(
        &self,
        window: Window,
        visit: &mut dyn FnMut(&QualityRow),
    ) -> Result<u64, LedgerError> {
        self.in_window(quality::QUALITY, window, |r| quality::quality(r), visit)
    }

    fn scan(&self, window: Window, visit: &mut dyn FnMut(&Row)) -> Result<u64, LedgerError> {
        self.in_window(decode::SCAN, window, |r| decode::row(r), visit)
    }

    /// Calls `visit` for every pool replica span that starts in the window, in time order.
    fn spans(
        &self,
        window: Window,
        visit: &mut dyn FnMut(&ReplicaSpan),
    ) -> Result<u64, LedgerError> {
        self.in_window(decode::SPANS, window, |r| decode::span(r), visit)
    }

    fn wait_percentiles(
        &self,
        requests: &PoolRequests<'_>,
        percents: &[u32],
    ) -> Result<Vec<Option<Millis>>, LedgerError> {
        let read_err = self.read_err();
        let q = requests;
        let args: [&dyn rusqlite::ToSql; 8] = [&q.0, &q.1, &q.2, &q.3, &q.4, &q.5, &q.6, &q.7];
        let (all, waited): (i64, i64) = self
            .conn
            .query_row(
                &decode::placeholders(&decode::waits_counted(), "?"),
                &args[..],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(read_err)?;
        let mut stmt = self
            .conn
            .prepare(&decode::placeholders(&decode::wait_at(), "?"))
            .map_err(read_err)?;
        decode::wait_ranks(all, waited, percents, |offset| {
            let mut with_offset = args.to_vec();
            with_offset.push(&offset);
            stmt.query_row(&with_offset[..], |r| r.get(0))
                .map_err(read_err)
        })
    }

    fn rollups(&self, hours: Window, visit: &mut VisitRollup<'_>) -> Result<u64, LedgerError> {
        let mut stmt = self
            .conn
            .prepare_cached(&decode::placeholders(decode::ROLLUPS, "?"))
            .map_err(self.read_err())?;
        let (since, until) = hours.bounds();
        let rows = stmt.query(params![since, until]);
        self.each(rows, |r| decode::rollup(r), |values| visit(&values))
    }

    fn training_segments(
        &self,
        hours: Window,
        visit: &mut dyn FnMut(&TrainingSegment),
    ) -> Result<u64, LedgerError> {
        let mut stmt = self
            .conn
            .prepare_cached(&decode::placeholders(&decode::segments_query(), "?"))
            .map_err(self.read_err())?;
        let (since, until) = hours.bounds();
        let rows = stmt.query(params![since, until, Kind::Training.code()]);
        self.each(
            rows,
            |r| decode::segment(r),
            |segment| {
                visit(&segment);
                Ok(())
            },
        )
    }

    fn info(&self) -> Result<LedgerInfo, LedgerError> {
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

    fn export_events(&self, after_id: i64, limit: i64) -> Result<Vec<Stored>, LedgerError> {
        let sql = EXPORT.replace("{AFTER}", "?1").replace("{LIMIT}", "?2");
        let mut stmt = self.conn.prepare_cached(&sql).map_err(self.read_err())?;
        let rows = stmt.query(params![after_id, limit]);
        let mut stored = Vec::new();
        self.each(
            rows,
            |r| decode::export(r),
            |row| {
                stored.push(row.into_stored()?);
                Ok(())
            },
        )?;
        Ok(stored)
    }

    #[cfg(test)]
    fn as_sqlite(&self) -> Option<&SqliteStore> {
        Some(self)
    }

    /// SQLite's own check of the file, for tests and `frugal ledger info --check`.
    fn integrity_check(&self) -> Result<String, LedgerError> {
        self.conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(|source| LedgerError::Read {
                path: self.path.clone(),
                source,
            })
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

/// One write's transaction; see `Ledger::import`.
struct SqliteTx<'a> {
    tx: rusqlite::Transaction<'a>,
    path: PathBuf,
    import_id: i64,
}

impl SqliteTx<'_> {
    fn write_err(&self, source: rusqlite::Error) -> LedgerError {
        LedgerError::Write {
            path: self.path.clone(),
            source,
        }
    }

    fn insert_event(
        &mut self,
        e: &Event,
        ids: &EventIds,
        key: Option<&[u8; 16]>,
    ) -> Result<bool, LedgerError> {
        let shadow = shadow_codes(e);
        let stored = self
            .tx
            .prepare_cached(
                "INSERT INTO events (ts_ms, duration_ms, kind, workload, model, run, instance,
                    region, capacity, instances, requests, input_tokens, output_tokens,
                    cached_tokens, utilization, cost, input_cost, list_cost, outcome, lost_ms,
                    import, saved, lever, tenant, row_hash, wait_ms, mfu, precision, data_stall,
                    sync_stall, wrong_chance, shadow_lever, shadow_agreed, shadow_method)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                    ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31,
                    ?32, ?33, ?34)
                 ON CONFLICT (row_hash) WHERE row_hash IS NOT NULL DO NOTHING",
            )
            .and_then(|mut s| {
                s.execute(params![
                    e.ts_ms,
                    e.duration_ms,
                    e.kind.code(),
                    ids.workload,
                    ids.model,
                    ids.run,
                    ids.instance,
                    ids.region,
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
                    ids.tenant,
                    key.map(|k| &k[..]),
                    e.wait_ms,
                    e.mfu,
                    e.precision.map(Precision::code),
                    e.data_stall,
                    e.sync_stall,
                    crate::wrong::chance(e.wrong_chance),
                    shadow[0],
                    shadow[1],
                    shadow[2],
                ])
            })
            .map_err(|err| self.write_err(err))?;
        Ok(stored > 0)
    }
}

impl Tx for SqliteTx<'_> {
    fn dim(&mut self, axis: Axis, name: &str) -> Result<i64, LedgerError> {
        self.tx
            .prepare_cached(
                "INSERT INTO dims (axis, name) VALUES (?1, ?2)
                 ON CONFLICT (axis, name) DO UPDATE SET name = excluded.name RETURNING id",
            )
            .and_then(|mut s| s.query_row(params![axis as i64, name], |r| r.get(0)))
            .map_err(|e| self.write_err(e))
    }

    fn file_imported(&mut self, sha256: &str) -> Result<Option<PriorImport>, LedgerError> {
        let found = prior_imports(
            &self.tx,
            "WHERE sha256 = ?1 ORDER BY at_ms, id LIMIT 1",
            params![sha256],
        );
        found
            .map(|v| v.into_iter().next())
            .map_err(|e| self.write_err(e))
    }

    fn row_imported(&mut self, key: &[u8; 16]) -> Result<Option<PriorImport>, LedgerError> {
        let found = prior_imports(
            &self.tx,
            "WHERE id = (SELECT import FROM events WHERE row_hash = ?1)",
            params![&key[..]],
        );
        found
            .map(|v| v.into_iter().next())
            .map_err(|e| self.write_err(e))
    }

    fn copy_import(&mut self, file: &PriorImport) -> Result<bool, LedgerError> {
        self.tx
            .execute(
                "INSERT INTO imports (at_ms, source, format, rows, sha256)
                 SELECT ?1, ?2, ?3, ?4, ?5 WHERE NOT EXISTS (SELECT 1 FROM imports
                     WHERE at_ms = ?1 AND source = ?2 AND sha256 IS ?5)",
                params![
                    file.at_ms,
                    file.source,
                    file.format,
                    clamp(file.rows),
                    file.sha256
                ],
            )
            .map(|n| n > 0)
            .map_err(|e| self.write_err(e))
    }

    fn insert_span(&mut self, span: &ReplicaSpan, ids: &SpanIds) -> Result<bool, LedgerError> {
        let stored = self
            .tx
            .prepare_cached(
                "INSERT INTO replica_spans (ts_ms, duration_ms, workload, pool, replica, state,
                    busy_ms, cost, instance, min_replicas, max_replicas, need_bytes, failed, import,
                    server, requests, input_tokens, output_tokens, row_hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                    ?17, ?18, ?19)
                 ON CONFLICT (row_hash) WHERE row_hash IS NOT NULL DO NOTHING",
            )
            .and_then(|mut s| {
                s.execute(params![
                    span.ts_ms,
                    span.duration_ms,
                    ids.workload,
                    ids.pool,
                    span.replica,
                    span.state.code(),
                    span.busy_ms,
                    span.cost.nanos(),
                    ids.instance,
                    span.min_replicas,
                    span.max_replicas,
                    span.need_bytes.map(clamp),
                    i64::from(span.failed),
                    self.import_id,
                    ids.server,
                    clamp(span.requests),
                    clamp(span.input_tokens),
                    clamp(span.output_tokens),
                    span.id.as_ref().map(|k| &k[..]),
                ])
            })
            .map_err(|err| self.write_err(err))?;
        Ok(stored > 0)
    }

    fn insert_events(&mut self, rows: &[EventRow<'_>]) -> Result<Vec<bool>, LedgerError> {
        rows.iter()
            .map(|r| self.insert_event(r.event, &r.ids, r.key.as_ref()))
            .collect()
    }

    fn commit(
        self: Box<Self>,
        rollups: Pending,
        rows: u64,
        sha256: Option<&str>,
    ) -> Result<(), LedgerError> {
        let write_err = |source| LedgerError::Write {
            path: self.path.clone(),
            source,
        };
        {
            let mut stmt = self
                .tx
                .prepare_cached(rollup::SQLITE_UPSERT)
                .map_err(write_err)?;
            for values in rollups.into_values() {
                stmt.execute(rusqlite::params_from_iter(values))
                    .map_err(write_err)?;
            }
        }
        self.tx
            .execute(
                "UPDATE imports SET rows = ?1, sha256 = ?2 WHERE id = ?3",
                params![clamp(rows), sha256, self.import_id],
            )
            .map_err(write_err)?;
        let SqliteTx { tx, path, .. } = *self;
        tx.commit()
            .map_err(|source| LedgerError::Write { path, source })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::{Ledger, RowHash};
    use super::*;
    use crate::event::ReplicaState;
    use crate::ledger::testing::{V9_ROLLUP, semantic_hit, v9_rows_kept, wrong_sums};
    use crate::test_events::event;
    use crate::wrong::Chances;

    /// On both backends (`on_postgres!` below).
    #[test]
    fn append_then_scan_round_trips_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = crate::ledger::testing::fresh(dir.path());
        let mut e = event(10, 5);
        e.capacity = Some(Capacity::Spot);
        e.outcome = Some(Outcome::Preempted);
        e.utilization = Some(0.5);
        e.list_cost = Some(Money::from_cents(9));
        e.tenant = Some("acme".into());
        assert_eq!(ledger.append("t", &[e, event(5, 1)]).unwrap(), 2);
        let location = ledger.location().clone();
        drop(ledger);
        let ledger = Ledger::open_existing(location).unwrap();
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
        let info = ledger.info().unwrap();
        assert_eq!((info.events, info.schema_version), (2, SCHEMA_VERSION));
        assert_eq!(info.total_cost, Money::from_cents(6));
        let shown = info.path.display().to_string();
        assert!(!shown.contains(frugal_testkit::postgres::PASSWORD));
        assert_eq!(
            ledger.tenant_spend(0).unwrap(),
            [("acme".to_owned(), Money::from_cents(5))]
        );
        assert_eq!(ledger.integrity_check().unwrap(), "ok");
    }

    /// On both backends (`on_postgres!` below).
    #[test]
    fn a_failed_import_stores_nothing_and_the_ledger_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = crate::ledger::testing::fresh(dir.path());
        ledger.append("ok", &[event(1, 1)]).unwrap();
        let result: Result<(u64, ()), LedgerError> = ledger.import("bad", "csv", |sink| {
            sink.push(&event(2, 1))?;
            Err(LedgerError::Missing("stand-in for a bad row".into()))
        });
        assert!(result.is_err());
        let info = ledger.info().unwrap();
        assert_eq!((info.events, info.imports), (1, 1));
        let mut hours = 0;
        ledger
            .rollups(Window::default(), |_, _| hours += 1)
            .unwrap();
        assert_eq!(hours, 1, "the failed import's rollups went with it");
        ledger.append("again", &[event(3, 1)]).unwrap();
        assert_eq!(ledger.info().unwrap().events, 2);
    }

    /// Issue 34, on both backends (`on_postgres!` below): a semantic hit's chance of being
    /// wrong is stored by a batch big enough for PostgreSQL's COPY and by a small one, read
    /// back by the scan and the export, and summed in the rollups.
    #[test]
    fn wrong_chances_round_trip_and_roll_up() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = crate::ledger::testing::fresh(dir.path());
        let many: Vec<Event> = (0..300).map(|i| semantic_hit(i, Some(0.02))).collect();
        ledger.append("meter", &many).unwrap();
        let few = [semantic_hit(1_000, Some(0.125)), semantic_hit(1_001, None)];
        ledger.append("meter", &few).unwrap();
        let mut seen = Vec::new();
        ledger
            .scan(Window::default(), |r| seen.push((r.ts_ms, r.wrong_chance)))
            .unwrap();
        seen.sort_by_key(|(ts, _)| *ts);
        assert_eq!(seen.len(), 302);
        assert!(
            seen[..300].iter().all(|(_, w)| *w == Some(0.02)),
            "{seen:?}"
        );
        assert_eq!(seen[300..], [(1_000, Some(0.125)), (1_001, None)]);
        let exported = ledger.store.export_events(i64::MIN, 1_000).unwrap();
        let chances: Vec<Option<f64>> = exported.iter().map(|s| s.event.wrong_chance).collect();
        assert!(chances[..300].iter().all(|w| *w == Some(0.02)));
        assert_eq!(chances[300..], [Some(0.125), None]);
        let (hits, expected, variance) = wrong_sums(&ledger);
        assert_eq!(hits, 301);
        // 300 · 0.02 + 0.125; 300 · 0.02 · 0.98 + 0.125 · 0.875.
        assert_eq!(expected, Chances::from_billionths(6_125_000_000));
        assert_eq!(
            variance,
            Chances::from_billionths(5_880_000_000 + 109_375_000)
        );
    }

    crate::ledger::testing::on_postgres!(
        append_then_scan_round_trips_and_reopens,
        a_failed_import_stores_nothing_and_the_ledger_goes_on,
        row_hashes_and_files_are_found_again,
        wrong_chances_round_trip_and_roll_up
    );

    #[test]
    fn a_v9_ledger_gains_wrong_chances_and_keeps_its_rows_and_rollups() {
        let dir = tempfile::tempdir().unwrap();
        // A ledger as frugal wrote it before the verifier: an event and its rollup row.
        let mut ledger = old_ledger(
            dir.path(),
            9,
            &format!(
                "INSERT INTO imports (id, at_ms, source, format) VALUES (1, 0, 't', 'api');
                 {OLD_EVENTS}, saved, lever) VALUES (5, 0, 0, 1, 1, 1, 0, 0, 0, 7, 0, 1, 30, 1);
                 {V9_ROLLUP}"
            ),
        );
        ledger.append("t", &[semantic_hit(10, Some(0.25))]).unwrap();
        let version: i64 = ledger
            .sqlite_conn()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!((version, SCHEMA_VERSION), (11, 11));
        v9_rows_kept(&ledger);
        // v11: shadows' columns added in place.
        crate::ledger::testing::shadows_stored(&mut ledger, 4);
        assert_eq!(ledger.integrity_check().unwrap(), "ok");
    }

    #[test]
    fn events_cannot_be_changed_or_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
        ledger.append("ok", &[event(1, 1)]).unwrap();
        refused_as_append_only(
            &ledger,
            &["UPDATE events SET cost = 0", "DELETE FROM events"],
        );
    }

    /// Each of `statements` fails: the ledger is append-only.
    fn refused_as_append_only(ledger: &Ledger, statements: &[&str]) {
        for sql in statements {
            let err = ledger
                .sqlite_conn()
                .execute(sql, [])
                .unwrap_err()
                .to_string();
            assert!(err.contains("append-only"), "{err}");
        }
    }

    /// The columns of `events` in every schema version, for an old ledger's rows.
    const OLD_EVENTS: &str = "INSERT INTO events (ts_ms, duration_ms, kind, workload,
        instances, requests, input_tokens, output_tokens, cached_tokens, cost, lost_ms, import";

    /// A ledger at schema `version`, as frugal wrote it then, holding the workload `chat`
    /// (dim 1) and `rows` (SQL), opened by this frugal.
    fn old_ledger(dir: &std::path::Path, version: usize, rows: &str) -> Ledger {
        let path = dir.join("l.sqlite");
        let conn = Connection::open(&path).unwrap();
        for m in &MIGRATIONS[..version] {
            conn.execute_batch(&schema(m)).unwrap();
        }
        conn.execute_batch(&format!(
            "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {version};
             INSERT INTO dims (id, axis, name) VALUES (1, 0, 'chat');\n{rows}"
        ))
        .unwrap();
        drop(conn);
        Ledger::open(&path).unwrap()
    }

    #[test]
    fn a_v1_ledger_is_upgraded_in_place_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        // A ledger as frugal wrote it before savings were kept.
        let mut ledger = old_ledger(
            dir.path(),
            1,
            &format!(
                "INSERT INTO imports (id, at_ms, source, format) VALUES (1, 0, 't', 'api');
                 {OLD_EVENTS}) VALUES (5, 0, 0, 1, 1, 1, 0, 0, 0, 7, 0, 1);"
            ),
        );
        let mut hit = event(10, 0);
        hit.saved = Money::from_cents(3);
        hit.lever = Some(crate::event::Lever::Cache);
        let mut batched = event(20, 1);
        batched.saved = Money::from_cents(2);
        batched.lever = Some(crate::event::Lever::Batching);
        let mut reused = event(30, 2);
        reused.saved = Money::from_cents(4);
        reused.lever = Some(crate::event::Lever::PrefixCache);
        ledger.append("t", &[hit, batched, reused]).unwrap();
        let version: i64 = ledger
            .sqlite_conn()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let rows: Vec<(i64, i64, Option<i64>)> = ledger
            .sqlite_conn()
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
                (10_000_000, 20_000_000, Some(3)),
                (20_000_000, 40_000_000, Some(4))
            ]
        );
        let saved: (i64, i64, i64) = ledger
            .sqlite_conn()
            .query_row(
                "SELECT sum(saved_cache), sum(saved_batching), sum(saved_prefix) FROM rollup",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(saved, (30_000_000, 20_000_000, 40_000_000));
    }

    #[test]
    fn a_v3_ledger_gains_row_hashes_and_keeps_its_rows_and_imports() {
        let dir = tempfile::tempdir().unwrap();
        // A ledger as frugal wrote it before imports were known again.
        let mut ledger = old_ledger(
            dir.path(),
            3,
            &format!(
                "INSERT INTO imports (id, at_ms, source, format, rows)
                     VALUES (1, 1000, 'old.csv', 'csv', 1), (2, 2000, 'frugal serve', 'api', 1);
                 {OLD_EVENTS}) VALUES (5, 0, 0, 1, 1, 1, 0, 0, 0, 7, 0, 1),
                                      (6, 0, 0, 1, 1, 1, 0, 0, 0, 8, 0, 2);"
            ),
        );
        let hash = RowHash([7; 16]);
        assert_eq!(
            import_one_hash_twice(&mut ledger, hash, &[event(12, 1)]),
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
            .sqlite_conn()
            .query_row("SELECT count(row_hash) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(hashed, 1, "only imported rows carry a row hash");
        let err = ledger
            .sqlite_conn()
            .execute(
                &format!("{OLD_EVENTS}, row_hash) VALUES (1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1, ?1)"),
                [&hash.0[..]],
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("UNIQUE"), "{err}");
        found_again(&mut ledger, hash, 2);
    }

    /// Imports `new.csv` (its SHA-256 "ab" 32 times): `event(10, 1)` and `event(11, 1)`
    /// under one row `hash`, then `more` without; the rows stored, and whether each of the
    /// two was.
    fn import_one_hash_twice(
        ledger: &mut Ledger,
        hash: RowHash,
        more: &[Event],
    ) -> (u64, (bool, bool)) {
        ledger
            .import("new.csv", "csv", |sink| {
                sink.set_file_sha256("ab".repeat(32));
                let first = sink.push_row(&event(10, 1), hash)?;
                let again = sink.push_row(&event(11, 1), hash)?;
                for e in more {
                    sink.push(e)?;
                }
                Ok::<_, LedgerError>((first, again))
            })
            .unwrap()
    }

    /// The row `hash` and the file `import_one_hash_twice` stored (with its `rows`) are
    /// known again; another file is not.
    fn found_again(ledger: &mut Ledger, hash: RowHash, rows: u64) {
        let result: Result<(u64, ()), LedgerError> = ledger.import("look", "csv", |sink| {
            assert_eq!(sink.row_imported(hash)?.unwrap().source, "new.csv");
            let file = sink.file_imported(&"ab".repeat(32))?.unwrap();
            assert_eq!((file.source.as_str(), file.rows), ("new.csv", rows));
            assert!(sink.file_imported("cd")?.is_none());
            Ok(())
        });
        result.unwrap();
    }

    /// On both backends (`on_postgres!` above).
    #[test]
    fn row_hashes_and_files_are_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = crate::ledger::testing::fresh(dir.path());
        let hash = RowHash([7; 16]);
        assert_eq!(
            import_one_hash_twice(&mut ledger, hash, &[]),
            (1, (true, false))
        );
        found_again(&mut ledger, hash, 1);
    }

    /// A minute of `replica` of pool `qwen` (of at most 4) in `state`, for 2 cents.
    fn span(ts: i64, replica: u32, state: ReplicaState) -> ReplicaSpan {
        ReplicaSpan {
            pool: "qwen".into(),
            replica,
            state,
            max_replicas: 4,
            ..crate::test_events::span(ts, Money::from_cents(2))
        }
    }

    #[test]
    fn a_v4_ledger_gains_waits_and_replica_spans_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        // A ledger as frugal wrote it before pools.
        let mut ledger = old_ledger(
            dir.path(),
            4,
            &format!(
                "INSERT INTO dims (id, axis, name) VALUES (2, 1, 'qwen');
                 INSERT INTO imports (id, at_ms, source, format, rows, sha256)
                     VALUES (1, 1000, 'old.csv', 'csv', 1, 'ab');
                 {OLD_EVENTS}, model, row_hash)
                     VALUES (5, 0, 0, 1, 1, 1, 0, 0, 0, 7, 0, 1, 2, x'01');"
            ),
        );
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
    fn a_span_written_twice_with_its_id_is_stored_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
        let mut keyed = span(100, 2, ReplicaState::Ready);
        keyed.id = Some([7; 16]);
        let plain = span(200, 1, ReplicaState::Ready);
        assert_eq!(
            ledger
                .append_with_spans("t", &[], &[keyed.clone(), plain.clone()])
                .unwrap(),
            2
        );
        // A retried commit: the keyed span again is skipped; one without an id is not.
        assert_eq!(
            ledger
                .append_with_spans("t", &[], &[keyed.clone(), plain])
                .unwrap(),
            1
        );
        let mut seen = Vec::new();
        ledger
            .spans(Window::default(), |s| seen.push(s.clone()))
            .unwrap();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen.iter().filter(|s| s.id == keyed.id).count(), 1);
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
        refused_as_append_only(
            &ledger,
            &[
                "UPDATE replica_spans SET cost = 0",
                "DELETE FROM replica_spans",
            ],
        );
    }

    #[test]
    fn a_failed_write_stores_neither_events_nor_spans() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
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
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
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
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
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
        let newer = SCHEMA_VERSION + 1;
        ledger
            .sqlite_conn()
            .execute_batch(&format!("PRAGMA user_version = {newer}"))
            .unwrap();
        drop(ledger);
        let err = Ledger::open(&path).err().unwrap().to_string();
        let want = format!(
            "schema version {newer}, newer than this frugal understands ({SCHEMA_VERSION})"
        );
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
            Ledger::open_existing(dir.path().join("none.sqlite")),
            Err(LedgerError::Missing(_))
        ));
    }

    #[test]
    fn a_full_disk_is_a_clear_error_and_keeps_what_was_stored() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
        ledger.append("ok", &[event(1, 1)]).unwrap();
        let pages: i64 = ledger
            .sqlite_conn()
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap();
        ledger.sqlite().set_max_pages(pages).unwrap();
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
