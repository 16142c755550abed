//! Bringing back the newest checkpoint that verifies, file by file, into place.

use std::path::{Path as FsPath, PathBuf};

use futures_util::{StreamExt, TryStreamExt, stream};
use object_store::ObjectStoreExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::error::StoreError;
use super::manifest::{Manifest, ManifestFile, hex};
use super::{CheckpointStore, FILES_IN_FLIGHT};

/// Write buffer for restored files.
const WRITE_BUFFER: usize = 1024 * 1024;

impl CheckpointStore {
    /// Restores the newest complete checkpoint whose files all verify (size and SHA-256) into
    /// `dest/<step>`: written under `dest/.restore-<step>`, then renamed (an existing
    /// `dest/<step>` is replaced). A missing or corrupt file makes it warn and try the next
    /// older checkpoint. `Ok(None)` when no checkpoint is usable. Errors reaching the store
    /// (other than a missing object) or writing `dest` are returned, not skipped.
    pub async fn restore_newest(
        &self,
        dest: &FsPath,
    ) -> Result<Option<(Manifest, PathBuf)>, StoreError> {
        let manifests = self.complete().await?;
        if manifests.is_empty() {
            return Ok(None);
        }
        tokio::fs::create_dir_all(dest)
            .await
            .map_err(|source| StoreError::WriteLocal {
                path: dest.to_path_buf(),
                source,
            })?;
        for manifest in manifests {
            match self.restore(&manifest, dest).await {
                Ok(path) => return Ok(Some((manifest, path))),
                Err(RestoreFailure::Unusable { object, reason }) => {
                    tracing::warn!(
                        checkpoint = %self.url_of(&self.step_prefix(manifest.step)),
                        object = %object,
                        "skipping checkpoint {}: {object}: {reason}",
                        manifest.step
                    );
                }
                Err(RestoreFailure::Fatal(e)) => return Err(e),
            }
        }
        Ok(None)
    }

    async fn restore(&self, manifest: &Manifest, dest: &FsPath) -> Result<PathBuf, RestoreFailure> {
        let tmp = dest.join(format!(".restore-{}", manifest.step));
        remove_path(&tmp).await?;
        tokio::fs::create_dir_all(&tmp)
            .await
            .map_err(|source| write_error(&tmp, source))?;
        let downloads: Vec<_> = manifest
            .files
            .iter()
            .map(|file| self.restore_file(manifest.step, file, &tmp))
            .collect();
        let result: Result<Vec<()>, _> = stream::iter(downloads)
            .buffer_unordered(FILES_IN_FLIGHT)
            .try_collect()
            .await;
        if let Err(e) = result {
            if let Err(cleanup) = remove_path(&tmp).await {
                tracing::debug!("cleaning up {}: {cleanup:?}", tmp.display());
            }
            return Err(e);
        }
        let done = dest.join(manifest.step.to_string());
        remove_path(&done).await?;
        tokio::fs::rename(&tmp, &done)
            .await
            .map_err(|source| write_error(&done, source))?;
        // Make the rename durable; not every filesystem lets a directory be synced.
        if let Ok(dir) = tokio::fs::File::open(dest).await
            && let Err(e) = dir.sync_all().await
        {
            tracing::debug!("sync {}: {e}", dest.display());
        }
        Ok(done)
    }

    async fn restore_file(
        &self,
        step: u64,
        file: &ManifestFile,
        tmp: &FsPath,
    ) -> Result<(), RestoreFailure> {
        let object = self.file_object(step, &file.path);
        let unusable = |reason: String| RestoreFailure::Unusable {
            object: self.url_of(&object),
            reason,
        };
        let mut target = tmp.to_path_buf();
        target.extend(file.path.split('/'));
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|source| write_error(parent, source))?;
        }
        let got = match self.store.get(&object).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(unusable("missing from the store".to_string()));
            }
            Err(source) => {
                return Err(RestoreFailure::Fatal(
                    self.object_error("download", &object, source),
                ));
            }
        };
        if got.meta.size != file.size {
            return Err(unusable(format!(
                "{} bytes, the manifest says {}",
                got.meta.size, file.size
            )));
        }
        let out = tokio::fs::File::create(&target)
            .await
            .map_err(|source| write_error(&target, source))?;
        let mut out = tokio::io::BufWriter::with_capacity(WRITE_BUFFER, out);
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut body = got.into_stream();
        loop {
            let chunk = match body.try_next().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(object_store::Error::NotFound { .. }) => {
                    return Err(unusable("vanished while being read".to_string()));
                }
                Err(source) => {
                    return Err(RestoreFailure::Fatal(
                        self.object_error("download", &object, source),
                    ));
                }
            };
            size += chunk.len() as u64;
            if size > file.size {
                return Err(unusable(format!(
                    "more than the {} bytes the manifest says",
                    file.size
                )));
            }
            hasher.update(&chunk);
            out.write_all(&chunk)
                .await
                .map_err(|source| write_error(&target, source))?;
        }
        if size != file.size {
            return Err(unusable(format!(
                "{size} bytes, the manifest says {}",
                file.size
            )));
        }
        let sha256 = hex(&hasher.finalize());
        if sha256 != file.sha256 {
            return Err(unusable(format!(
                "sha256 {sha256}, the manifest says {}",
                file.sha256
            )));
        }
        out.flush()
            .await
            .map_err(|source| write_error(&target, source))?;
        out.get_ref()
            .sync_all()
            .await
            .map_err(|source| write_error(&target, source))?;
        Ok(())
    }
}

enum RestoreFailure {
    /// This checkpoint cannot be used; try an older one.
    Unusable { object: String, reason: String },
    /// Stop: the store cannot be reached or `dest` cannot be written.
    Fatal(StoreError),
}

impl std::fmt::Debug for RestoreFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unusable { object, reason } => write!(f, "{object}: {reason}"),
            Self::Fatal(e) => write!(f, "{e}"),
        }
    }
}

impl From<StoreError> for RestoreFailure {
    fn from(e: StoreError) -> Self {
        Self::Fatal(e)
    }
}

fn write_error(path: &FsPath, source: std::io::Error) -> RestoreFailure {
    RestoreFailure::Fatal(StoreError::WriteLocal {
        path: path.to_path_buf(),
        source,
    })
}

/// Removes a file or directory tree if it is there.
async fn remove_path(path: &FsPath) -> Result<(), RestoreFailure> {
    let result = match tokio::fs::symlink_metadata(path).await {
        Ok(meta) if meta.is_dir() => tokio::fs::remove_dir_all(path).await,
        Ok(_) => tokio::fs::remove_file(path).await,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
    };
    result.map_err(|source| write_error(path, source))
}
