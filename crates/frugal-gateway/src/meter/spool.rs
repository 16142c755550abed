//! The meter's spool: rows a PostgreSQL ledger could not take, kept in a local SQLite file
//! until they are replayed into it, oldest first.
//!
//! The file is not a ledger: one table of rows in the order they were spooled, each an
//! event or a span as JSON with its id beside it (the ledger skips an id it holds, so a
//! batch replayed twice, after a crash between the ledger's commit and the spool's delete,
//! is stored once). Its version is in `PRAGMA user_version`, its kind in
//! `PRAGMA application_id`; a file that is neither empty nor a spool is refused, not
//! overwritten, since it may hold usage not yet in the ledger. The file is made on the
//! first row that needs it, so a healthy ledger leaves none behind; every push is one
//! transaction, synced (WAL, `synchronous = FULL`), so a spooled row survives a kill.

use std::path::{Path, PathBuf};

use frugal_cost::{Event, ReplicaSpan};
use rusqlite::{Connection, OptionalExtension, params};

/// `PRAGMA application_id` of a spool: "FRSP".
const APPLICATION_ID: i64 = 0x4652_5350;
/// The spool's format; a newer one is refused.
const VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE rows (
    seq  INTEGER PRIMARY KEY AUTOINCREMENT,
    span INTEGER NOT NULL,
    id   BLOB,
    body TEXT NOT NULL
);";

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("cannot open the ledger spool {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{0} is not a frugal ledger spool; move it away or set `ledger.spool` to another file")]
    NotASpool(PathBuf),
    #[error(
        "ledger spool {path} has version {found}, newer than this frugal understands ({VERSION}); replay it with a newer frugal"
    )]
    Newer { path: PathBuf, found: i64 },
    #[error("cannot write the ledger spool {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot read the ledger spool {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("ledger spool {path} holds a row this frugal cannot read (seq {seq}): {what}")]
    Corrupt {
        path: PathBuf,
        seq: i64,
        what: String,
    },
}

/// The oldest rows of the spool, in order, and the last one's place.
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

pub struct Spool {
    path: PathBuf,
    /// `None` until a row needs the file (or one was found at start).
    conn: Option<Connection>,
    /// Rows in the file.
    rows: u64,
}

impl Spool {
    /// The spool at `path`: a file left by an earlier run is opened now (and refused with
    /// the reason if it is not a readable spool); otherwise the file is made when a row
    /// first needs it.
    pub fn open(path: &Path) -> Result<Spool, SpoolError> {
        let mut spool = Spool {
            path: path.to_owned(),
            conn: None,
            rows: 0,
        };
        if path.exists() {
            spool.connect()?;
        }
        Ok(spool)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Rows waiting to be replayed.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    fn connect(&mut self) -> Result<&mut Connection, SpoolError> {
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => {
                let (conn, rows) = prepare(&self.path)?;
                self.rows = rows;
                conn
            }
        };
        Ok(self.conn.insert(conn))
    }

    /// Appends rows in one transaction: all of them are spooled, or none.
    pub fn push(&mut self, events: &[Event], spans: &[ReplicaSpan]) -> Result<(), SpoolError> {
        let path = self.path.clone();
        let write = |source| SpoolError::Write {
            path: path.clone(),
            source,
        };
        let conn = self.connect()?;
        let tx = conn.transaction().map_err(write)?;
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
        self.rows += (events.len() + spans.len()) as u64;
        Ok(())
    }

    /// Up to `limit` of the oldest rows.
    pub fn oldest(&mut self, limit: usize) -> Result<Batch, SpoolError> {
        let path = self.path.clone();
        let read = |source| SpoolError::Read {
            path: path.clone(),
            source,
        };
        let mut batch = Batch::default();
        if self.rows == 0 {
            return Ok(batch);
        }
        let conn = self.connect()?;
        let mut stmt = conn
            .prepare_cached("SELECT seq, span, id, body FROM rows ORDER BY seq LIMIT ?1")
            .map_err(read)?;
        let mut rows = stmt
            .query(params![i64::try_from(limit).unwrap_or(i64::MAX)])
            .map_err(read)?;
        while let Some(r) = rows.next().map_err(read)? {
            let seq: i64 = r.get(0).map_err(read)?;
            let corrupt = |what: String| SpoolError::Corrupt {
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
        Ok(batch)
    }

    /// Drops the rows up to `last` (a batch the ledger has committed).
    pub fn remove_through(&mut self, last: i64) -> Result<(), SpoolError> {
        let path = self.path.clone();
        let write = |source| SpoolError::Write {
            path: path.clone(),
            source,
        };
        let conn = self.connect()?;
        conn.execute("DELETE FROM rows WHERE seq <= ?1", params![last])
            .map_err(write)?;
        self.rows = conn
            .query_row("SELECT count(*) FROM rows", [], |r| r.get::<_, i64>(0))
            .map_err(write)?
            .max(0) as u64;
        Ok(())
    }
}

/// Opens (creating) the file at `path` as a spool; returns it and the rows it holds.
fn prepare(path: &Path) -> Result<(Connection, u64), SpoolError> {
    let open = |source| SpoolError::Open {
        path: path.to_owned(),
        source,
    };
    let conn = Connection::open(path).map_err(open)?;
    let not_spool = |e: rusqlite::Error| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => SpoolError::NotASpool(path.to_owned()),
        _ => open(e),
    };
    let pragma = |name: &str| -> Result<i64, SpoolError> {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
            .map_err(not_spool)
    };
    let (app, version) = (pragma("application_id")?, pragma("user_version")?);
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(not_spool)?;
    if app != APPLICATION_ID && (tables > 0 || app != 0) {
        return Err(SpoolError::NotASpool(path.to_owned()));
    }
    if version > VERSION {
        return Err(SpoolError::Newer {
            path: path.to_owned(),
            found: version,
        });
    }
    let write = |source| SpoolError::Write {
        path: path.to_owned(),
        source,
    };
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;")
        .map_err(write)?;
    if version == 0 {
        conn.execute_batch(&format!(
            "BEGIN; {SCHEMA} PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {VERSION}; COMMIT;"
        ))
        .map_err(write)?;
    }
    let rows: Option<i64> = conn
        .query_row("SELECT count(*) FROM rows", [], |r| r.get(0))
        .optional()
        .map_err(|source| SpoolError::Read {
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
        let path = dir.path().join("spool.sqlite");
        let mut spool = Spool::open(&path).unwrap();
        assert!(!path.exists(), "no file until a row needs one");
        let first = [event(1, 7, 1), event(2, 8, 2)];
        spool.push(&first, &[span(3)]).unwrap();
        spool.push(&[event(3, 9, 4)], &[]).unwrap();
        drop(spool);
        let mut spool = Spool::open(&path).unwrap();
        assert_eq!(spool.rows(), 4);
        let batch = spool.oldest(3).unwrap();
        assert_eq!(batch.events, first, "ids, floats and money round-trip");
        assert_eq!(batch.spans, [span(3)]);
        spool.remove_through(batch.last).unwrap();
        assert_eq!(spool.rows(), 1);
        let rest = spool.oldest(10).unwrap();
        assert_eq!(rest.events, [event(3, 9, 4)]);
        spool.remove_through(rest.last).unwrap();
        assert_eq!((spool.rows(), spool.oldest(10).unwrap().len()), (0, 0));
    }

    #[test]
    fn a_full_spool_stores_nothing_of_the_push_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.sqlite");
        let mut spool = Spool::open(&path).unwrap();
        spool.push(&[event(1, 1, 1)], &[]).unwrap();
        // The file may not grow past its size now: as a full disk.
        let pages: i64 = spool
            .connect()
            .unwrap()
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap();
        spool
            .connect()
            .unwrap()
            .query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))
            .unwrap();
        let many: Vec<Event> = (0..2000).map(|i| event(i, 1, (i % 250) as u8)).collect();
        let err = spool.push(&many, &[]).unwrap_err();
        assert!(
            err.to_string().contains("cannot write the ledger spool"),
            "{err}"
        );
        assert_eq!(spool.rows(), 1);
        drop(spool);
        assert_eq!(Spool::open(&path).unwrap().rows(), 1, "nothing partial");
    }

    #[test]
    fn other_files_and_newer_spools_are_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "not a database, and longer than a header would be ........................................................................................").unwrap();
        let err = Spool::open(&text).err().unwrap().to_string();
        assert!(err.contains("is not a frugal ledger spool"), "{err}");
        let other = dir.path().join("other.sqlite");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE t (x INTEGER)")
            .unwrap();
        assert!(matches!(Spool::open(&other), Err(SpoolError::NotASpool(_))));
        let newer = dir.path().join("newer.sqlite");
        Spool::open(&newer)
            .unwrap()
            .push(&[event(1, 1, 1)], &[])
            .unwrap();
        Connection::open(&newer)
            .unwrap()
            .execute_batch("PRAGMA user_version = 2")
            .unwrap();
        let err = Spool::open(&newer).err().unwrap().to_string();
        assert!(err.contains("version 2, newer"), "{err}");
        assert!(std::fs::read(&text).unwrap().starts_with(b"not a database"));
    }
}
