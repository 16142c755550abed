//! What a durable job state needs on disk, for every store that keeps one (a batch job's,
//! a tuner's): a lock file that keeps a second process out, and a SQLite file with a
//! schema version that a newer frugal may have moved on from.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// Why a directory's lock was not taken.
#[derive(Debug)]
pub enum LockError {
    /// Another process (its id, where it wrote one) holds it.
    Locked(Option<u32>),
    Io(std::io::Error),
}

/// Takes flock(2) on `path` (created if missing) and writes this process's id into it for
/// the message a second process gets. The OS releases the lock when the holder dies,
/// `kill -9` included.
pub fn lock_file(path: &Path) -> Result<File, LockError> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(LockError::Io)?;
    // A child this process starts shares its open files from fork to exec, locks
    // included: a lock that this process's own id holds is waited for a moment.
    let patience = Instant::now() + Duration::from_secs(2);
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) => {
                let pid: Option<u32> = std::fs::read_to_string(path)
                    .ok()
                    .and_then(|p| p.trim().parse().ok());
                if pid == Some(std::process::id()) && Instant::now() < patience {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                return Err(LockError::Locked(pid));
            }
            Err(TryLockError::Error(e)) => return Err(LockError::Io(e)),
        }
    }
    file.set_len(0)
        .and_then(|()| file.write_all(std::process::id().to_string().as_bytes()))
        .map_err(LockError::Io)?;
    Ok(file)
}

/// Why a versioned database did not open.
#[derive(Debug)]
pub enum OpenError {
    Db(rusqlite::Error),
    /// Its schema version is newer than `version`.
    Newer(i64),
}

/// Opens the SQLite file at `path` in WAL mode with FULL sync (a committed row survives a
/// power cut, not only a crash), creating `schema` at `version` in a new file and refusing
/// a file of a newer version.
pub fn open_versioned(path: &Path, schema: &str, version: i64) -> Result<Connection, OpenError> {
    let db = Connection::open(path).map_err(OpenError::Db)?;
    db.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;")
        .map_err(OpenError::Db)?;
    let found: i64 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(OpenError::Db)?;
    if found > version {
        return Err(OpenError::Newer(found));
    }
    if found == 0 {
        db.execute_batch(&format!(
            "BEGIN; {schema} PRAGMA user_version = {version}; COMMIT;"
        ))
        .map_err(OpenError::Db)?;
    }
    Ok(db)
}
