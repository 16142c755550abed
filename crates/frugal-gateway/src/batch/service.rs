//! The Batch API's state in `frugal serve`: files and batches in a data directory, and a
//! task per unfinished batch that takes it validating -> in_progress -> finalizing ->
//! completed (or failed, expired, cancelling -> cancelled).
//!
//! The directory holds `batches.sqlite` (WAL: the file and batch objects), `files/` (the
//! uploads' bytes) and `jobs/<batch id>/` (each batch's job store, output and error file).
//! A batch's lines run through the gateway's own router ([`super::run`]) into a job store
//! ([`super::store`]) whose id is the batch's, so the ledger records each line under the
//! workload `batch` with the batch id as its run. A server that stops leaves its batches
//! as they were, never failed by the shutdown: the next start resumes them, and the store
//! runs only the lines not yet written.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use frugal_cost::causes::with_causes;
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::error::BatchError;
use super::files::{self, FileObject, FileRow, OUTPUT_PURPOSE, UPLOAD_PREFIX, Whose};
use super::input::{self, Endpoint, Input, InputError, Limits};
use super::now_s;
use super::run::{self, Ended, Progress, RunConfig};
use super::store::{self, JobStatus, Options, Paths, RequestCounts, Store, StoreError};
use crate::admit::keys::{Keys, Tenant};

/// The only completion window OpenAI takes.
pub const COMPLETION_WINDOW: &str = "24h";

/// Unfinished batches at once, by default: each holds its input's lines in memory.
pub const DEFAULT_MAX_ACTIVE: usize = 16;
/// Bytes a tenant may keep in files, by default (10 GiB).
pub const DEFAULT_UPLOAD_QUOTA: u64 = 10 << 30;
/// Validations a batch may start without finishing: one that took the process down this
/// often would take it down at every start.
const MAX_VALIDATIONS: i64 = 2;

const SCHEMA_VERSION: i64 = 2;
/// Version 1 lacked `validations`.
const MIGRATE_1: &str = "ALTER TABLE batches ADD COLUMN validations INTEGER NOT NULL DEFAULT 0;";
const SCHEMA: &str = r#"
CREATE TABLE files (
    id         TEXT PRIMARY KEY,
    tenant     TEXT,
    filename   TEXT NOT NULL,
    purpose    TEXT NOT NULL,
    bytes      INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    path       TEXT NOT NULL
);
CREATE TABLE batches (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT NOT NULL UNIQUE,
    tenant            TEXT,
    endpoint          TEXT NOT NULL,
    input_file_id     TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status            TEXT NOT NULL,
    errors            TEXT,
    output_file_id    TEXT,
    error_file_id     TEXT,
    created_at        INTEGER NOT NULL,
    in_progress_at    INTEGER,
    expires_at        INTEGER NOT NULL,
    finalizing_at     INTEGER,
    completed_at      INTEGER,
    failed_at         INTEGER,
    expired_at        INTEGER,
    cancelling_at     INTEGER,
    cancelled_at      INTEGER,
    total             INTEGER NOT NULL DEFAULT 0,
    completed         INTEGER NOT NULL DEFAULT 0,
    failed            INTEGER NOT NULL DEFAULT 0,
    metadata          TEXT,
    validations       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX batches_status ON batches (status);
"#;

const UNFINISHED: &str = "('validating', 'in_progress', 'finalizing', 'cancelling')";

/// The gateway that hosts the Batch API: a batch's lines go through its router, and spend
/// the budget of the tenant (among its keys) that created the batch.
pub trait Host: Clone + Send + Sync + 'static {
    fn router(&self) -> axum::Router;
    fn keys(&self) -> &Keys;
}

/// Where the Batch API keeps its state, and how its batches run.
#[derive(Debug, Clone)]
pub struct BatchConfig {
    pub dir: PathBuf,
    /// How long the "24h" window lasts (tests shorten it).
    pub completion_window: Duration,
    /// The largest upload, and so the largest batch input.
    pub max_file_bytes: u64,
    /// How lines run; each batch sets `tenant` to its own.
    pub run: RunConfig,
    /// How long a shutdown waits for lines in flight; lines still running then are sent
    /// again after the next start.
    pub drain: Duration,
    /// Unfinished batches at most; past it, creating one is refused (429).
    pub max_active: usize,
    /// Bytes of files a tenant (or, with no keys, everyone) may keep; past it, an upload
    /// is refused (429).
    pub upload_quota: u64,
}

impl BatchConfig {
    pub fn new(dir: PathBuf) -> BatchConfig {
        BatchConfig {
            dir,
            completion_window: store::DEFAULT_COMPLETION_WINDOW,
            max_file_bytes: input::MAX_BYTES,
            run: RunConfig::default(),
            drain: Duration::from_secs(30),
            max_active: DEFAULT_MAX_ACTIVE,
            upload_quota: DEFAULT_UPLOAD_QUOTA,
        }
    }
}

/// A batch as OpenAI's API returns it.
#[derive(Debug, Clone, Serialize)]
pub struct BatchObject {
    pub id: String,
    pub object: &'static str,
    pub endpoint: String,
    /// Why validation failed: OpenAI's `{"object": "list", "data": [..]}`.
    pub errors: Option<Value>,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: JobStatus,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub created_at: i64,
    pub in_progress_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub finalizing_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub failed_at: Option<i64>,
    pub expired_at: Option<i64>,
    pub cancelling_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    pub request_counts: RequestCounts,
    pub metadata: Option<Value>,
}

/// A batch to create, its request checked.
#[derive(Debug, Clone)]
pub struct NewBatch {
    pub input_file_id: String,
    pub endpoint: Endpoint,
    pub metadata: Option<Value>,
    /// Whose it is (`None`: an open API).
    pub tenant: Option<String>,
}

/// What a cancel found.
#[derive(Debug)]
pub enum Cancel {
    NotFound,
    /// Already past cancelling (finalizing or final).
    Finished(JobStatus),
    Cancelling(Box<BatchObject>),
}

/// The Batch API's files and batches; the tasks that drive its batches.
pub struct Batches {
    config: BatchConfig,
    db: Mutex<Connection>,
    running: Mutex<HashMap<String, Running>>,
    tasks: Mutex<JoinSet<()>>,
    shutdown: watch::Sender<bool>,
    /// One server drives a directory's batches (flock, released when the process dies).
    _lock: File,
}

/// A batch whose task is alive.
struct Running {
    cancel: watch::Sender<bool>,
    /// Its job, once open: the live request counts.
    store: Option<Arc<Store>>,
}

/// How a batch's task ended its work.
enum Outcome {
    /// Every line is written, or the batch was cancelled.
    Done,
    /// Nothing ran (validation), or the job could not go on; OpenAI's `errors`.
    Failed(Value),
}

impl Batches {
    /// Opens (or creates) the data directory; refused while another process holds it.
    pub fn open(config: BatchConfig) -> Result<Batches, BatchError> {
        let dir = config.dir.clone();
        for sub in ["files", "jobs"] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|source| BatchError::Dir { path, source })?;
        }
        let lock = store::lock(&dir).map_err(|e| match e {
            StoreError::Locked { dir, pid } => BatchError::Busy { dir, pid },
            e => BatchError::Store(e),
        })?;
        sweep_uploads(&dir.join("files"));
        let db = open_db(&dir.join("batches.sqlite"))?;
        let (shutdown, _) = watch::channel(false);
        Ok(Batches {
            config,
            db: Mutex::new(db),
            running: Mutex::new(HashMap::new()),
            tasks: Mutex::new(JoinSet::new()),
            shutdown,
            _lock: lock,
        })
    }

    pub fn config(&self) -> &BatchConfig {
        &self.config
    }

    /// Starts a task for each batch a stopped server left unfinished; returns how many.
    pub fn resume(self: &Arc<Self>, app: &impl Host) -> Result<usize, BatchError> {
        let ids: Vec<String> = {
            let db = self.db();
            let mut select = db.prepare(&format!(
                "SELECT id FROM batches WHERE status IN {UNFINISHED} ORDER BY seq"
            ))?;
            select
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?
        };
        for id in &ids {
            self.spawn(app, id.clone());
        }
        Ok(ids.len())
    }

    /// Stops taking lines, lets lines in flight finish for up to the drain, and leaves
    /// every batch resumable.
    pub async fn stop(&self) {
        self.shutdown.send_replace(true);
        let mut tasks = std::mem::take(&mut *lock(&self.tasks));
        let drained = tokio::time::timeout(self.config.drain, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                "batch lines still in flight after the drain were cut off; they run again at the next start"
            );
        }
    }

    /// Records a new batch (validating) and starts its task; refused while
    /// [`BatchConfig::max_active`] batches are unfinished.
    pub async fn create(
        self: &Arc<Self>,
        app: &impl Host,
        new: NewBatch,
    ) -> Result<BatchObject, BatchError> {
        let id = super::random_id("batch_");
        let created = now_s();
        let expires = created + self.config.completion_window.as_secs() as i64;
        let row_id = id.clone();
        let max = self.config.max_active;
        let object = self
            .blocking(move |b| {
                let db = b.db();
                // Counted and inserted under one lock: two creates cannot both take the
                // last place.
                let active: i64 = db.query_row(
                    &format!("SELECT count(*) FROM batches WHERE status IN {UNFINISHED}"),
                    [],
                    |r| r.get(0),
                )?;
                if usize::try_from(active).unwrap_or(usize::MAX) >= max {
                    return Err(BatchError::TooManyBatches { max });
                }
                db.execute(
                    "INSERT INTO batches (id, tenant, endpoint, input_file_id, completion_window,
                                          status, created_at, expires_at, metadata)
                     VALUES (?1, ?2, ?3, ?4, ?5, 'validating', ?6, ?7, ?8)",
                    params![
                        row_id,
                        new.tenant,
                        new.endpoint.url(),
                        new.input_file_id,
                        COMPLETION_WINDOW,
                        created,
                        expires,
                        new.metadata.map(|m| m.to_string()),
                    ],
                )?;
                drop(db);
                b.object(&row_id, Whose::Any)
            })
            .await?
            .ok_or_else(|| BatchError::Task("a new batch was not recorded".into()))?;
        self.spawn(app, id);
        Ok(object)
    }

    /// The batch `id`, if it is `tenant`'s (with no tenant, if it was made with no key).
    pub async fn batch(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<String>,
    ) -> Result<Option<BatchObject>, BatchError> {
        let id = id.to_owned();
        self.blocking(move |b| b.object(&id, Whose::Caller(tenant.as_deref())))
            .await
    }

    /// Newest first: up to `limit` batches after the batch `after`, and whether more follow.
    pub async fn batches(
        self: &Arc<Self>,
        tenant: Option<String>,
        after: Option<String>,
        limit: usize,
    ) -> Result<(Vec<BatchObject>, bool), BatchError> {
        self.blocking(move |b| {
            let mut rows = {
                let db = b.db();
                let mut select = db.prepare(
                    "SELECT * FROM batches
                     WHERE tenant IS ?1
                       AND (?2 IS NULL OR seq < (SELECT seq FROM batches WHERE id = ?2))
                     ORDER BY seq DESC LIMIT ?3",
                )?;
                select
                    .query_map(params![tenant, after, limit as i64 + 1], read_batch)?
                    .collect::<rusqlite::Result<Vec<_>>>()?
            };
            let more = rows.len() > limit;
            rows.truncate(limit);
            Ok((rows.into_iter().map(|r| b.live(r)).collect(), more))
        })
        .await
    }

    /// Cancels a batch that is validating or in progress: its task stops taking lines, and
    /// once the lines in flight are written it is cancelled, its output what was done.
    pub async fn cancel(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<String>,
    ) -> Result<Cancel, BatchError> {
        let id = id.to_owned();
        self.blocking(move |b| {
            let status = b
                .db()
                .query_row(
                    "SELECT status FROM batches WHERE id = ?1 AND tenant IS ?2",
                    params![id, tenant],
                    |r| r.get::<_, String>(0),
                )
                .optional()?;
            let Some(status) = status.as_deref().map(status_of).transpose()? else {
                return Ok(Cancel::NotFound);
            };
            match status {
                JobStatus::Validating | JobStatus::InProgress => {
                    transition(
                        &b.db(),
                        &id,
                        &[JobStatus::Validating, JobStatus::InProgress],
                        JobStatus::Cancelling,
                    )?;
                }
                JobStatus::Cancelling => {}
                done => return Ok(Cancel::Finished(done)),
            }
            if let Some(r) = lock(&b.running).get(&id) {
                r.cancel.send_replace(true);
            }
            Ok(match b.object(&id, Whose::Any)? {
                Some(o) if o.status == JobStatus::Cancelling => Cancel::Cancelling(Box::new(o)),
                Some(o) => Cancel::Finished(o.status),
                None => Cancel::NotFound,
            })
        })
        .await
    }

    /// Starts the task that drives batch `id` to a final status.
    fn spawn(self: &Arc<Self>, app: &impl Host, id: String) {
        let (cancel, cancelled) = watch::channel(false);
        lock(&self.running).insert(
            id.clone(),
            Running {
                cancel,
                store: None,
            },
        );
        let (this, app) = (self.clone(), app.clone());
        let mut tasks = lock(&self.tasks);
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            let _untrack = Untrack {
                batches: &this,
                id: &id,
            };
            if let Err(e) = this.drive(&app, &id, cancelled).await {
                tracing::error!(
                    batch = %id,
                    "the batch stopped; it goes on at the next start: {}",
                    with_causes(&e)
                );
            }
        });
    }

    /// Validates the batch's input, runs its lines and finalizes it, from whatever status
    /// it was left in. Returns early, leaving it resumable, when the server stops.
    async fn drive(
        self: &Arc<Self>,
        app: &impl Host,
        id: &str,
        cancel: watch::Receiver<bool>,
    ) -> Result<(), BatchError> {
        let shutdown = self.shutdown.subscribe();
        let row_id = id.to_owned();
        let Some(batch) = self
            .blocking(move |b| b.object(&row_id, Whose::Any))
            .await?
        else {
            return Ok(());
        };
        let validating = batch.status == JobStatus::Validating;
        if validating {
            let row_id = id.to_owned();
            let tries = self
                .blocking(move |b| b.validation_started(&row_id))
                .await?;
            if tries > MAX_VALIDATIONS {
                let message = format!(
                    "Validating the input file stopped the server {MAX_VALIDATIONS} times; it is not tried again."
                );
                let errors = error_list("validation_crashed", &message);
                return self.end(id, Outcome::Failed(errors), None).await;
            }
        }
        let (input_path, input) = match self.input(&batch).await? {
            Ok(found) => found,
            Err(errors) => return self.end(id, Outcome::Failed(errors), None).await,
        };
        if *shutdown.borrow() {
            if validating {
                // It finished: a stop, not a crash.
                let row_id = id.to_owned();
                self.blocking(move |b| {
                    b.db()
                        .execute("UPDATE batches SET validations = 0 WHERE id = ?1", [row_id])?;
                    Ok(())
                })
                .await?;
            }
            return Ok(());
        }
        let store = match self.open_store(&batch, &input_path, &input).await? {
            Ok(s) => s,
            Err(e) => {
                let errors = error_list("batch_store", &with_causes(&e));
                return self.end(id, Outcome::Failed(errors), None).await;
            }
        };
        // After the store: a batch that cannot go on keeps what it had done.
        let tenant = match self.tenant_of(app, id).await? {
            Ok(t) => t,
            Err(errors) => return self.end(id, Outcome::Failed(errors), Some(&store)).await,
        };
        if let Some(r) = lock(&self.running).get_mut(id) {
            r.store = Some(store.clone());
        }
        let (row_id, total) = (id.to_owned(), input.lines.len());
        let status = self.blocking(move |b| b.start(&row_id, total)).await?;
        if status == JobStatus::InProgress {
            let config = RunConfig {
                tenant,
                ..self.config.run.clone()
            };
            let stop = stopped(cancel, shutdown.clone());
            let router = app.router();
            let progress = Arc::new(Progress::default());
            match run::run(router, store.clone(), &input, &config, progress, stop).await {
                Ok(Ended::Stopped) if *shutdown.borrow() => return Ok(()),
                Ok(_) => {}
                Err(e) => {
                    let errors = error_list("batch_store", &with_causes(&e));
                    return self.end(id, Outcome::Failed(errors), Some(&store)).await;
                }
            }
        }
        self.end(id, Outcome::Done, Some(&store)).await
    }

    /// The batch's input file, read and validated whole (again on a resume: the job needs
    /// its lines); OpenAI's `errors` when it cannot run.
    async fn input(
        self: &Arc<Self>,
        batch: &BatchObject,
    ) -> Result<Result<(PathBuf, Arc<Input>), Value>, BatchError> {
        let file_id = batch.input_file_id.clone();
        let path = self
            .blocking(move |b| {
                let row = files::file_row(&b.db(), &file_id, Whose::Any)?;
                Ok(row.map(|r| b.dir().join(r.path)))
            })
            .await?;
        let Some(path) = path else {
            let message = format!("The input file {} was deleted.", batch.input_file_id);
            return Ok(Err(error_list("file_not_found", &message)));
        };
        let limits = Limits {
            max_bytes: self.config.max_file_bytes,
            endpoint: Endpoint::from_url(&batch.endpoint),
            ..Limits::default()
        };
        let read_path = path.clone();
        let read = tokio::task::spawn_blocking(move || input::read(&read_path, &limits))
            .await
            .map_err(|e| BatchError::Task(e.to_string()))?;
        Ok(match read {
            Ok(input) => Ok((path, Arc::new(input))),
            Err(InputError::Invalid { errors, .. }) => {
                Err(serde_json::to_value(&errors).unwrap_or(Value::Null))
            }
            Err(e @ InputError::Read { .. }) => Err(error_list("file_not_found", &e.to_string())),
        })
    }

    /// Whose budget the batch's lines spend: the tenant that created it. A batch whose
    /// tenant has no key any more does not run (it would spend no one's budget).
    async fn tenant_of(
        self: &Arc<Self>,
        app: &impl Host,
        id: &str,
    ) -> Result<Result<Option<Arc<Tenant>>, Value>, BatchError> {
        let row_id = id.to_owned();
        let name: Option<String> = self
            .blocking(move |b| {
                Ok(b.db().query_row(
                    "SELECT tenant FROM batches WHERE id = ?1",
                    params![row_id],
                    |r| r.get(0),
                )?)
            })
            .await?;
        let keys = app.keys();
        Ok(match name {
            Some(name) if !keys.is_open() => keys.tenant(&name).map(Some).ok_or_else(|| {
                let message = format!(
                    "No API key of the tenant `{name}` that created this batch is configured any more."
                );
                error_list("invalid_api_key", &message)
            }),
            _ => Ok(None),
        })
    }

    /// The batch's job store, opened (created at the first run) with the batch's id and
    /// what is left of its window, so that both expire at the batch's `expires_at`.
    async fn open_store(
        self: &Arc<Self>,
        batch: &BatchObject,
        input_path: &Path,
        input: &Arc<Input>,
    ) -> Result<Result<Arc<Store>, StoreError>, BatchError> {
        let dir = self.job_dir(&batch.id);
        std::fs::create_dir_all(&dir).map_err(|source| BatchError::Dir {
            path: dir.clone(),
            source,
        })?;
        let paths = job_paths(&dir);
        let left = batch.expires_at.unwrap_or(0) - now_s();
        let options = Options {
            id: Some(batch.id.clone()),
            completion_window: Duration::from_secs(left.max(0) as u64),
            ..Options::default()
        };
        let (input_path, input) = (input_path.to_owned(), input.clone());
        tokio::task::spawn_blocking(move || {
            Store::open(&paths, &input_path, &input, &options).map(Arc::new)
        })
        .await
        .map_err(|e| BatchError::Task(e.to_string()))
    }

    /// Counts a validation of the batch as started, durably before it runs; returns how
    /// many have started.
    fn validation_started(&self, id: &str) -> Result<i64, BatchError> {
        let db = self.db();
        db.execute(
            "UPDATE batches SET validations = validations + 1 WHERE id = ?1",
            [id],
        )?;
        Ok(
            db.query_row("SELECT validations FROM batches WHERE id = ?1", [id], |r| {
                r.get(0)
            })?,
        )
    }

    /// Moves a validated batch to in_progress with its line count; returns its status then.
    fn start(&self, id: &str, total: usize) -> Result<JobStatus, BatchError> {
        let db = self.db();
        db.execute(
            "UPDATE batches SET status = 'in_progress', in_progress_at = ?1, total = ?2
             WHERE id = ?3 AND status = 'validating'",
            params![now_s(), total as i64, id],
        )?;
        let status: String =
            db.query_row("SELECT status FROM batches WHERE id = ?1", [id], |r| {
                r.get(0)
            })?;
        status_of(&status)
    }

    /// Takes the batch to its final status: a done batch through finalizing to completed
    /// (expired when lines ran out of its window), a cancelling one to cancelled, a failed
    /// one to failed; its output and error files (each only when it holds lines, as
    /// OpenAI's) become files.
    async fn end(
        self: &Arc<Self>,
        id: &str,
        outcome: Outcome,
        store: Option<&Arc<Store>>,
    ) -> Result<(), BatchError> {
        let row_id = id.to_owned();
        if matches!(outcome, Outcome::Done) {
            self.blocking(move |b| {
                transition(
                    &b.db(),
                    &row_id,
                    &[JobStatus::InProgress],
                    JobStatus::Finalizing,
                )?;
                Ok(())
            })
            .await?;
        }
        let counts = match store {
            Some(s) => s.counts().map_err(BatchError::Store)?,
            None => RequestCounts {
                total: 0,
                completed: 0,
                failed: 0,
            },
        };
        let paths = job_paths(&self.job_dir(id));
        let expired = store.is_some() && counts.failed > 0 && {
            let errors = paths.errors.clone();
            tokio::task::spawn_blocking(move || any_expired(&errors))
                .await
                .map_err(|e| BatchError::Task(e.to_string()))?
                .map_err(|source| BatchError::Io {
                    what: "read the error file",
                    path: paths.errors.clone(),
                    source,
                })?
        };
        let row_id = id.to_owned();
        let ended = self
            .blocking(move |b| b.finish(&row_id, outcome, expired, counts, &paths))
            .await?;
        if let (Some(status), Some(store)) = (ended, store)
            && let Err(e) = store.set_status(status)
        {
            tracing::warn!(batch = %id, "cannot record the job's final status: {e}");
        }
        if let Some(status) = ended {
            tracing::info!(batch = %id, status = status.as_str(), ?counts, "batch ended");
        }
        Ok(())
    }

    /// The final status, the counts and the result files, in one transaction; `None` when
    /// the batch was already final.
    fn finish(
        &self,
        id: &str,
        outcome: Outcome,
        expired: bool,
        counts: RequestCounts,
        paths: &Paths,
    ) -> Result<Option<JobStatus>, BatchError> {
        let mut db = self.db();
        let tx = db.transaction()?;
        let status: String =
            tx.query_row("SELECT status FROM batches WHERE id = ?1", [id], |r| {
                r.get(0)
            })?;
        let (to, errors) = match (status_of(&status)?, outcome) {
            (JobStatus::Cancelling, _) => (JobStatus::Cancelled, None),
            (JobStatus::Finalizing, Outcome::Done) if expired => (JobStatus::Expired, None),
            (JobStatus::Finalizing, Outcome::Done) => (JobStatus::Completed, None),
            (
                JobStatus::Validating | JobStatus::InProgress | JobStatus::Finalizing,
                Outcome::Failed(errors),
            ) => (JobStatus::Failed, Some(errors.to_string())),
            _ => return Ok(None),
        };
        let tenant: Option<String> =
            tx.query_row("SELECT tenant FROM batches WHERE id = ?1", [id], |r| {
                r.get(0)
            })?;
        let file = |n: usize, path: &Path, kind: &str| -> Result<Option<String>, BatchError> {
            if n == 0 {
                return Ok(None);
            }
            let bytes = std::fs::metadata(path)
                .map_err(|source| BatchError::Io {
                    what: "read the size of",
                    path: path.to_owned(),
                    source,
                })?
                .len();
            let row = FileRow {
                object: FileObject {
                    id: super::random_id("file-"),
                    object: "file",
                    bytes,
                    created_at: now_s(),
                    filename: format!("{id}_{kind}.jsonl"),
                    purpose: OUTPUT_PURPOSE.to_owned(),
                    status: "processed",
                    expires_at: None,
                    status_details: None,
                },
                path: files::path_text(path.strip_prefix(self.dir()).unwrap_or(path)),
            };
            files::insert_file(&tx, &row, tenant.as_deref())?;
            Ok(Some(row.object.id))
        };
        let output = file(counts.completed, &paths.output, "output")?;
        let error_file = file(counts.failed, &paths.errors, "error")?;
        let (column, now) = (at_column(to), now_s());
        tx.execute(
            &format!(
                "UPDATE batches SET status = ?1, {column} = ?2, total = ?3, completed = ?4,
                        failed = ?5, output_file_id = ?6, error_file_id = ?7,
                        errors = coalesce(?8, errors)
                 WHERE id = ?9"
            ),
            params![
                to.as_str(),
                now,
                counts.total as i64,
                counts.completed as i64,
                counts.failed as i64,
                output,
                error_file,
                errors,
                id
            ],
        )?;
        tx.commit()?;
        Ok(Some(to))
    }

    /// The batch `id`, if `whose` sees it, with live counts while it runs.
    fn object(&self, id: &str, whose: Whose<'_>) -> Result<Option<BatchObject>, BatchError> {
        let (any, tenant) = whose.params();
        let row = self
            .db()
            .query_row(
                "SELECT * FROM batches WHERE id = ?1 AND (?2 OR tenant IS ?3)",
                params![id, any, tenant],
                read_batch,
            )
            .optional()?;
        Ok(row.map(|r| self.live(r)))
    }

    /// A running batch's counts are its store's; the row has them once it is final.
    fn live(&self, mut batch: BatchObject) -> BatchObject {
        let store = lock(&self.running)
            .get(&batch.id)
            .and_then(|r| r.store.clone());
        if let Some(counts) = store.and_then(|s| s.counts().ok()) {
            batch.request_counts = counts;
        }
        batch
    }

    pub(super) fn dir(&self) -> &Path {
        &self.config.dir
    }

    fn job_dir(&self, id: &str) -> PathBuf {
        self.dir().join("jobs").join(id)
    }

    pub(super) fn files_dir(&self) -> PathBuf {
        self.dir().join("files")
    }

    pub(super) fn db(&self) -> MutexGuard<'_, Connection> {
        lock(&self.db)
    }

    /// Runs `f` off the async threads: the database's commits fsync.
    pub(super) async fn blocking<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Batches) -> Result<T, BatchError> + Send + 'static,
    ) -> Result<T, BatchError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(&this))
            .await
            .map_err(|e| BatchError::Task(e.to_string()))?
    }
}

/// Forgets a batch's task when it ends, however it ends.
struct Untrack<'a> {
    batches: &'a Batches,
    id: &'a str,
}

impl Drop for Untrack<'_> {
    fn drop(&mut self) {
        lock(&self.batches.running).remove(self.id);
    }
}

/// Resolves when the batch is cancelled or the server stops.
async fn stopped(mut cancel: watch::Receiver<bool>, mut shutdown: watch::Receiver<bool>) {
    tokio::select! {
        _ = cancel.wait_for(|c| *c) => {}
        _ = shutdown.wait_for(|s| *s) => {}
    }
}

fn job_paths(dir: &Path) -> Paths {
    Paths {
        state: dir.join("state"),
        output: dir.join("output.jsonl"),
        errors: dir.join("errors.jsonl"),
    }
}

/// Whether a line of the error file ran out of the batch's window.
fn any_expired(errors: &Path) -> io::Result<bool> {
    let file = match File::open(errors) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    for line in BufReader::new(file).lines() {
        let line: Value = serde_json::from_str(&line?).unwrap_or(Value::Null);
        if line["error"]["code"] == "batch_expired" {
            return Ok(true);
        }
    }
    Ok(false)
}

/// OpenAI's `errors` with one problem that is not a line's.
fn error_list(code: &str, message: &str) -> Value {
    json!({ "object": "list", "data": [{ "code": code, "message": message, "param": null, "line": null }] })
}

/// Moves the batch from one of `from` to `to`, stamping `to`'s time; false when it was in
/// none of them.
fn transition(
    db: &Connection,
    id: &str,
    from: &[JobStatus],
    to: JobStatus,
) -> rusqlite::Result<bool> {
    let from: Vec<String> = from.iter().map(|s| format!("'{}'", s.as_str())).collect();
    let changed = db.execute(
        &format!(
            "UPDATE batches SET status = ?1, {} = ?2 WHERE id = ?3 AND status IN ({})",
            at_column(to),
            from.join(", ")
        ),
        params![to.as_str(), now_s(), id],
    )?;
    Ok(changed == 1)
}

/// The column that stamps when a batch reached `status`.
fn at_column(status: JobStatus) -> &'static str {
    match status {
        JobStatus::Validating => "created_at",
        JobStatus::InProgress => "in_progress_at",
        JobStatus::Finalizing => "finalizing_at",
        JobStatus::Completed => "completed_at",
        JobStatus::Failed => "failed_at",
        JobStatus::Expired => "expired_at",
        JobStatus::Cancelling => "cancelling_at",
        JobStatus::Cancelled => "cancelled_at",
    }
}

fn status_of(s: &str) -> Result<JobStatus, BatchError> {
    JobStatus::parse(s).ok_or_else(|| {
        BatchError::Db(rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            format!("unknown batch status `{s}`").into(),
        ))
    })
}

fn read_batch(r: &rusqlite::Row<'_>) -> rusqlite::Result<BatchObject> {
    let status: String = r.get("status")?;
    let status = JobStatus::parse(&status).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            format!("unknown batch status `{status}`").into(),
        )
    })?;
    let json = |text: Option<String>| text.and_then(|t| serde_json::from_str(&t).ok());
    let count = |name: &str| r.get::<_, i64>(name).map(|n| n as usize);
    Ok(BatchObject {
        id: r.get("id")?,
        object: "batch",
        endpoint: r.get("endpoint")?,
        errors: json(r.get("errors")?),
        input_file_id: r.get("input_file_id")?,
        completion_window: r.get("completion_window")?,
        status,
        output_file_id: r.get("output_file_id")?,
        error_file_id: r.get("error_file_id")?,
        created_at: r.get("created_at")?,
        in_progress_at: r.get("in_progress_at")?,
        expires_at: r.get("expires_at")?,
        finalizing_at: r.get("finalizing_at")?,
        completed_at: r.get("completed_at")?,
        failed_at: r.get("failed_at")?,
        expired_at: r.get("expired_at")?,
        cancelling_at: r.get("cancelling_at")?,
        cancelled_at: r.get("cancelled_at")?,
        request_counts: RequestCounts {
            total: count("total")?,
            completed: count("completed")?,
            failed: count("failed")?,
        },
        metadata: json(r.get("metadata")?),
    })
}

fn open_db(path: &Path) -> Result<Connection, BatchError> {
    let db = Connection::open(path)?;
    // WAL with FULL sync: a committed status survives a power cut, not only a crash.
    db.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;")?;
    let version: i64 = db.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(BatchError::NewerSchema {
            path: path.to_owned(),
            found: version,
        });
    }
    if version == 0 {
        db.execute_batch(&format!(
            "BEGIN; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        ))?;
    } else if version == 1 {
        db.execute_batch(&format!(
            "BEGIN; {MIGRATE_1} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        ))?;
    }
    Ok(db)
}

/// Removes uploads a stopped server left half-written.
fn sweep_uploads(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(UPLOAD_PREFIX)
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A poisoned lock's data is still consistent here: every write to it is one statement.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
