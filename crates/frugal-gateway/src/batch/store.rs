//! A batch job's durable progress: each line's result written to the output exactly once,
//! through `kill -9`, preemption and restarts.
//!
//! A job's state directory holds a lock file and a SQLite database (the job, and one row per
//! line: pending, done or failed, with its attempts and last error). A result is recorded
//! in two steps: its line is appended to the output (or error) file and fsync'd, then the
//! database row is committed. A crash between the two leaves a line in the file that the
//! database calls pending, so the files are the truth: opening a job *reconciles* first,
//! cutting off a torn last line and setting each line's status from the custom_ids the
//! files hold. A line is therefore in the files at most once at any instant, and exactly once
//! when the job has finished.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use frugal_cost::durable::{LockError, OpenError, open_versioned};
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::input::Input;

/// OpenAI's only completion window.
pub const DEFAULT_COMPLETION_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);
/// Free space a job needs on each disk it writes to before it starts.
pub const MIN_FREE_BYTES: u64 = 16 * 1024 * 1024;

const SCHEMA_VERSION: i64 = 1;
const DB_FILE: &str = "batch.sqlite";
const LOCK_FILE: &str = "lock";
const SNAPSHOT_DB: &str = "batch.sqlite";
const SNAPSHOT_OUTPUT: &str = "output.jsonl";
const SNAPSHOT_ERRORS: &str = "errors.jsonl";

const SCHEMA: &str = r#"
CREATE TABLE job (
    id                  INTEGER PRIMARY KEY CHECK (id = 1),
    batch_id            TEXT NOT NULL,
    input_path          TEXT NOT NULL,
    input_sha256        TEXT NOT NULL,
    output_path         TEXT NOT NULL,
    errors_path         TEXT NOT NULL,
    created_at          INTEGER NOT NULL,
    completion_window_s INTEGER NOT NULL,
    status              TEXT NOT NULL
);
CREATE TABLE lines (
    custom_id  TEXT PRIMARY KEY,
    line       INTEGER NOT NULL UNIQUE,
    status     TEXT NOT NULL CHECK (status IN ('pending', 'done', 'failed')),
    attempts   INTEGER NOT NULL DEFAULT 0,
    last_error TEXT
);
"#;

/// Where a job keeps its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// The state directory (database and lock).
    pub state: PathBuf,
    pub output: PathBuf,
    pub errors: PathBuf,
}

impl Paths {
    /// `OUT.jsonl` with its errors in `OUT.errors.jsonl` and its state in
    /// `OUT.jsonl.frugal-batch/`.
    pub fn beside(output: &Path) -> Paths {
        let with = |suffix: &str| {
            let mut name = output.as_os_str().to_owned();
            name.push(suffix);
            PathBuf::from(name)
        };
        let errors = if output.extension().is_some_and(|e| e == "jsonl") {
            output.with_extension("errors.jsonl")
        } else {
            with(".errors")
        };
        Paths {
            state: with(".frugal-batch"),
            output: output.to_owned(),
            errors,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    /// A new job's window (a resumed job keeps its own).
    pub completion_window: Duration,
    /// A new job's id (`None`: a new random one); a resumed job keeps its own. The Batch
    /// API gives its batch's id, so the ledger's run of each line is the batch clients see.
    pub id: Option<String>,
    /// Refuse to start with less free space than this on a disk the job writes to.
    pub min_free_bytes: u64,
    /// The state was moved (restored from a store on another machine or directory): it
    /// takes the paths given now instead of refusing those that differ from its own.
    pub relocate: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            completion_window: DEFAULT_COMPLETION_WINDOW,
            id: None,
            min_free_bytes: MIN_FREE_BYTES,
            relocate: false,
        }
    }
}

/// The job a state directory holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// `batch_` and 24 random hex digits, as OpenAI's batch ids look; kept for the job's
    /// life, moves included, and recorded as the run of its lines in the ledger.
    pub id: String,
    pub input_path: PathBuf,
    pub input_sha256: String,
    pub output_path: PathBuf,
    pub errors_path: PathBuf,
    /// Unix seconds.
    pub created_at: u64,
    pub completion_window: Duration,
}

impl Job {
    /// When unfinished lines expire (Unix seconds).
    pub fn expires_at(&self) -> u64 {
        self.created_at + self.completion_window.as_secs()
    }
}

/// A batch's status, as OpenAI names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl JobStatus {
    const ALL: [JobStatus; 8] = [
        JobStatus::Validating,
        JobStatus::Failed,
        JobStatus::InProgress,
        JobStatus::Finalizing,
        JobStatus::Completed,
        JobStatus::Expired,
        JobStatus::Cancelling,
        JobStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Validating => "validating",
            JobStatus::Failed => "failed",
            JobStatus::InProgress => "in_progress",
            JobStatus::Finalizing => "finalizing",
            JobStatus::Completed => "completed",
            JobStatus::Expired => "expired",
            JobStatus::Cancelling => "cancelling",
            JobStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<JobStatus> {
        JobStatus::ALL.into_iter().find(|j| j.as_str() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineStatus {
    Pending,
    Done,
    Failed,
}

impl LineStatus {
    fn as_str(self) -> &'static str {
        match self {
            LineStatus::Pending => "pending",
            LineStatus::Done => "done",
            LineStatus::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<LineStatus> {
        [LineStatus::Pending, LineStatus::Done, LineStatus::Failed]
            .into_iter()
            .find(|l| l.as_str() == s)
    }
}

/// The endpoint's answer to a line, as the output file carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub status_code: u16,
    pub request_id: String,
    pub body: Value,
}

/// A failure that is not the endpoint's HTTP answer (`batch_expired`, a dropped
/// connection past its retries).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineError {
    pub code: String,
    pub message: String,
}

/// What goes to the error file. OpenAI writes an endpoint's refusal (a 4xx) as its
/// `response` with `error: null`, and only failures without an HTTP answer as `error`.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    Response(Response),
    Error(LineError),
}

/// One line of the output or error file.
#[derive(Serialize)]
struct OutputLine<'a> {
    id: String,
    custom_id: &'a str,
    response: Option<&'a Response>,
    error: Option<&'a LineError>,
}

/// What reconcile reads of a line.
#[derive(Deserialize)]
struct Recorded {
    custom_id: String,
}

/// OpenAI's `request_counts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RequestCounts {
    pub total: usize,
    pub completed: usize,
    pub failed: usize,
}

/// A line still to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub custom_id: String,
    /// Its line in the input file.
    pub number: usize,
    /// Retryable failures so far.
    pub attempts: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the output and the error file are the same file, {}", .0.display())]
    SamePath(PathBuf),
    #[error("cannot create the batch state directory {}", path.display())]
    StateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot lock the batch state {}", path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the batch job in {} is already running{}; a job runs in one process at a time",
        dir.display(),
        pid.map(|p| format!(" (process {p})")).unwrap_or_default()
    )]
    Locked { dir: PathBuf, pid: Option<u32> },
    #[error("the {what} {} is not writable", path.display())]
    Unwritable {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot check the free space of {}", path.display())]
    Space {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the disk holding {} is full: {free} bytes free, a batch needs at least {needed}",
        path.display()
    )]
    DiskFull {
        path: PathBuf,
        free: u64,
        needed: u64,
    },
    #[error(
        "the batch state {} belongs to another input (SHA-256 {recorded}, this input's is {given}); resume with that input or give another state directory",
        dir.display()
    )]
    DifferentInput {
        dir: PathBuf,
        recorded: String,
        given: String,
    },
    #[error(
        "the batch state {} writes its {what} to {}, not {}; give the same path to resume it",
        dir.display(),
        recorded.display(),
        given.display()
    )]
    DifferentPath {
        dir: PathBuf,
        what: &'static str,
        recorded: PathBuf,
        given: PathBuf,
    },
    #[error(
        "the {what} {} already holds results, but no batch state records them ({} is new); move it away, or give the state it was written with",
        path.display(),
        state.display()
    )]
    NotOurs {
        what: &'static str,
        path: PathBuf,
        state: PathBuf,
    },
    #[error("cannot read the {what} {}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} line {line}: {problem}; the job cannot resume over it", path.display())]
    Corrupt {
        path: PathBuf,
        line: usize,
        problem: String,
    },
    #[error("cannot use the batch state {}{}", path.display(), db_hint(source))]
    Db {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "the batch state {} has schema version {found}, newer than this frugal understands; upgrade frugal",
        path.display()
    )]
    NewerSchema { path: PathBuf, found: i64 },
    #[error("cannot write to the {what} {}{}; the line stays pending", path.display(), io_hint(source))]
    Write {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no line of this batch has the custom_id `{0}`")]
    UnknownLine(String),
    #[error("the line `{custom_id}` is already {status}; a line's result is written once")]
    AlreadyRecorded {
        custom_id: String,
        status: &'static str,
    },
    #[error(
        "the batch state takes no more results after an earlier failure ({0}); open the job again to repair it"
    )]
    Broken(String),
    #[error("cannot encode the result of `{custom_id}`")]
    Encode {
        custom_id: String,
        #[source]
        source: serde_json::Error,
    },
    /// The thread that wrote a result stopped (it panicked): the line stays pending.
    #[error("a batch result was not written: {0}")]
    Task(String),
}

impl StoreError {
    /// A write that may go through if tried again later (a full disk, a failed I/O): the
    /// line it was for stays pending meanwhile.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Write { .. } => true,
            StoreError::Db { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DiskFull | rusqlite::ErrorCode::SystemIoFailure)
            ),
            _ => false,
        }
    }
}

fn db_hint(e: &rusqlite::Error) -> &'static str {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DiskFull) => " (the disk is full)",
        Some(rusqlite::ErrorCode::ReadOnly) => " (it is read-only)",
        Some(rusqlite::ErrorCode::NotADatabase) => " (it is not a batch state database)",
        _ => "",
    }
}

fn io_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::StorageFull => " (the disk is full)",
        io::ErrorKind::QuotaExceeded => " (the disk quota is spent)",
        _ => "",
    }
}

/// A job's durable progress. Results may be recorded from many tasks at once: one writer
/// behind a mutex, because a line's append, fsync and commit must not interleave with
/// another's (two tasks could otherwise both find a line pending and both write it, and
/// a SQLite connection is not `Sync`). Each call blocks on an fsync: call it from
/// `spawn_blocking` in async code.
pub struct Store {
    job: Job,
    state: Mutex<State>,
    /// flock(2) on the lock file, held while this is open; the OS releases it when the
    /// process dies, `kill -9` included.
    _lock: File,
}

struct State {
    db: Connection,
    db_path: PathBuf,
    output: Sink,
    errors: Sink,
    lines: HashMap<String, Entry>,
    status: JobStatus,
    /// Why no more results can be taken (a file that could not be cut back after a
    /// failed write).
    broken: Option<String>,
}

struct Entry {
    number: usize,
    status: LineStatus,
    attempts: u32,
}

impl Store {
    /// Opens the job for `input` in `paths.state`, creating it or resuming it. Refused
    /// before anything runs: a job running in another process, a state for another input
    /// or other files, an output that is not writable, a full disk.
    pub fn open(
        paths: &Paths,
        input_path: &Path,
        input: &Input,
        options: &Options,
    ) -> Result<Store, StoreError> {
        let absolute = |p: &Path, what: &'static str| {
            std::path::absolute(p).map_err(|source| StoreError::Unwritable {
                what,
                path: p.to_owned(),
                source,
            })
        };
        let output = absolute(&paths.output, "output")?;
        let errors = absolute(&paths.errors, "error file")?;
        let dir = absolute(&paths.state, "batch state")?;
        if output == errors {
            return Err(StoreError::SamePath(output));
        }
        // The files first: an output in a folder that does not exist is refused, not
        // made by the state directory beside it. (What they hold is read under the lock.)
        let mut output_sink = Sink::open(&output, "output")?;
        let mut errors_sink = Sink::open(&errors, "error file")?;
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::StateDir {
            path: dir.clone(),
            source,
        })?;
        let lock = lock(&dir)?;
        for disk in [Some(dir.as_path()), output.parent(), errors.parent()]
            .into_iter()
            .flatten()
        {
            check_free(disk, options.min_free_bytes)?;
        }

        let db_path = dir.join(DB_FILE);
        let db_err = |source| StoreError::Db {
            path: db_path.clone(),
            source,
        };
        let mut db = open_db(&db_path)?;
        let (job, status) = match load_job(&db).map_err(db_err)? {
            Some((job, _)) if job.input_sha256 != input.sha256 => {
                return Err(StoreError::DifferentInput {
                    dir,
                    recorded: job.input_sha256,
                    given: input.sha256.clone(),
                });
            }
            Some((mut job, status)) if options.relocate => {
                relocate(&db, &mut job, input_path, &output, &errors).map_err(db_err)?;
                (job, status)
            }
            Some((job, _)) if job.output_path != output || job.errors_path != errors => {
                let (what, recorded, given) = if job.output_path != output {
                    ("output", job.output_path, output)
                } else {
                    ("error file", job.errors_path, errors)
                };
                return Err(StoreError::DifferentPath {
                    dir,
                    what,
                    recorded,
                    given,
                });
            }
            Some(found) => found,
            None => {
                for sink in [&output_sink, &errors_sink] {
                    if sink.file.metadata().is_ok_and(|m| m.len() > 0) {
                        return Err(StoreError::NotOurs {
                            what: sink.what,
                            path: sink.path.clone(),
                            state: dir,
                        });
                    }
                }
                let job = Job {
                    id: options
                        .id
                        .clone()
                        .unwrap_or_else(|| super::random_id("batch_")),
                    input_path: std::path::absolute(input_path)
                        .unwrap_or_else(|_| input_path.to_owned()),
                    input_sha256: input.sha256.clone(),
                    output_path: output,
                    errors_path: errors,
                    created_at: now(),
                    completion_window: options.completion_window,
                };
                create_job(&mut db, &job, input).map_err(db_err)?;
                (job, JobStatus::InProgress)
            }
        };
        let mut lines = load_lines(&db).map_err(db_err)?;
        let changed = reconcile(&mut output_sink, &mut errors_sink, &mut lines)?;
        save_statuses(&mut db, &lines, &changed).map_err(db_err)?;
        Ok(Store {
            job,
            state: Mutex::new(State {
                db,
                db_path,
                output: output_sink,
                errors: errors_sink,
                lines,
                status,
                broken: None,
            }),
            _lock: lock,
        })
    }

    pub fn job(&self) -> &Job {
        &self.job
    }

    pub fn status(&self) -> Result<JobStatus, StoreError> {
        Ok(self.state()?.status)
    }

    pub fn set_status(&self, status: JobStatus) -> Result<(), StoreError> {
        let mut state = self.state()?;
        state
            .db
            .execute(
                "UPDATE job SET status = ?1 WHERE id = 1",
                params![status.as_str()],
            )
            .map_err(|source| StoreError::Db {
                path: state.db_path.clone(),
                source,
            })?;
        state.status = status;
        Ok(())
    }

    /// The lines still to run, in input order.
    pub fn pending(&self) -> Result<Vec<Pending>, StoreError> {
        let state = self.state()?;
        let mut pending: Vec<Pending> = state
            .lines
            .iter()
            .filter(|(_, e)| e.status == LineStatus::Pending)
            .map(|(id, e)| Pending {
                custom_id: id.clone(),
                number: e.number,
                attempts: e.attempts,
            })
            .collect();
        pending.sort_unstable_by_key(|p| p.number);
        Ok(pending)
    }

    pub fn counts(&self) -> Result<RequestCounts, StoreError> {
        let state = self.state()?;
        let count = |s| state.lines.values().filter(|e| e.status == s).count();
        Ok(RequestCounts {
            total: state.lines.len(),
            completed: count(LineStatus::Done),
            failed: count(LineStatus::Failed),
        })
    }

    /// Writes the line's answer to the output, once.
    pub fn record_done(&self, custom_id: &str, response: &Response) -> Result<(), StoreError> {
        self.record(custom_id, LineStatus::Done, Some(response), None)
    }

    /// Writes the line's failure to the error file, once.
    pub fn record_failed(&self, custom_id: &str, failure: &Failure) -> Result<(), StoreError> {
        match failure {
            Failure::Response(r) => self.record(custom_id, LineStatus::Failed, Some(r), None),
            Failure::Error(e) => self.record(custom_id, LineStatus::Failed, None, Some(e)),
        }
    }

    /// Counts a retryable failure of a pending line; returns its attempts so far.
    pub fn record_attempt(&self, custom_id: &str, error: &str) -> Result<u32, StoreError> {
        let mut state = self.state()?;
        let state = &mut *state;
        let entry = pending_entry(&mut state.lines, custom_id)?;
        state
            .db
            .execute(
                "UPDATE lines SET attempts = attempts + 1, last_error = ?1 WHERE custom_id = ?2",
                params![error, custom_id],
            )
            .map_err(|source| StoreError::Db {
                path: state.db_path.clone(),
                source,
            })?;
        entry.attempts += 1;
        Ok(entry.attempts)
    }

    fn record(
        &self,
        custom_id: &str,
        status: LineStatus,
        response: Option<&Response>,
        error: Option<&LineError>,
    ) -> Result<(), StoreError> {
        let line = OutputLine {
            id: self.request_id(custom_id),
            custom_id,
            response,
            error,
        };
        let mut text = serde_json::to_vec(&line).map_err(|source| StoreError::Encode {
            custom_id: custom_id.to_owned(),
            source,
        })?;
        text.push(b'\n');
        let mut state = self.state()?;
        let state = &mut *state;
        let entry = pending_entry(&mut state.lines, custom_id)?;
        let sink = if status == LineStatus::Done {
            &mut state.output
        } else {
            &mut state.errors
        };
        if let Err(source) = sink.append(&text) {
            // A partial line would make the next one unreadable: cut it off, so the file
            // holds whole lines only and this one stays pending.
            if let Err(e) = sink.restore() {
                state.broken = Some(format!(
                    "{} could not be cut back after a failed write: {e}",
                    sink.path.display()
                ));
            }
            return Err(StoreError::Write {
                what: sink.what,
                path: sink.path.clone(),
                source,
            });
        }
        // The line is in the file, so it is recorded whatever the commit does: a row left
        // pending by a failed commit is set by the next open's reconcile.
        entry.status = status;
        let last_error = match (status, response, error) {
            (LineStatus::Done, ..) => None,
            (_, _, Some(e)) => Some(e.message.clone()),
            (_, Some(r), _) => Some(format!("HTTP {}", r.status_code)),
            _ => None,
        };
        state
            .db
            .execute(
                "UPDATE lines SET status = ?1, last_error = coalesce(?2, last_error) WHERE custom_id = ?3",
                params![status.as_str(), last_error, custom_id],
            )
            .map_err(|source| StoreError::Db {
                path: state.db_path.clone(),
                source,
            })?;
        Ok(())
    }

    /// Copies the job as it stands into `dir` (created): its database (`VACUUM INTO`, a
    /// consistent copy), output and error file, with no result written meanwhile. What
    /// [`restore_snapshot`] puts back on another machine.
    pub fn snapshot(&self, dir: &Path) -> Result<(), StoreError> {
        let state = self.state()?;
        let unwritable = |path: &Path| {
            let path = path.to_owned();
            move |source| StoreError::Unwritable {
                what: "snapshot",
                path,
                source,
            }
        };
        std::fs::create_dir_all(dir).map_err(unwritable(dir))?;
        let db = dir.join(SNAPSHOT_DB);
        if db.exists() {
            std::fs::remove_file(&db).map_err(unwritable(&db))?;
        }
        state
            .db
            .execute("VACUUM INTO ?1", params![path_text(&db)])
            .map_err(|source| StoreError::Db {
                path: db.clone(),
                source,
            })?;
        for (sink, name) in [
            (&state.output, SNAPSHOT_OUTPUT),
            (&state.errors, SNAPSHOT_ERRORS),
        ] {
            let to = dir.join(name);
            std::fs::copy(&sink.path, &to).map_err(unwritable(&to))?;
        }
        Ok(())
    }

    /// The output line's `id`: stable for a job and line, so a rerun's files compare equal.
    fn request_id(&self, custom_id: &str) -> String {
        let mut hash = Sha256::new();
        hash.update(self.job.input_sha256.as_bytes());
        hash.update([0]);
        hash.update(custom_id.as_bytes());
        let hex: String = hash.finalize()[..12]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("batch_req_{hex}")
    }

    fn state(&self) -> Result<MutexGuard<'_, State>, StoreError> {
        let state = self
            .state
            .lock()
            .map_err(|_| StoreError::Broken("a writer panicked".into()))?;
        match &state.broken {
            Some(why) => Err(StoreError::Broken(why.clone())),
            None => Ok(state),
        }
    }
}

fn pending_entry<'a>(
    lines: &'a mut HashMap<String, Entry>,
    custom_id: &str,
) -> Result<&'a mut Entry, StoreError> {
    let entry = lines
        .get_mut(custom_id)
        .ok_or_else(|| StoreError::UnknownLine(custom_id.to_owned()))?;
    if entry.status != LineStatus::Pending {
        return Err(StoreError::AlreadyRecorded {
            custom_id: custom_id.to_owned(),
            status: entry.status.as_str(),
        });
    }
    Ok(entry)
}

/// An append-only results file and its length of whole lines.
struct Sink {
    what: &'static str,
    path: PathBuf,
    file: File,
    len: u64,
    /// Test hook: the next write stops after this many bytes, as on a full disk.
    #[cfg(test)]
    fail_after: Option<usize>,
}

impl Sink {
    fn open(path: &Path, what: &'static str) -> Result<Sink, StoreError> {
        let unwritable = |source| StoreError::Unwritable {
            what,
            path: path.to_owned(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(unwritable)?;
        let len = file.metadata().map_err(unwritable)?.len();
        // A new file's name must survive a crash as its lines do.
        if let Some(dir) = path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(unwritable)?;
        }
        Ok(Sink {
            what,
            path: path.to_owned(),
            file,
            len,
            #[cfg(test)]
            fail_after: None,
        })
    }

    fn append(&mut self, line: &[u8]) -> io::Result<()> {
        self.write(line)?;
        self.file.sync_data()?;
        self.len += line.len() as u64;
        Ok(())
    }

    #[cfg(not(test))]
    fn write(&mut self, line: &[u8]) -> io::Result<()> {
        self.file.write_all(line)
    }

    #[cfg(test)]
    fn write(&mut self, line: &[u8]) -> io::Result<()> {
        match self.fail_after.take() {
            Some(n) => {
                self.file.write_all(&line[..n.min(line.len())])?;
                Err(io::ErrorKind::StorageFull.into())
            }
            None => self.file.write_all(line),
        }
    }

    /// Cuts the file back to its whole lines.
    fn restore(&mut self) -> io::Result<()> {
        self.file.set_len(self.len)?;
        self.file.sync_data()
    }

    /// The custom_ids the file holds, with their line numbers. A torn last line (no
    /// newline: the write of a result never acknowledged) or an unreadable one is cut
    /// off; an unreadable line before others is corruption, not a crash, and is refused.
    fn scan(&mut self) -> Result<Vec<(String, usize)>, StoreError> {
        let read_err = |source| StoreError::Read {
            what: self.what,
            path: self.path.clone(),
            source,
        };
        (&self.file).seek(SeekFrom::Start(0)).map_err(read_err)?;
        let mut reader = BufReader::new(&self.file);
        let mut found = Vec::new();
        let mut buf = Vec::new();
        let (mut offset, mut number) = (0u64, 0usize);
        let mut unreadable: Option<(u64, usize)> = None;
        loop {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf).map_err(read_err)?;
            if n == 0 {
                break;
            }
            number += 1;
            if let Some((_, line)) = unreadable {
                return Err(StoreError::Corrupt {
                    path: self.path.clone(),
                    line,
                    problem: "not a result line".into(),
                });
            }
            match serde_json::from_slice::<Recorded>(&buf) {
                Ok(r) if buf.ends_with(b"\n") => found.push((r.custom_id, number)),
                _ => unreadable = Some((offset, number)),
            }
            offset += n as u64;
        }
        self.len = offset;
        if let Some((at, line)) = unreadable {
            tracing::warn!(
                path = %self.path.display(),
                line,
                bytes = offset - at,
                "cutting off a torn last line left by an interrupted write"
            );
            self.len = at;
            self.restore().map_err(|source| StoreError::Write {
                what: self.what,
                path: self.path.clone(),
                source,
            })?;
        }
        Ok(found)
    }
}

/// Sets each line's status from the files: done if the output holds it, failed if the
/// error file does, pending otherwise. Returns the custom_ids whose status changed.
fn reconcile(
    output: &mut Sink,
    errors: &mut Sink,
    lines: &mut HashMap<String, Entry>,
) -> Result<Vec<String>, StoreError> {
    let mut recorded: HashMap<String, LineStatus> = HashMap::new();
    for (sink, status) in [(output, LineStatus::Done), (errors, LineStatus::Failed)] {
        for (custom_id, line) in sink.scan()? {
            let corrupt = |problem: String| StoreError::Corrupt {
                path: sink.path.clone(),
                line,
                problem,
            };
            if !lines.contains_key(&custom_id) {
                return Err(corrupt(format!(
                    "the custom_id `{custom_id}` is not in this batch's input"
                )));
            }
            if recorded.insert(custom_id.clone(), status).is_some() {
                return Err(corrupt(format!(
                    "the custom_id `{custom_id}` is already recorded"
                )));
            }
        }
    }
    let mut changed = Vec::new();
    for (custom_id, entry) in lines.iter_mut() {
        let status = recorded
            .get(custom_id)
            .copied()
            .unwrap_or(LineStatus::Pending);
        if entry.status != status {
            entry.status = status;
            changed.push(custom_id.clone());
        }
    }
    if !changed.is_empty() {
        tracing::info!(
            lines = changed.len(),
            "batch progress reconciled with its output files"
        );
    }
    Ok(changed)
}

/// Takes the lock of `dir` (a job's, or the Batch API's data directory), or names the
/// process that holds it.
pub(crate) fn lock(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(LOCK_FILE);
    frugal_cost::durable::lock_file(&path).map_err(|e| match e {
        LockError::Locked(pid) => StoreError::Locked {
            dir: dir.to_owned(),
            pid,
        },
        LockError::Io(source) => StoreError::Lock { path, source },
    })
}

fn check_free(dir: &Path, needed: u64) -> Result<(), StoreError> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(|e| StoreError::Space {
        path: dir.to_owned(),
        source: e.into(),
    })?;
    let free = st.blocks_available() as u128 * st.fragment_size() as u128;
    if free < u128::from(needed) {
        return Err(StoreError::DiskFull {
            path: dir.to_owned(),
            free: u64::try_from(free).unwrap_or(u64::MAX),
            needed,
        });
    }
    Ok(())
}

fn open_db(path: &Path) -> Result<Connection, StoreError> {
    open_versioned(path, SCHEMA, SCHEMA_VERSION).map_err(|e| match e {
        OpenError::Db(source) => StoreError::Db {
            path: path.to_owned(),
            source,
        },
        OpenError::Newer(found) => StoreError::NewerSchema {
            path: path.to_owned(),
            found,
        },
    })
}

fn path_text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn load_job(db: &Connection) -> rusqlite::Result<Option<(Job, JobStatus)>> {
    db.query_row(
        "SELECT input_path, input_sha256, output_path, errors_path, created_at,
                completion_window_s, status, batch_id FROM job WHERE id = 1",
        [],
        |r| {
            let status: String = r.get(6)?;
            let status = JobStatus::parse(&status).ok_or_else(|| {
                rusqlite::Error::FromSqlConversionFailure(
                    6,
                    rusqlite::types::Type::Text,
                    format!("unknown job status `{status}`").into(),
                )
            })?;
            let job = Job {
                id: r.get(7)?,
                input_path: PathBuf::from(r.get::<_, String>(0)?),
                input_sha256: r.get(1)?,
                output_path: PathBuf::from(r.get::<_, String>(2)?),
                errors_path: PathBuf::from(r.get::<_, String>(3)?),
                created_at: r.get::<_, i64>(4)? as u64,
                completion_window: Duration::from_secs(r.get::<_, i64>(5)? as u64),
            };
            Ok((job, status))
        },
    )
    .optional()
}

/// The job row and a pending row per line, in one transaction: a crash leaves no job or
/// the whole job.
fn create_job(db: &mut Connection, job: &Job, input: &Input) -> rusqlite::Result<()> {
    let tx = db.transaction()?;
    tx.execute(
        "INSERT INTO job (id, input_path, input_sha256, output_path, errors_path, created_at,
                          completion_window_s, status, batch_id)
         VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            path_text(&job.input_path),
            job.input_sha256,
            path_text(&job.output_path),
            path_text(&job.errors_path),
            job.created_at as i64,
            job.completion_window.as_secs() as i64,
            JobStatus::InProgress.as_str(),
            job.id,
        ],
    )?;
    {
        let mut insert =
            tx.prepare("INSERT INTO lines (custom_id, line, status) VALUES (?1, ?2, 'pending')")?;
        for line in &input.lines {
            insert.execute(params![line.custom_id, line.number as i64])?;
        }
    }
    tx.commit()
}

/// Puts a [`Store::snapshot`] in `from` in place at `paths`, for [`Store::open`] with
/// `relocate` to resume. Refused where the place already holds a job or results: a
/// snapshot never overwrites work.
pub fn restore_snapshot(from: &Path, paths: &Paths) -> Result<(), StoreError> {
    let db = paths.state.join(DB_FILE);
    for (path, what) in [
        (&db, "batch state"),
        (&paths.output, "output"),
        (&paths.errors, "error file"),
    ] {
        if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
            return Err(StoreError::NotOurs {
                what,
                path: path.clone(),
                state: paths.state.clone(),
            });
        }
    }
    std::fs::create_dir_all(&paths.state).map_err(|source| StoreError::StateDir {
        path: paths.state.clone(),
        source,
    })?;
    for (name, to, what) in [
        (SNAPSHOT_OUTPUT, &paths.output, "output"),
        (SNAPSHOT_ERRORS, &paths.errors, "error file"),
        (SNAPSHOT_DB, &db, "batch state"),
    ] {
        // The database last: until it is there, the place holds no job.
        std::fs::copy(from.join(name), to).map_err(|source| StoreError::Unwritable {
            what,
            path: to.clone(),
            source,
        })?;
    }
    Ok(())
}

/// A moved job's files are where it is opened now.
fn relocate(
    db: &Connection,
    job: &mut Job,
    input: &Path,
    output: &Path,
    errors: &Path,
) -> rusqlite::Result<()> {
    job.input_path = std::path::absolute(input).unwrap_or_else(|_| input.to_owned());
    job.output_path = output.to_owned();
    job.errors_path = errors.to_owned();
    db.execute(
        "UPDATE job SET input_path = ?1, output_path = ?2, errors_path = ?3 WHERE id = 1",
        params![
            path_text(&job.input_path),
            path_text(output),
            path_text(errors)
        ],
    )?;
    Ok(())
}

fn load_lines(db: &Connection) -> rusqlite::Result<HashMap<String, Entry>> {
    let mut select = db.prepare("SELECT custom_id, line, status, attempts FROM lines")?;
    let rows = select.query_map([], |r| {
        let status: String = r.get(2)?;
        let status = LineStatus::parse(&status).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                2,
                rusqlite::types::Type::Text,
                format!("unknown line status `{status}`").into(),
            )
        })?;
        Ok((
            r.get::<_, String>(0)?,
            Entry {
                number: r.get::<_, i64>(1)? as usize,
                status,
                attempts: r.get(3)?,
            },
        ))
    })?;
    rows.collect()
}

fn save_statuses(
    db: &mut Connection,
    lines: &HashMap<String, Entry>,
    changed: &[String],
) -> rusqlite::Result<()> {
    if changed.is_empty() {
        return Ok(());
    }
    let tx = db.transaction()?;
    {
        let mut update = tx.prepare("UPDATE lines SET status = ?1 WHERE custom_id = ?2")?;
        for custom_id in changed {
            if let Some(entry) = lines.get(custom_id) {
                update.execute(params![entry.status.as_str(), custom_id])?;
            }
        }
    }
    tx.commit()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
