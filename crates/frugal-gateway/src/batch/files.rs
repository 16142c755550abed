//! The Batch API's files: uploads (purpose `batch`) and batches' output and error files
//! (purpose `batch_output`, listed once their batch is final), as OpenAI's file objects.
//!
//! An upload is written under a temporary name, fsync'd and renamed into place before its
//! row is committed, so a crash leaves no row without its bytes (and the temporary files
//! it leaves are swept at the next start). Every path in the database is relative to the
//! data directory, so the directory can move.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use tokio::io::AsyncWriteExt;

use super::error::BatchError;

/// What clients upload batch inputs as; the only purpose `POST /v1/files` takes.
pub const UPLOAD_PURPOSE: &str = "batch";
/// A batch's output and error files.
pub const OUTPUT_PURPOSE: &str = "batch_output";
/// Uploads in progress, in the files folder.
pub(super) const UPLOAD_PREFIX: &str = ".upload-";

/// A file as OpenAI's API returns it.
#[derive(Debug, Clone, Serialize)]
pub struct FileObject {
    pub id: String,
    pub object: &'static str,
    pub bytes: u64,
    pub created_at: i64,
    pub filename: String,
    pub purpose: String,
    /// Always `processed`: a file is listed only once its bytes are durable.
    pub status: &'static str,
    /// Files are kept until deleted.
    pub expires_at: Option<i64>,
    pub status_details: Option<String>,
}

/// A row of `files`.
pub(super) struct FileRow {
    pub object: FileObject,
    /// Relative to the data directory.
    pub path: String,
}

/// Why a file was not deleted.
#[derive(Debug, PartialEq, Eq)]
pub enum Delete {
    Deleted,
    NotFound,
    /// The input of a batch that is not finished.
    InUse(String),
}

/// An upload being written; its temporary file is removed unless it is committed.
pub struct Upload {
    pub(super) id: String,
    pub(super) tmp: PathBuf,
    pub(super) file: Option<tokio::fs::File>,
    pub(super) bytes: u64,
}

impl Upload {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), BatchError> {
        let Some(file) = self.file.as_mut() else {
            return Err(BatchError::Task("the upload was already committed".into()));
        };
        file.write_all(chunk)
            .await
            .map_err(|source| BatchError::Io {
                what: "write the upload",
                path: self.tmp.clone(),
                source,
            })?;
        self.bytes += chunk.len() as u64;
        Ok(())
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

pub(super) fn insert_file(
    db: &Connection,
    row: &FileRow,
    tenant: Option<&str>,
) -> rusqlite::Result<()> {
    let f = &row.object;
    db.execute(
        "INSERT INTO files (id, tenant, filename, purpose, bytes, created_at, path)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            f.id,
            tenant,
            f.filename,
            f.purpose,
            f.bytes as i64,
            f.created_at,
            row.path
        ],
    )?;
    Ok(())
}

/// Whose files and batches a lookup sees.
#[derive(Debug, Clone, Copy)]
pub(super) enum Whose<'a> {
    /// The service's own work: every one.
    Any,
    /// A request's: its tenant's; with no key (an open API), only those made with no key,
    /// so an API opened later does not show the tenants' files and outputs.
    Caller(Option<&'a str>),
}

impl Whose<'_> {
    /// The SQL parameters of `(?A OR tenant IS ?T)`.
    pub(super) fn params(&self) -> (bool, Option<&str>) {
        match self {
            Whose::Any => (true, None),
            Whose::Caller(t) => (false, *t),
        }
    }
}

pub(super) fn file_row(
    db: &Connection,
    id: &str,
    whose: Whose<'_>,
) -> rusqlite::Result<Option<FileRow>> {
    let (any, tenant) = whose.params();
    db.query_row(
        "SELECT id, filename, purpose, bytes, created_at, path FROM files
         WHERE id = ?1 AND (?2 OR tenant IS ?3)",
        params![id, any, tenant],
        read_file_row,
    )
    .optional()
}

pub(super) fn read_file_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<FileRow> {
    Ok(FileRow {
        object: FileObject {
            id: r.get(0)?,
            object: "file",
            filename: r.get(1)?,
            purpose: r.get(2)?,
            bytes: r.get::<_, i64>(3)? as u64,
            created_at: r.get(4)?,
            status: "processed",
            expires_at: None,
            status_details: None,
        },
        path: r.get(5)?,
    })
}

pub(super) fn path_text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}
