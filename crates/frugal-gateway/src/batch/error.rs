//! The Batch API's one error type.

use std::io;
use std::path::PathBuf;

use super::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("cannot create the batch directory {}", path.display())]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the batch directory {} is in use by another frugal serve{}",
        dir.display(),
        pid.map(|p| format!(" (process {p})")).unwrap_or_default()
    )]
    Busy { dir: PathBuf, pid: Option<u32> },
    #[error("a batch's job store failed")]
    Store(#[source] StoreError),
    #[error("the batch database failed")]
    Db(#[from] rusqlite::Error),
    #[error(
        "the batch database {} has schema version {found}, newer than this frugal understands; upgrade frugal",
        path.display()
    )]
    NewerSchema { path: PathBuf, found: i64 },
    #[error("cannot {what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "This server runs at most {max} unfinished batches at once (`[serve] batch_max_active`); wait for one to finish or cancel one."
    )]
    TooManyBatches { max: usize },
    #[error(
        "This upload would take the files stored{} to over {quota} bytes (`[serve] batch_upload_quota_mb`); {stored} are stored. Delete files you no longer need.",
        tenant.as_deref().map(|t| format!(" by the tenant `{t}`")).unwrap_or_default()
    )]
    QuotaExceeded {
        tenant: Option<String>,
        stored: u64,
        quota: u64,
    },
    #[error("a batch task stopped: {0}")]
    Task(String),
}
