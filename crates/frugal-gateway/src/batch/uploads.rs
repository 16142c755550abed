//! The Files API on the batch directory: an upload streamed to disk under a temporary name
//! (never held whole in memory), made durable and listed within its tenant's quota; files
//! listed, read and deleted (not while a batch reads them).

use std::path::Path;
use std::sync::Arc;

use rusqlite::{OptionalExtension, params};

use super::error::BatchError;
use super::files::{
    Delete, FileObject, FileRow, UPLOAD_PREFIX, UPLOAD_PURPOSE, Upload, Whose, file_row,
    insert_file, path_text, read_file_row,
};
use super::now_s;
use super::service::Batches;

impl Batches {
    /// Starts an upload under a temporary name in the files folder.
    pub async fn begin_upload(&self) -> Result<Upload, BatchError> {
        let id = super::random_id("file-");
        let tmp = self.files_dir().join(format!("{UPLOAD_PREFIX}{id}"));
        let file = tokio::fs::File::create(&tmp)
            .await
            .map_err(|source| BatchError::Io {
                what: "create the upload",
                path: tmp.clone(),
                source,
            })?;
        Ok(Upload {
            id,
            tmp,
            file: Some(file),
            bytes: 0,
        })
    }

    /// Bytes of files `tenant` keeps (with no keys, `None`: everyone's).
    pub async fn stored(self: &Arc<Self>, tenant: Option<String>) -> Result<u64, BatchError> {
        self.blocking(move |b| Ok(stored(&b.db(), tenant.as_deref())?))
            .await
    }

    /// Makes the upload durable under its id and lists it; refused when it would take its
    /// tenant's files over [`upload_quota`](super::service::BatchConfig::upload_quota).
    pub async fn commit_upload(
        self: &Arc<Self>,
        mut upload: Upload,
        filename: String,
        tenant: Option<String>,
    ) -> Result<FileObject, BatchError> {
        let io = |what, path: &Path| {
            let path = path.to_owned();
            move |source| BatchError::Io { what, path, source }
        };
        if let Some(file) = upload.file.as_mut() {
            file.sync_all()
                .await
                .map_err(io("sync the upload", &upload.tmp))?;
        }
        let name = Path::new("files").join(&upload.id);
        let path = self.dir().join(&name);
        tokio::fs::rename(&upload.tmp, &path)
            .await
            .map_err(io("move the upload into place", &path))?;
        upload.file = None;
        let object = FileObject {
            id: upload.id.clone(),
            object: "file",
            bytes: upload.bytes,
            created_at: now_s(),
            filename,
            purpose: UPLOAD_PURPOSE.to_owned(),
            status: "processed",
            expires_at: None,
            status_details: None,
        };
        let row = FileRow {
            object: object.clone(),
            path: path_text(&name),
        };
        let quota = self.config().upload_quota;
        self.blocking(move |b| {
            // The new name must survive a crash as the row does.
            let dir = b.files_dir();
            std::fs::File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(io("sync the files folder", &dir))?;
            // Summed and inserted under one lock: two uploads cannot both take the room left.
            let db = b.db();
            let before = stored(&db, tenant.as_deref())?;
            if before + row.object.bytes > quota {
                drop(db);
                let _ = std::fs::remove_file(&path);
                return Err(BatchError::QuotaExceeded {
                    tenant,
                    stored: before,
                    quota,
                });
            }
            insert_file(&db, &row, tenant.as_deref())?;
            Ok(())
        })
        .await?;
        Ok(object)
    }

    /// The file `id`, if it is `tenant`'s (with no tenant, if it was made with no key).
    pub async fn file(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<String>,
    ) -> Result<Option<FileObject>, BatchError> {
        let id = id.to_owned();
        self.blocking(move |b| {
            Ok(file_row(&b.db(), &id, Whose::Caller(tenant.as_deref()))?.map(|r| r.object))
        })
        .await
    }

    /// Newest first: up to `limit` files after the file `after`, and whether more follow.
    pub async fn files(
        self: &Arc<Self>,
        tenant: Option<String>,
        purpose: Option<String>,
        after: Option<String>,
        limit: usize,
    ) -> Result<(Vec<FileObject>, bool), BatchError> {
        self.blocking(move |b| {
            let db = b.db();
            let mut select = db.prepare(
                "SELECT id, filename, purpose, bytes, created_at, path FROM files
                 WHERE tenant IS ?1 AND (?2 IS NULL OR purpose = ?2)
                   AND (?3 IS NULL OR rowid < (SELECT rowid FROM files WHERE id = ?3))
                 ORDER BY rowid DESC LIMIT ?4",
            )?;
            let mut files = select
                .query_map(
                    params![tenant, purpose, after, limit as i64 + 1],
                    read_file_row,
                )?
                .map(|r| r.map(|r| r.object))
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let more = files.len() > limit;
            files.truncate(limit);
            Ok((files, more))
        })
        .await
    }

    /// Deletes the file and its bytes, unless an unfinished batch reads it.
    pub async fn delete_file(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<String>,
    ) -> Result<Delete, BatchError> {
        let id = id.to_owned();
        self.blocking(move |b| {
            let path = {
                let db = b.db();
                let Some(row) = file_row(&db, &id, Whose::Caller(tenant.as_deref()))? else {
                    return Ok(Delete::NotFound);
                };
                let user: Option<String> = db
                    .query_row(
                        "SELECT id FROM batches WHERE input_file_id = ?1
                         AND status IN ('validating', 'in_progress', 'finalizing', 'cancelling')",
                        params![id],
                        |r| r.get(0),
                    )
                    .optional()?;
                if let Some(batch) = user {
                    return Ok(Delete::InUse(batch));
                }
                db.execute("DELETE FROM files WHERE id = ?1", params![id])?;
                b.dir().join(row.path)
            };
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(path = %path.display(), "cannot remove a deleted file's bytes: {e}");
                }
                _ => {}
            }
            Ok(Delete::Deleted)
        })
        .await
    }

    /// The file's bytes, opened, with their length.
    pub async fn file_content(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<String>,
    ) -> Result<Option<(tokio::fs::File, u64)>, BatchError> {
        let id = id.to_owned();
        let path = self
            .blocking(move |b| {
                let row = file_row(&b.db(), &id, Whose::Caller(tenant.as_deref()))?;
                Ok(row.map(|r| b.dir().join(r.path)))
            })
            .await?;
        let Some(path) = path else {
            return Ok(None);
        };
        let io = |source| BatchError::Io {
            what: "read the file",
            path: path.clone(),
            source,
        };
        let file = tokio::fs::File::open(&path).await.map_err(io)?;
        let len = file.metadata().await.map_err(io)?.len();
        Ok(Some((file, len)))
    }
}

/// Bytes of the files `tenant` keeps (`None`: every file, as an open API has one quota).
fn stored(db: &rusqlite::Connection, tenant: Option<&str>) -> rusqlite::Result<u64> {
    let sum: i64 = db.query_row(
        "SELECT coalesce(sum(bytes), 0) FROM files WHERE ?1 IS NULL OR tenant = ?1",
        params![tenant],
        |r| r.get(0),
    )?;
    Ok(u64::try_from(sum).unwrap_or(0))
}
