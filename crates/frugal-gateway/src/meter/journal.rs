//! The meter's journal: every settled row is written here first, and a shipper moves it to
//! a PostgreSQL ledger, oldest first (see `ship`). A SQLite ledger is its own journal.
//!
//! The file is not a ledger: one table of rows in the order they came, each an event or a
//! span as JSON with its id beside it (the ledger skips an id it holds, so a batch shipped
//! twice, after a crash between the ledger's commit and the journal's delete, is stored
//! once). Its version is in `PRAGMA user_version`, its kind in `PRAGMA application_id`; a
//! file that is neither empty nor a journal is refused, not overwritten, since it may hold
//! usage not yet in the ledger. Each push is one transaction in WAL mode with
//! `synchronous = NORMAL`: a committed push survives a killed process without an fsync per
//! request (the WAL is synced at each checkpoint; only a power loss can take the last
//! pushes). The writer and the shipper hold a connection each; the row count is shared.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use frugal_cost::{Event, ReplicaSpan};
use rusqlite::{Connection, OptionalExtension, params};

/// `PRAGMA application_id` of a journal: "FRSP" (it began as the spool of an unreachable
/// ledger; the format is the same, so a spool left by an older frugal is shipped too).
const APPLICATION_ID: i64 = 0x4652_5350;
/// The journal's format; a newer one is refused.
const VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE rows (
    seq  INTEGER PRIMARY KEY AUTOINCREMENT,
    span INTEGER NOT NULL,
    id   BLOB,
    body TEXT NOT NULL
);";

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("cannot open the ledger journal {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "{0} is not a frugal ledger journal; move it away or set `ledger.spool` to another file"
    )]
    NotAJournal(PathBuf),
    #[error(
        "ledger journal {path} holds {rows} rows, its limit: the ledger has been away too long"
    )]
    Full { path: PathBuf, rows: u64 },
    #[error(
        "ledger journal {path} has version {found}, newer than this frugal understands ({VERSION}); replay it with a newer frugal"
    )]
    Newer { path: PathBuf, found: i64 },
    #[error("cannot write the ledger journal {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot read the ledger journal {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("ledger journal {path} holds a row this frugal cannot read (seq {seq}): {what}")]
    Corrupt {
        path: PathBuf,
        seq: i64,
        what: String,
    },
}

/// Rows a journal holds at most: past it a push is refused as a full disk would refuse it
/// (the meter keeps the rows in memory, then counts what it drops). About 1.5 GB of rows,
/// days of a busy gateway's traffic: a ledger away that long needs a person, not a bigger
/// file.
pub const MAX_ROWS: u64 = 4_000_000;
/// How long a connection waits for the other's transaction (the writer's push, the
/// shipper's delete): both are short, and the writer must not stall behind a stuck file.
const BUSY_WAIT: Duration = Duration::from_secs(1);

/// The oldest rows of the journal, in order, and the last one's place.
#[derive(Debug, Default)]
pub struct Batch {
    pub events: Vec<Event>,
    pub spans: Vec<ReplicaSpan>,
    /// `remove_through(last)` drops this batch.
    pub last: i64,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.events.len() + self.spans.len()
    }
}

/// One connection to a journal file.
pub struct Journal {
    path: PathBuf,
    conn: Connection,
    /// Rows in the file, shared by every connection to it.
    rows: Arc<AtomicU64>,
}

impl Journal {
    /// Opens the journal at `path`, making it if there is none (and refusing, with the
    /// reason, a file that is not a readable journal).
    pub fn open(path: &Path) -> Result<Journal, JournalError> {
        let (conn, rows) = prepare(path)?;
        Ok(Journal {
            path: path.to_owned(),
            conn,
            rows: Arc::new(AtomicU64::new(rows)),
        })
    }

    /// A second connection to the same file, sharing its row count.
    pub fn another(&self) -> Result<Journal, JournalError> {
        let (conn, _) = prepare(&self.path)?;
        Ok(Journal {
            path: self.path.clone(),
            conn,
            rows: self.rows.clone(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Rows waiting to be shipped.
    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Acquire)
    }

    /// Appends rows in one transaction: all of them are in the journal, or none.
    pub fn push(&mut self, events: &[Event], spans: &[ReplicaSpan]) -> Result<(), JournalError> {
        let n = (events.len() + spans.len()) as u64;
        if self.rows() + n > MAX_ROWS {
            return Err(JournalError::Full {
                path: self.path.clone(),
                rows: self.rows(),
            });
        }
        let path = self.path.clone();
        let write = |source| JournalError::Write {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(write)?;
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO rows (span, id, body) VALUES (?1, ?2, ?3)")
                .map_err(write)?;
            let json = |v: serde_json::Result<String>| {
                v.map_err(|e| write(rusqlite::Error::ToSqlConversionFailure(Box::new(e))))
            };
            for e in events {
                let body = json(serde_json::to_string(e))?;
                insert
                    .execute(params![0, e.id.as_ref().map(|k| &k[..]), body])
                    .map_err(write)?;
            }
            for s in spans {
                let body = json(serde_json::to_string(s))?;
                insert
                    .execute(params![1, s.id.as_ref().map(|k| &k[..]), body])
                    .map_err(write)?;
            }
        }
        tx.commit().map_err(write)?;
        self.rows.fetch_add(n, Ordering::AcqRel);
        Ok(())
    }

    /// Up to `limit` of the oldest rows.
    pub fn oldest(&mut self, limit: usize) -> Result<Batch, JournalError> {
        let path = self.path.clone();
        let read = |source| JournalError::Read {
            path: path.clone(),
            source,
        };
        let mut batch = Batch::default();
        if self.rows() == 0 {
            return Ok(batch);
        }
        let mut stmt = self
            .conn
            .prepare_cached("SELECT seq, span, id, body FROM rows ORDER BY seq LIMIT ?1")
            .map_err(read)?;
        let mut rows = stmt
            .query(params![i64::try_from(limit).unwrap_or(i64::MAX)])
            .map_err(read)?;
        while let Some(r) = rows.next().map_err(read)? {
            let seq: i64 = r.get(0).map_err(read)?;
            let corrupt = |what: String| JournalError::Corrupt {
                path: path.clone(),
                seq,
                what,
            };
            let span: i64 = r.get(1).map_err(read)?;
            let id = r
                .get::<_, Option<Vec<u8>>>(2)
                .map_err(read)?
                .map(|k| <[u8; 16]>::try_from(k.as_slice()))
                .transpose()
                .map_err(|_| corrupt("an id that is not 16 bytes".into()))?;
            let body: String = r.get(3).map_err(read)?;
            if span == 0 {
                let mut e: Event =
                    serde_json::from_str(&body).map_err(|e| corrupt(e.to_string()))?;
                e.id = id;
                batch.events.push(e);
            } else {
                let mut s: ReplicaSpan =
                    serde_json::from_str(&body).map_err(|e| corrupt(e.to_string()))?;
                s.id = id;
                batch.spans.push(s);
            }
            batch.last = seq;
        }
        if batch.len() == 0 {
            // Another connection emptied it (a shipper left behind at a shutdown that
            // caught up later): the count follows the file.
            self.rows.store(0, Ordering::Release);
        }
        Ok(batch)
    }

    /// Drops the rows up to `last` (a batch the ledger has committed).
    pub fn remove_through(&mut self, last: i64) -> Result<(), JournalError> {
        let path = self.path.clone();
        let write = |source| JournalError::Write {
            path: path.clone(),
            source,
        };
        let removed = self
            .conn
            .execute("DELETE FROM rows WHERE seq <= ?1", params![last])
            .map_err(write)?;
        let _ = self
            .rows
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(removed as u64))
            });
        Ok(())
    }
}

/// Opens (creating) the file at `path` as a journal; returns it and the rows it holds.
fn prepare(path: &Path) -> Result<(Connection, u64), JournalError> {
    let open = |source| JournalError::Open {
        path: path.to_owned(),
        source,
    };
    let conn = Connection::open(path).map_err(open)?;
    let not_journal = |e: rusqlite::Error| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => JournalError::NotAJournal(path.to_owned()),
        _ => open(e),
    };
    let pragma = |name: &str| -> Result<i64, JournalError> {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
            .map_err(not_journal)
    };
    let (app, version) = (pragma("application_id")?, pragma("user_version")?);
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(not_journal)?;
    if app != APPLICATION_ID && (tables > 0 || app != 0) {
        return Err(JournalError::NotAJournal(path.to_owned()));
    }
    if version > VERSION {
        return Err(JournalError::Newer {
            path: path.to_owned(),
            found: version,
        });
    }
    let write = |source| JournalError::Write {
        path: path.to_owned(),
        source,
    };
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
        .map_err(write)?;
    conn.busy_timeout(BUSY_WAIT).map_err(write)?;
    if version == 0 {
        conn.execute_batch(&format!(
            "BEGIN; {SCHEMA} PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {VERSION}; COMMIT;"
        ))
        .map_err(write)?;
    }
    let rows: Option<i64> = conn
        .query_row("SELECT count(*) FROM rows", [], |r| r.get(0))
        .optional()
        .map_err(|source| JournalError::Read {
            path: path.to_owned(),
            source,
        })?;
    Ok((conn, rows.unwrap_or(0).max(0) as u64))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use frugal_cost::Money;

    use super::*;

    fn event(ts: i64, nanos: i64, id: u8) -> Event {
        Event {
            workload: "w".into(),
            cost: Money::from_nanos(nanos),
            utilization: Some(0.1 + 0.2),
            tenant: Some("acme".into()),
            id: Some([id; 16]),
            requests: 0,
            ..frugal_testkit::events::event(ts, 0)
        }
    }

    fn span(id: u8) -> ReplicaSpan {
        ReplicaSpan {
            id: Some([id; 16]),
            workload: "w".into(),
            busy_ms: 10,
            instance_type: Some("g5.xlarge".into()),
            max_replicas: 2,
            need_bytes: Some(1 << 33),
            ..frugal_testkit::events::span(5, Money::from_nanos(123))
        }
    }

    #[test]
    fn rows_come_back_oldest_first_exactly_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.sqlite");
        let mut journal = Journal::open(&path).unwrap();
        let first = [event(1, 7, 1), event(2, 8, 2)];
        journal.push(&first, &[span(3)]).unwrap();
        journal.push(&[event(3, 9, 4)], &[]).unwrap();
        drop(journal);
        let journal = Journal::open(&path).unwrap();
        // The shipper reads on a connection of its own; the writer goes on pushing.
        let mut spool = journal.another().unwrap();
        assert_eq!(spool.rows(), 4);
        let batch = spool.oldest(3).unwrap();
        assert_eq!(batch.events, first, "ids, floats and money round-trip");
        assert_eq!(batch.spans, [span(3)]);
        spool.remove_through(batch.last).unwrap();
        assert_eq!((spool.rows(), journal.rows()), (1, 1), "one count for both");
        let rest = spool.oldest(10).unwrap();
        assert_eq!(rest.events, [event(3, 9, 4)]);
        spool.remove_through(rest.last).unwrap();
        assert_eq!((spool.rows(), spool.oldest(10).unwrap().len()), (0, 0));
    }

    #[test]
    fn a_full_journal_stores_nothing_of_the_push_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.sqlite");
        let mut spool = Journal::open(&path).unwrap();
        spool.push(&[event(1, 1, 1)], &[]).unwrap();
        // The file may not grow past its size now: as a full disk.
        let pages: i64 = spool
            .conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap();
        spool
            .conn
            .query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))
            .unwrap();
        let many: Vec<Event> = (0..2000).map(|i| event(i, 1, (i % 250) as u8)).collect();
        let err = spool.push(&many, &[]).unwrap_err();
        assert!(
            err.to_string().contains("cannot write the ledger journal"),
            "{err}"
        );
        assert_eq!(spool.rows(), 1);
        drop(spool);
        assert_eq!(Journal::open(&path).unwrap().rows(), 1, "nothing partial");
    }

    #[test]
    fn past_its_bound_a_journal_refuses_the_push_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(&dir.path().join("journal.sqlite")).unwrap();
        journal.rows.store(MAX_ROWS - 1, Ordering::Release);
        let err = journal
            .push(&[event(1, 1, 1), event(2, 1, 2)], &[])
            .unwrap_err();
        assert!(matches!(err, JournalError::Full { .. }), "{err}");
        journal.push(&[event(1, 1, 1)], &[]).unwrap();
    }

    #[test]
    fn other_files_and_newer_journals_are_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "not a database, and longer than a header would be ........................................................................................").unwrap();
        let err = Journal::open(&text).err().unwrap().to_string();
        assert!(err.contains("is not a frugal ledger journal"), "{err}");
        let other = dir.path().join("other.sqlite");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE t (x INTEGER)")
            .unwrap();
        assert!(matches!(
            Journal::open(&other),
            Err(JournalError::NotAJournal(_))
        ));
        let newer = dir.path().join("newer.sqlite");
        Journal::open(&newer)
            .unwrap()
            .push(&[event(1, 1, 1)], &[])
            .unwrap();
        Connection::open(&newer)
            .unwrap()
            .execute_batch("PRAGMA user_version = 2")
            .unwrap();
        let err = Journal::open(&newer).err().unwrap().to_string();
        assert!(err.contains("version 2, newer"), "{err}");
        assert!(std::fs::read(&text).unwrap().starts_with(b"not a database"));
    }
}
