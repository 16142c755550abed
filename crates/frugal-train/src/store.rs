//! Checkpoints synced to an object store, atomically.
//!
//! The trainer publishes checkpoint directories `$FRUGAL_CHECKPOINT_DIR/<step>`; the supervisor
//! copies each one to a store with [`CheckpointStore::upload`] and, on a new machine, brings back
//! the newest complete one with [`CheckpointStore::restore_newest`].
//!
//! # Layout
//!
//! ```text
//! <prefix>/runs/<run_id>/<step, 20 digits>/files/<relative path>   every file of the directory
//! <prefix>/runs/<run_id>/<step, 20 digits>/MANIFEST.json           written last
//! ```
//!
//! The manifest (`{"version":1,"run_id","step","created_ms","files":[{"path","size","sha256"}]}`)
//! is what makes a checkpoint complete: it is written only after every file is in the store,
//! and a restore checks every file against it (size and SHA-256) before the restored directory
//! is renamed into place. A checkpoint without a manifest (an upload cut short) is never used.

use std::collections::HashSet;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{StreamExt, TryStreamExt, stream};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, RetryConfig, WriteMultipart};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The manifest format this module writes and reads.
pub const MANIFEST_VERSION: u32 = 1;
const MANIFEST_NAME: &str = "MANIFEST.json";
const FILES_DIR: &str = "files";
const RUNS_DIR: &str = "runs";
/// Files up to this size go up in one `put`; larger ones as a multipart upload.
const SINGLE_PUT_MAX: u64 = 64 * 1024 * 1024;
/// The part size of multipart uploads (raised for files that would need more than `MAX_PARTS`).
const PART_SIZE: usize = 16 * 1024 * 1024;
/// S3 allows 10,000 parts; stay below.
const MAX_PARTS: u64 = 9_000;
/// Parts of one multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 4;
/// Files uploaded or downloaded at once.
const FILES_IN_FLIGHT: usize = 4;
/// Manifests read at once when listing.
const MANIFESTS_IN_FLIGHT: usize = 8;
/// Read buffer for multipart uploads.
const READ_CHUNK: usize = 4 * 1024 * 1024;
/// Write buffer for restored files.
const WRITE_BUFFER: usize = 1024 * 1024;
/// Directories nested deeper than this in a checkpoint are refused (a symlink loop).
const MAX_DEPTH: usize = 64;

/// Why a store operation failed. Every message names the store or object and the cause.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store URL does not parse.
    #[error("checkpoint store {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// The store URL has a scheme this module does not know.
    #[error(
        "checkpoint store {url:?}: unknown scheme {scheme:?} (expected a local path, file://, s3://, gs:// or az://)"
    )]
    UnknownScheme { url: String, scheme: String },
    /// The run id cannot be one segment of an object name.
    #[error("checkpoint store {url}: invalid run id {run_id:?}: {reason}")]
    InvalidRunId {
        url: String,
        run_id: String,
        reason: String,
    },
    /// A builder option is unknown or has a bad value.
    #[error("checkpoint store {url}: option {key:?} = {value:?}: {reason}")]
    InvalidOption {
        url: String,
        key: String,
        value: String,
        reason: String,
    },
    /// The object store client could not be built.
    #[error("checkpoint store {url}: cannot open: {source}")]
    Open {
        url: String,
        #[source]
        source: object_store::Error,
    },
    /// The directory of a local store could not be created.
    #[error("checkpoint store {url}: cannot create directory {}: {source}", path.display())]
    LocalStore {
        url: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An operation on one object (or prefix) failed.
    #[error("{op} {object} failed: {source}")]
    Object {
        op: &'static str,
        object: String,
        #[source]
        source: object_store::Error,
    },
    /// A manifest could not be encoded.
    #[error("manifest {object}: {source}")]
    Manifest {
        object: String,
        #[source]
        source: serde_json::Error,
    },
    /// A file of the checkpoint to upload could not be read.
    #[error("checkpoint file {}: {source}", path.display())]
    ReadLocal {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint to upload holds something that cannot be stored.
    #[error("checkpoint {}: {reason}", path.display())]
    BadLocalPath { path: PathBuf, reason: String },
    /// A restored file or directory could not be written.
    #[error("restore into {}: {source}", path.display())]
    WriteLocal {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What `MANIFEST.json` says about one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_VERSION`].
    pub version: u32,
    pub run_id: String,
    pub step: u64,
    /// When the upload finished, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Every file of the checkpoint, sorted by path.
    pub files: Vec<ManifestFile>,
}

impl Manifest {
    /// Total size of the checkpoint's files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Relative to the checkpoint directory, `/`-separated.
    pub path: String,
    pub size: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// A run's checkpoints in an object store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    store: Arc<dyn ObjectStore>,
    /// `file:///dir` or `s3://bucket`: object names are printed as `<root_url>/<path>`.
    root_url: Arc<str>,
    /// `<prefix>/runs/<run_id>`.
    base: Path,
    run_id: Arc<str>,
    single_put_max: u64,
    part_size: usize,
}

/// The retry settings that `open_with_options` takes besides the builders' own keys.
const RETRY_KEYS: [&str; 4] = [
    "max_retries",
    "retry_timeout",
    "retry_init_backoff",
    "retry_max_backoff",
];

impl CheckpointStore {
    /// Opens the checkpoints of `run_id` in the store at `url`: a plain path or `file://` URL
    /// (a local directory, created if missing), or `s3://bucket/prefix`, `gs://bucket/prefix`,
    /// `az://container/prefix`. Cloud stores take their settings from the environment
    /// (`AWS_*`, `GOOGLE_*`, `AZURE_*`; e.g. `AWS_ENDPOINT` and `AWS_ALLOW_HTTP` for MinIO).
    pub fn open(url: &str, run_id: &str) -> Result<Self, StoreError> {
        Self::open_with_options(url, run_id, &[])
    }

    /// Like [`open`](Self::open), with builder options (key, value) applied after the
    /// environment: the keys of object_store's builders (`aws_endpoint`, `google_service_account`,
    /// `azure_storage_account_name`, ...), plus `max_retries`, `retry_timeout`,
    /// `retry_init_backoff` and `retry_max_backoff` (durations like `500ms`, `30s`, `2m`) for
    /// the client's retries of each request.
    pub fn open_with_options(
        url: &str,
        run_id: &str,
        options: &[(&str, &str)],
    ) -> Result<Self, StoreError> {
        check_run_id(url, run_id)?;
        let mut retry = RetryConfig::default();
        let mut builder_options = Vec::new();
        for &(key, value) in options {
            if RETRY_KEYS.contains(&key) {
                apply_retry_option(&mut retry, key, value).map_err(|reason| {
                    StoreError::InvalidOption {
                        url: url.to_string(),
                        key: key.to_string(),
                        value: value.to_string(),
                        reason,
                    }
                })?;
            } else {
                builder_options.push((key, value));
            }
        }

        if !url.contains("://") {
            return Self::open_local(url, PathBuf::from(url), run_id, &builder_options);
        }
        let parsed = url::Url::parse(url).map_err(|e| StoreError::InvalidUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
        let scheme = parsed.scheme().to_ascii_lowercase();
        if scheme == "file" {
            let dir = parsed.to_file_path().map_err(|()| StoreError::InvalidUrl {
                url: url.to_string(),
                reason: "a file:// URL must name an absolute local path (no host)".to_string(),
            })?;
            return Self::open_local(url, dir, run_id, &builder_options);
        }
        if !matches!(
            scheme.as_str(),
            "s3" | "s3a" | "gs" | "az" | "azure" | "abfs" | "abfss"
        ) {
            return Err(StoreError::UnknownScheme {
                url: url.to_string(),
                scheme,
            });
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(StoreError::InvalidUrl {
                url: url.to_string(),
                reason: "no bucket or container after the scheme".to_string(),
            });
        }
        let prefix = Path::from_url_path(parsed.path()).map_err(|e| StoreError::InvalidUrl {
            url: url.to_string(),
            reason: format!("bad prefix: {e}"),
        })?;
        let root_url: Arc<str> = format!("{}://{}", scheme, parsed.authority()).into();
        let bad_option = |key: &str, value: &str, reason: String| StoreError::InvalidOption {
            url: url.to_string(),
            key: key.to_string(),
            value: value.to_string(),
            reason,
        };
        let open_error = |source| StoreError::Open {
            url: url.to_string(),
            source,
        };
        // The same for each cloud: its builder from the environment, the options by the
        // cloud's own key names (an unknown key is an error, not ignored as
        // `object_store::parse_url_opts` does), then the URL and the retry policy.
        macro_rules! build {
            ($builder:ty, $key:ty) => {{
                let mut builder = <$builder>::from_env();
                for &(key, value) in &builder_options {
                    let parsed_key: $key = key
                        .parse()
                        .map_err(|e: object_store::Error| bad_option(key, value, e.to_string()))?;
                    builder = builder.with_config(parsed_key, value);
                }
                let store = builder
                    .with_url(url)
                    .with_retry(retry)
                    .build()
                    .map_err(open_error)?;
                Arc::new(store) as Arc<dyn ObjectStore>
            }};
        }
        let store = match scheme.as_str() {
            "s3" | "s3a" => build!(AmazonS3Builder, AmazonS3ConfigKey),
            "gs" => build!(GoogleCloudStorageBuilder, GoogleConfigKey),
            _ => build!(MicrosoftAzureBuilder, AzureConfigKey),
        };
        let base = prefix.clone().join(RUNS_DIR).join(run_id);
        Ok(Self::new(store, root_url, base, run_id))
    }

    fn open_local(
        url: &str,
        dir: PathBuf,
        run_id: &str,
        builder_options: &[(&str, &str)],
    ) -> Result<Self, StoreError> {
        if let Some(&(key, value)) = builder_options.first() {
            return Err(StoreError::InvalidOption {
                url: url.to_string(),
                key: key.to_string(),
                value: value.to_string(),
                reason: "a local store takes no options".to_string(),
            });
        }
        let run_dir = dir.join(RUNS_DIR).join(run_id);
        std::fs::create_dir_all(&run_dir).map_err(|source| StoreError::LocalStore {
            url: url.to_string(),
            path: run_dir.clone(),
            source,
        })?;
        let local = LocalFileSystem::new_with_prefix(&dir)
            .map_err(|source| StoreError::Open {
                url: url.to_string(),
                source,
            })?
            .with_automatic_cleanup(true)
            .with_fsync(true);
        let canonical = std::fs::canonicalize(&dir).map_err(|source| StoreError::LocalStore {
            url: url.to_string(),
            path: dir.clone(),
            source,
        })?;
        let root_url = url::Url::from_directory_path(&canonical)
            .map(|u| u.as_str().trim_end_matches('/').to_string())
            .unwrap_or_else(|()| format!("file://{}", canonical.display()));
        let base = Path::default().join(RUNS_DIR).join(run_id);
        Ok(Self::new(Arc::new(local), root_url.into(), base, run_id))
    }

    fn new(store: Arc<dyn ObjectStore>, root_url: Arc<str>, base: Path, run_id: &str) -> Self {
        Self {
            store,
            root_url,
            base,
            run_id: run_id.into(),
            single_put_max: SINGLE_PUT_MAX,
            part_size: PART_SIZE,
        }
    }

    /// Where the run's checkpoints live, for logs: `file:///dir/runs/RUN`, `s3://bucket/prefix/runs/RUN`.
    pub fn describe(&self) -> String {
        self.url_of(&self.base)
    }

    /// The run id the store was opened for.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Uploads every file under `dir` (recursively; symlinks are followed) as checkpoint `step`,
    /// then writes its manifest, last. An existing manifest of the same step is deleted first,
    /// so the step is not complete while it is being replaced. One attempt (the client still
    /// retries each request as configured); an error names the object that failed.
    pub async fn upload(&self, step: u64, dir: &FsPath) -> Result<Manifest, StoreError> {
        let local_files = collect_files(dir).await?;
        let manifest_object = self.manifest_object(step);
        self.delete_if_present(&manifest_object).await?;

        // Futures collected first, not mapped lazily: a stream of closures that take references
        // makes `upload` not `Send` for `tokio::spawn` (rust-lang/rust#102211).
        let uploads: Vec<_> = local_files
            .into_iter()
            .map(|f| self.upload_file(step, f))
            .collect();
        let files: Vec<ManifestFile> = stream::iter(uploads)
            .buffered(FILES_IN_FLIGHT)
            .try_collect()
            .await?;

        let created_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            run_id: self.run_id.to_string(),
            step,
            created_ms,
            files,
        };
        let body = serde_json::to_vec_pretty(&manifest).map_err(|source| StoreError::Manifest {
            object: self.url_of(&manifest_object),
            source,
        })?;
        self.store
            .put(&manifest_object, PutPayload::from(body))
            .await
            .map_err(|source| self.object_error("upload", &manifest_object, source))?;
        tracing::debug!(
            checkpoint = %self.url_of(&self.step_prefix(step)),
            files = manifest.files.len(),
            bytes = manifest.bytes(),
            "checkpoint uploaded"
        );
        Ok(manifest)
    }

    async fn upload_file(&self, step: u64, file: LocalFile) -> Result<ManifestFile, StoreError> {
        let object = self.file_object(step, &file.rel);
        let read_error = |source| StoreError::ReadLocal {
            path: file.path.clone(),
            source,
        };
        let mut reader = tokio::fs::File::open(&file.path)
            .await
            .map_err(read_error)?;
        let len = reader.metadata().await.map_err(read_error)?.len();
        let mut hasher = Sha256::new();

        if len <= self.single_put_max {
            let mut body = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
            reader.read_to_end(&mut body).await.map_err(read_error)?;
            hasher.update(&body);
            let size = body.len() as u64;
            self.store
                .put(&object, PutPayload::from(body))
                .await
                .map_err(|source| self.object_error("upload", &object, source))?;
            return Ok(ManifestFile {
                path: file.rel.clone(),
                size,
                sha256: hex(&hasher.finalize()),
            });
        }

        let part_size = self
            .part_size
            .max(usize::try_from(len.div_ceil(MAX_PARTS)).unwrap_or(usize::MAX));
        let upload =
            self.store.put_multipart(&object).await.map_err(|source| {
                self.object_error("start multipart upload of", &object, source)
            })?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, part_size);
        let mut buf = vec![0u8; READ_CHUNK.min(part_size)];
        let mut size = 0u64;
        loop {
            let n = match reader.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => n,
                Err(source) => {
                    if let Err(e) = writer.abort().await {
                        tracing::debug!(object = %self.url_of(&object), "abort failed: {e}");
                    }
                    return Err(read_error(source));
                }
            };
            if let Err(source) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
                if let Err(e) = writer.abort().await {
                    tracing::debug!(object = %self.url_of(&object), "abort failed: {e}");
                }
                return Err(self.object_error("upload", &object, source));
            }
            hasher.update(&buf[..n]);
            writer.write(&buf[..n]);
            size += n as u64;
        }
        writer
            .finish()
            .await
            .map_err(|source| self.object_error("upload", &object, source))?;
        Ok(ManifestFile {
            path: file.rel.clone(),
            size,
            sha256: hex(&hasher.finalize()),
        })
    }

    /// The complete checkpoints (manifest present, parses, names this run and step), newest first.
    pub async fn complete(&self) -> Result<Vec<Manifest>, StoreError> {
        let mut manifests: Vec<Manifest> = self
            .scan()
            .await?
            .into_iter()
            .filter_map(|(_, state)| match state {
                ManifestState::Valid(m) => Some(m),
                ManifestState::Missing => None,
                ManifestState::Invalid(_) => None,
            })
            .collect();
        manifests.sort_by_key(|m| std::cmp::Reverse(m.step));
        Ok(manifests)
    }

    /// Every step directory in the store with the state of its manifest (ascending by step).
    async fn scan(&self) -> Result<Vec<(u64, ManifestState)>, StoreError> {
        let listing = match self.store.list_with_delimiter(Some(&self.base)).await {
            Ok(listing) => listing,
            Err(object_store::Error::NotFound { .. }) => return Ok(Vec::new()),
            Err(source) => return Err(self.object_error("list", &self.base, source)),
        };
        let mut steps: Vec<u64> = listing
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().and_then(parse_step_dir))
            .collect();
        steps.sort_unstable();
        steps.dedup();
        let reads: Vec<_> = steps.into_iter().map(|step| self.scan_step(step)).collect();
        stream::iter(reads)
            .buffered(MANIFESTS_IN_FLIGHT)
            .try_collect()
            .await
    }

    async fn scan_step(&self, step: u64) -> Result<(u64, ManifestState), StoreError> {
        let state = self.read_manifest(step).await?;
        if let ManifestState::Invalid(why) = &state {
            tracing::warn!(
                manifest = %self.url_of(&self.manifest_object(step)),
                "ignoring checkpoint {step}: {why}"
            );
        }
        Ok((step, state))
    }

    async fn read_manifest(&self, step: u64) -> Result<ManifestState, StoreError> {
        let object = self.manifest_object(step);
        let got = match self.store.get(&object).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(ManifestState::Missing),
            Err(source) => return Err(self.object_error("read", &object, source)),
        };
        let body = match got.bytes().await {
            Ok(body) => body,
            Err(object_store::Error::NotFound { .. }) => return Ok(ManifestState::Missing),
            Err(source) => return Err(self.object_error("read", &object, source)),
        };
        let manifest: Manifest = match serde_json::from_slice(&body) {
            Ok(m) => m,
            Err(e) => {
                return Ok(ManifestState::Invalid(format!(
                    "manifest does not parse: {e}"
                )));
            }
        };
        Ok(match check_manifest(&manifest, &self.run_id, step) {
            Ok(()) => ManifestState::Valid(manifest),
            Err(why) => ManifestState::Invalid(why),
        })
    }

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

    /// Keeps the newest `keep` complete checkpoints (at least one) and deletes the older ones,
    /// manifest first, then files; also deletes incomplete leftovers (no valid manifest) of
    /// steps older than the newest complete checkpoint. Incomplete steps newer than it (an
    /// upload in progress) are left alone. Returns how many step directories were removed.
    pub async fn prune(&self, keep: usize) -> Result<usize, StoreError> {
        let keep = keep.max(1);
        let scanned = self.scan().await?;
        let mut complete: Vec<u64> = scanned
            .iter()
            .filter(|(_, state)| matches!(state, ManifestState::Valid(_)))
            .map(|(step, _)| *step)
            .collect();
        complete.sort_unstable_by_key(|&step| std::cmp::Reverse(step));
        let Some(&newest) = complete.first() else {
            return Ok(0);
        };
        let mut removed = 0;
        for &step in complete.iter().skip(keep) {
            self.delete_if_present(&self.manifest_object(step)).await?;
            self.delete_all_under(&self.step_prefix(step)).await?;
            removed += 1;
        }
        for (step, state) in &scanned {
            if *step < newest && !matches!(state, ManifestState::Valid(_)) {
                self.delete_all_under(&self.step_prefix(*step)).await?;
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::debug!(store = %self.describe(), removed, "pruned checkpoints");
        }
        Ok(removed)
    }

    async fn delete_if_present(&self, object: &Path) -> Result<(), StoreError> {
        match self.store.delete(object).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(self.object_error("delete", object, source)),
        }
    }

    async fn delete_all_under(&self, prefix: &Path) -> Result<(), StoreError> {
        let objects: Vec<Path> = match self
            .store
            .list(Some(prefix))
            .map_ok(|meta| meta.location)
            .try_collect()
            .await
        {
            Ok(objects) => objects,
            Err(object_store::Error::NotFound { .. }) => return Ok(()),
            Err(source) => return Err(self.object_error("list", prefix, source)),
        };
        let mut results = self
            .store
            .delete_stream(stream::iter(objects.into_iter().map(Ok)).boxed());
        while let Some(result) = results.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(source) => return Err(self.object_error("delete under", prefix, source)),
            }
        }
        Ok(())
    }

    fn step_prefix(&self, step: u64) -> Path {
        self.base.clone().join(format!("{step:020}"))
    }

    fn manifest_object(&self, step: u64) -> Path {
        self.step_prefix(step).join(MANIFEST_NAME)
    }

    fn file_object(&self, step: u64, rel: &str) -> Path {
        rel.split('/')
            .fold(self.step_prefix(step).join(FILES_DIR), |p, part| {
                p.join(part)
            })
    }

    fn url_of(&self, object: &Path) -> String {
        if object.as_ref().is_empty() {
            self.root_url.to_string()
        } else {
            format!("{}/{}", self.root_url, object)
        }
    }

    fn object_error(
        &self,
        op: &'static str,
        object: &Path,
        source: object_store::Error,
    ) -> StoreError {
        StoreError::Object {
            op,
            object: self.url_of(object),
            source,
        }
    }

    #[cfg(test)]
    fn with_multipart_sizes(mut self, single_put_max: u64, part_size: usize) -> Self {
        self.single_put_max = single_put_max;
        self.part_size = part_size;
        self
    }
}

/// The published checkpoints in a local checkpoint directory, ascending by step: the
/// directories whose names are all ASCII digits. Everything else (`.tmp-*`, files, other
/// names) is ignored.
pub fn local_checkpoints(dir: &FsPath) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(step) = name.parse::<u64>() else {
            continue;
        };
        let path = entry.path();
        if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            found.push((step, path));
        }
    }
    found.sort();
    Ok(found)
}

enum ManifestState {
    Missing,
    Invalid(String),
    Valid(Manifest),
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

struct LocalFile {
    /// `/`-separated, relative to the checkpoint directory.
    rel: String,
    path: PathBuf,
}

/// Every regular file under `dir`, sorted by relative path.
async fn collect_files(dir: &FsPath) -> Result<Vec<LocalFile>, StoreError> {
    let meta = tokio::fs::metadata(dir)
        .await
        .map_err(|source| StoreError::ReadLocal {
            path: dir.to_path_buf(),
            source,
        })?;
    if !meta.is_dir() {
        return Err(StoreError::BadLocalPath {
            path: dir.to_path_buf(),
            reason: "not a directory".to_string(),
        });
    }
    let mut files = Vec::new();
    let mut pending: Vec<(PathBuf, Vec<String>)> = vec![(dir.to_path_buf(), Vec::new())];
    while let Some((path, rel)) = pending.pop() {
        if rel.len() > MAX_DEPTH {
            return Err(StoreError::BadLocalPath {
                path,
                reason: format!("nested deeper than {MAX_DEPTH} directories (a symlink loop?)"),
            });
        }
        let read_error = |source| StoreError::ReadLocal {
            path: path.clone(),
            source,
        };
        let mut entries = tokio::fs::read_dir(&path).await.map_err(read_error)?;
        while let Some(entry) = entries.next_entry().await.map_err(read_error)? {
            let entry_path = entry.path();
            let Ok(name) = entry.file_name().into_string() else {
                return Err(StoreError::BadLocalPath {
                    path: entry_path,
                    reason: "file name is not UTF-8".to_string(),
                });
            };
            let meta =
                tokio::fs::metadata(&entry_path)
                    .await
                    .map_err(|source| StoreError::ReadLocal {
                        path: entry_path.clone(),
                        source,
                    })?;
            let mut entry_rel = rel.clone();
            entry_rel.push(name);
            if meta.is_dir() {
                pending.push((entry_path, entry_rel));
            } else if meta.is_file() {
                files.push(LocalFile {
                    rel: entry_rel.join("/"),
                    path: entry_path,
                });
            } else {
                tracing::debug!("not uploading {}: not a file", entry_path.display());
            }
        }
    }
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(files)
}

/// A step directory name in the store: exactly 20 ASCII digits.
fn parse_step_dir(name: &str) -> Option<u64> {
    if name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()) {
        name.parse().ok()
    } else {
        None
    }
}

fn check_run_id(url: &str, run_id: &str) -> Result<(), StoreError> {
    let reason = if run_id.is_empty() {
        Some("empty")
    } else if run_id.starts_with('.') {
        Some("starts with '.'")
    } else if !run_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        Some("only ASCII letters, digits, '-', '_' and '.' are allowed")
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(StoreError::InvalidRunId {
            url: url.to_string(),
            run_id: run_id.to_string(),
            reason: reason.to_string(),
        }),
    }
}

/// Checks what a restore relies on: the manifest is for this run and step, and every path is
/// relative, plain and distinct, with no file where another needs a directory.
fn check_manifest(manifest: &Manifest, run_id: &str, step: u64) -> Result<(), String> {
    if manifest.version != MANIFEST_VERSION {
        return Err(format!(
            "manifest version {} (this build reads {MANIFEST_VERSION})",
            manifest.version
        ));
    }
    if manifest.run_id != run_id {
        return Err(format!("manifest names run {:?}", manifest.run_id));
    }
    if manifest.step != step {
        return Err(format!("manifest names step {}", manifest.step));
    }
    let mut files = HashSet::new();
    let mut dirs = HashSet::new();
    for file in &manifest.files {
        let parts: Vec<&str> = file.path.split('/').collect();
        if parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == ".." || p.contains('\0'))
        {
            return Err(format!("manifest lists a bad path {:?}", file.path));
        }
        if file.sha256.len() != 64
            || !file
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!(
                "manifest has a bad sha256 for {:?}: {:?}",
                file.path, file.sha256
            ));
        }
        for i in 1..parts.len() {
            dirs.insert(parts[..i].join("/"));
        }
        if !files.insert(file.path.as_str()) {
            return Err(format!("manifest lists {:?} twice", file.path));
        }
    }
    if let Some(clash) = manifest
        .files
        .iter()
        .find(|f| dirs.contains(f.path.as_str()))
    {
        return Err(format!(
            "manifest lists {:?} as a file and as a directory",
            clash.path
        ));
    }
    Ok(())
}

fn apply_retry_option(retry: &mut RetryConfig, key: &str, value: &str) -> Result<(), String> {
    match key {
        "max_retries" => {
            retry.max_retries = value
                .trim()
                .parse()
                .map_err(|e| format!("not a count: {e}"))?;
        }
        "retry_timeout" => retry.retry_timeout = parse_duration(value)?,
        "retry_init_backoff" => retry.backoff.init_backoff = parse_duration(value)?,
        "retry_max_backoff" => retry.backoff.max_backoff = parse_duration(value)?,
        _ => return Err("unknown retry option".to_string()),
    }
    Ok(())
}

/// `250ms`, `30s`, `2m`, `1h`, or a bare number of seconds.
fn parse_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let (number, scale) = if let Some(n) = value.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = value.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = value.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (value, 1.0)
    };
    let number: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("not a duration (e.g. 500ms, 30s, 2m): {value:?}"))?;
    Duration::try_from_secs_f64(number * scale)
        .map_err(|e| format!("not a duration (e.g. 500ms, 30s, 2m): {value:?}: {e}"))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    /// Steps of the store's complete checkpoints, newest first.
    async fn complete_steps(store: &CheckpointStore) -> Vec<u64> {
        store
            .complete()
            .await
            .unwrap()
            .iter()
            .map(|m| m.step)
            .collect()
    }

    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::body::{Body, Bytes};
    use axum::extract::{DefaultBodyLimit, State};
    use axum::http::{Method, StatusCode, Uri};
    use axum::response::Response;

    const RUN: &str = "run-1";

    /// A checkpoint directory `<root>/<step>` with `model.bin` and `opt/state.json`.
    fn write_checkpoint(root: &FsPath, step: u64, seed: u8) -> PathBuf {
        let dir = root.join(step.to_string());
        std::fs::create_dir_all(dir.join("opt")).unwrap();
        let model: Vec<u8> = (0..10_000u32)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect();
        std::fs::write(dir.join("model.bin"), model).unwrap();
        std::fs::write(
            dir.join("opt").join("state.json"),
            format!("{{\"step\":{step},\"seed\":{seed}}}"),
        )
        .unwrap();
        dir
    }

    /// Every file under `dir`, relative path -> bytes.
    fn read_tree(dir: &FsPath) -> BTreeMap<String, Vec<u8>> {
        fn walk(root: &FsPath, dir: &FsPath, out: &mut BTreeMap<String, Vec<u8>>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(root, &path, out);
                } else {
                    let rel = path
                        .strip_prefix(root)
                        .unwrap()
                        .to_str()
                        .unwrap()
                        .to_string();
                    out.insert(rel, std::fs::read(&path).unwrap());
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(dir, dir, &mut out);
        out
    }

    fn step_dir(store_root: &FsPath, step: u64) -> PathBuf {
        store_root
            .join("runs")
            .join(RUN)
            .join(format!("{step:020}"))
    }

    fn names(dir: &FsPath) -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    }

    #[tokio::test]
    async fn local_round_trip_restores_identical_bytes_and_the_newest() {
        let tmp = tempfile::tempdir().unwrap();
        let store_root = tmp.path().join("store");
        let store = CheckpointStore::open(store_root.to_str().unwrap(), RUN).unwrap();
        assert!(
            store.describe().starts_with("file:///"),
            "{}",
            store.describe()
        );
        assert!(
            store.describe().ends_with("/store/runs/run-1"),
            "{}",
            store.describe()
        );

        let ckpts = tmp.path().join("ckpt");
        let dir100 = write_checkpoint(&ckpts, 100, 1);
        let manifest = store.upload(100, &dir100).await.unwrap();
        assert_eq!(manifest.step, 100);
        assert_eq!(manifest.run_id, RUN);
        let paths: Vec<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["model.bin", "opt/state.json"]);
        assert_eq!(manifest.bytes(), 10_000 + manifest.files[1].size);

        let complete = store.complete().await.unwrap();
        assert_eq!(complete, vec![manifest.clone()]);

        let dest = tmp.path().join("restored");
        let (restored, path) = store.restore_newest(&dest).await.unwrap().unwrap();
        assert_eq!(restored, manifest);
        assert_eq!(path, dest.join("100"));
        assert_eq!(read_tree(&path), read_tree(&dir100));

        let dir200 = write_checkpoint(&ckpts, 200, 2);
        store.upload(200, &dir200).await.unwrap();
        let steps = complete_steps(&store).await;
        assert_eq!(steps, [200, 100]);
        let (restored, path) = store.restore_newest(&dest).await.unwrap().unwrap();
        assert_eq!(restored.step, 200);
        assert_eq!(read_tree(&path), read_tree(&dir200));
        assert_ne!(read_tree(&dir100), read_tree(&dir200));
        // Restoring again replaces the directory; no staging directory is left behind.
        store.restore_newest(&dest).await.unwrap().unwrap();
        assert_eq!(names(&dest), BTreeSet::from(["100".into(), "200".into()]));

        // A clone sees the same store.
        assert_eq!(store.clone().complete().await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn large_files_go_up_in_parts_and_come_back_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let store_root = tmp.path().join("store");
        let store = CheckpointStore::open(store_root.to_str().unwrap(), RUN)
            .unwrap()
            .with_multipart_sizes(4096, 1000);
        let dir = write_checkpoint(&tmp.path().join("ckpt"), 7, 3);
        let manifest = store.upload(7, &dir).await.unwrap();
        assert_eq!(manifest.files[0].size, 10_000);
        let (_, path) = store
            .restore_newest(&tmp.path().join("out"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read_tree(&path), read_tree(&dir));
    }

    #[tokio::test]
    async fn a_checkpoint_without_manifest_is_not_listed_nor_restored() {
        let tmp = tempfile::tempdir().unwrap();
        let store_root = tmp.path().join("store");
        let store = CheckpointStore::open(store_root.to_str().unwrap(), RUN).unwrap();
        let ckpts = tmp.path().join("ckpt");
        let dir100 = write_checkpoint(&ckpts, 100, 1);
        store.upload(100, &dir100).await.unwrap();
        store
            .upload(200, &write_checkpoint(&ckpts, 200, 2))
            .await
            .unwrap();
        // Cut short: the manifest never made it.
        std::fs::remove_file(step_dir(&store_root, 200).join(MANIFEST_NAME)).unwrap();
        // Files written straight into the store, no manifest.
        let stray = step_dir(&store_root, 300).join("files");
        std::fs::create_dir_all(&stray).unwrap();
        std::fs::write(stray.join("model.bin"), b"partial").unwrap();

        let steps = complete_steps(&store).await;
        assert_eq!(steps, [100]);
        let dest = tmp.path().join("restored");
        let (restored, path) = store.restore_newest(&dest).await.unwrap().unwrap();
        assert_eq!(restored.step, 100);
        assert_eq!(read_tree(&path), read_tree(&dir100));
    }

    #[tokio::test]
    async fn manifests_that_do_not_fit_are_not_complete() {
        let tmp = tempfile::tempdir().unwrap();
        let store_root = tmp.path().join("store");
        let store = CheckpointStore::open(store_root.to_str().unwrap(), RUN).unwrap();
        let ckpts = tmp.path().join("ckpt");
        let manifest = store
            .upload(100, &write_checkpoint(&ckpts, 100, 1))
            .await
            .unwrap();
        let write = |step: u64, m: &Manifest| {
            let dir = step_dir(&store_root, step);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(MANIFEST_NAME), serde_json::to_vec(m).unwrap()).unwrap();
        };
        let mut escape = manifest.clone();
        escape.step = 200;
        escape.files[0].path = "../../evil".into();
        write(200, &escape);
        let mut wrong_step = manifest.clone();
        wrong_step.step = 299;
        write(300, &wrong_step);
        let mut other_run = manifest.clone();
        other_run.step = 400;
        other_run.run_id = "someone-else".into();
        write(400, &other_run);
        let dir = step_dir(&store_root, 500);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(MANIFEST_NAME), b"{not json").unwrap();

        let steps = complete_steps(&store).await;
        assert_eq!(steps, [100]);
    }

    #[tokio::test]
    async fn a_corrupt_or_missing_object_skips_to_an_older_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let store_root = tmp.path().join("store");
        let store = CheckpointStore::open(store_root.to_str().unwrap(), RUN).unwrap();
        let ckpts = tmp.path().join("ckpt");
        let dir100 = write_checkpoint(&ckpts, 100, 1);
        store.upload(100, &dir100).await.unwrap();
        let dir200 = write_checkpoint(&ckpts, 200, 2);
        store.upload(200, &dir200).await.unwrap();
        let dir300 = write_checkpoint(&ckpts, 300, 3);
        store.upload(300, &dir300).await.unwrap();

        // 300: same size, other bytes. 200: a file is gone.
        let model300 = step_dir(&store_root, 300).join("files").join("model.bin");
        std::fs::write(&model300, vec![0u8; 10_000]).unwrap();
        std::fs::remove_file(step_dir(&store_root, 200).join("files/opt/state.json")).unwrap();

        let dest = tmp.path().join("restored");
        let (restored, path) = store.restore_newest(&dest).await.unwrap().unwrap();
        assert_eq!(restored.step, 100);
        assert_eq!(read_tree(&path), read_tree(&dir100));
        assert_eq!(names(&dest), BTreeSet::from(["100".to_string()]));

        // 100: truncated. Nothing usable is left.
        let model100 = step_dir(&store_root, 100).join("files").join("model.bin");
        std::fs::write(&model100, b"short").unwrap();
        let fresh = tmp.path().join("fresh");
        assert!(store.restore_newest(&fresh).await.unwrap().is_none());
        assert!(names(&fresh).is_empty(), "{:?}", names(&fresh));
    }

    #[tokio::test]
    async fn an_empty_store_restores_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path().join("s").to_str().unwrap(), RUN).unwrap();
        assert!(store.complete().await.unwrap().is_empty());
        assert!(
            store
                .restore_newest(&tmp.path().join("out"))
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(store.prune(2).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn prune_keeps_the_newest_and_an_upload_in_progress() {
        let tmp = tempfile::tempdir().unwrap();
        let store_root = tmp.path().join("store");
        let url = format!("file://{}", store_root.display());
        let store = CheckpointStore::open(&url, RUN).unwrap();
        let ckpts = tmp.path().join("ckpt");
        for (i, step) in [5u64, 10, 20, 30, 40, 50].into_iter().enumerate() {
            store
                .upload(step, &write_checkpoint(&ckpts, step, i as u8))
                .await
                .unwrap();
        }
        // 5: an old leftover; 50: an upload still going.
        std::fs::remove_file(step_dir(&store_root, 5).join(MANIFEST_NAME)).unwrap();
        std::fs::remove_file(step_dir(&store_root, 50).join(MANIFEST_NAME)).unwrap();

        assert_eq!(store.prune(2).await.unwrap(), 3);
        let steps = complete_steps(&store).await;
        assert_eq!(steps, [40, 30]);
        for gone in [5, 10, 20] {
            assert!(!step_dir(&store_root, gone).exists(), "{gone} left behind");
        }
        assert!(step_dir(&store_root, 50).join("files/model.bin").exists());
        assert_eq!(store.prune(2).await.unwrap(), 0);
        // keep = 0 still keeps the newest.
        assert_eq!(store.prune(0).await.unwrap(), 1);
        let steps = complete_steps(&store).await;
        assert_eq!(steps, [40]);
    }

    #[tokio::test]
    async fn uploading_a_step_again_replaces_it() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path().join("s").to_str().unwrap(), RUN).unwrap();
        let ckpts = tmp.path().join("ckpt");
        store
            .upload(100, &write_checkpoint(&ckpts, 100, 1))
            .await
            .unwrap();
        let again = write_checkpoint(&tmp.path().join("again"), 100, 9);
        store.upload(100, &again).await.unwrap();
        let (m, path) = store
            .restore_newest(&tmp.path().join("out"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(m.step, 100);
        assert_eq!(read_tree(&path), read_tree(&again));
    }

    #[tokio::test]
    async fn every_operation_can_run_in_a_spawned_task() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path().join("s").to_str().unwrap(), RUN).unwrap();
        let dir = write_checkpoint(&tmp.path().join("ckpt"), 1, 1);
        let out = tmp.path().join("out");
        let s = store.clone();
        tokio::spawn(async move { s.upload(1, &dir).await.map(|_| ()) })
            .await
            .unwrap()
            .unwrap();
        let s = store.clone();
        let listed = tokio::spawn(async move { s.complete().await })
            .await
            .unwrap();
        assert_eq!(listed.unwrap().len(), 1);
        let s = store.clone();
        let restored = tokio::spawn(async move { s.restore_newest(&out).await });
        assert!(restored.await.unwrap().unwrap().is_some());
        let s = store.clone();
        let pruned = tokio::spawn(async move { s.prune(1).await }).await.unwrap();
        assert_eq!(pruned.unwrap(), 0);
    }

    #[test]
    fn local_checkpoints_lists_only_published_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        for name in ["12", "3", ".tmp-5", "abc", "4x", "0012"] {
            std::fs::create_dir(dir.join(name)).unwrap();
        }
        std::fs::write(dir.join("7"), b"not a directory").unwrap();
        let found = local_checkpoints(dir).unwrap();
        let steps: Vec<u64> = found.iter().map(|(s, _)| *s).collect();
        assert_eq!(steps, [3, 12, 12]);
        assert_eq!(found[0].1, dir.join("3"));
        assert!(local_checkpoints(&dir.join("missing")).is_err());
    }

    #[test]
    fn opening_bad_urls_says_why() {
        let err = CheckpointStore::open("ftp://x/y", RUN).unwrap_err();
        assert!(matches!(err, StoreError::UnknownScheme { .. }), "{err}");
        assert!(err.to_string().contains("\"ftp\""), "{err}");

        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let under_file = file.join("store");
        let err = CheckpointStore::open(under_file.to_str().unwrap(), RUN).unwrap_err();
        assert!(matches!(err, StoreError::LocalStore { .. }), "{err}");
        assert!(err.to_string().contains("a-file/store"), "{err}");

        let err = CheckpointStore::open(tmp.path().to_str().unwrap(), "../up").unwrap_err();
        assert!(matches!(err, StoreError::InvalidRunId { .. }), "{err}");
        let err = CheckpointStore::open("s3:///prefix", RUN).unwrap_err();
        assert!(matches!(err, StoreError::InvalidUrl { .. }), "{err}");
        let err = CheckpointStore::open_with_options("s3://b/p", RUN, &[("no_such_key", "1")])
            .unwrap_err();
        assert!(err.to_string().contains("no_such_key"), "{err}");
        let err = CheckpointStore::open_with_options("s3://b/p", RUN, &[("max_retries", "x")])
            .unwrap_err();
        assert!(matches!(err, StoreError::InvalidOption { .. }), "{err}");
        let err = CheckpointStore::open_with_options(
            tmp.path().to_str().unwrap(),
            RUN,
            &[("aws_region", "x")],
        )
        .unwrap_err();
        assert!(matches!(err, StoreError::InvalidOption { .. }), "{err}");
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("3s").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    // ---- A mock S3 server: just what object_store's S3 client uses. ----

    /// A multipart upload: the object, and its parts by number.
    type Upload = (String, BTreeMap<u32, Bytes>);

    #[derive(Default)]
    struct MockS3 {
        /// "bucket/key" -> body.
        objects: Mutex<BTreeMap<String, Bytes>>,
        /// upload id -> (object, part number -> body).
        uploads: Mutex<HashMap<String, Upload>>,
        next_upload: AtomicUsize,
        /// Answer this many requests with 503 first...
        fail_next: AtomicUsize,
        /// ... only those with this method, if set.
        fail_only: Mutex<Option<Method>>,
        requests: AtomicUsize,
    }

    impl MockS3 {
        fn keys(&self) -> Vec<String> {
            self.objects.lock().unwrap().keys().cloned().collect()
        }
    }

    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' && i + 2 < bytes.len() {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    }

    fn xml_escape(s: &str) -> String {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    }

    fn xml_unescape(s: &str) -> String {
        s.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&")
    }

    fn etag(body: &[u8]) -> String {
        format!("\"{}\"", &hex(&Sha256::digest(body))[..32])
    }

    fn respond(status: StatusCode, headers: &[(&str, String)], body: impl Into<Body>) -> Response {
        let mut builder = Response::builder().status(status);
        for (name, value) in headers {
            builder = builder.header(*name, value);
        }
        builder.body(body.into()).unwrap()
    }

    fn xml(body: String) -> Response {
        respond(
            StatusCode::OK,
            &[("content-type", "application/xml".to_string())],
            body,
        )
    }

    fn not_found() -> Response {
        respond(
            StatusCode::NOT_FOUND,
            &[],
            "<Error><Code>NoSuchKey</Code><Message>not found</Message></Error>",
        )
    }

    async fn mock_s3(
        State(s3): State<Arc<MockS3>>,
        method: Method,
        uri: Uri,
        body: Bytes,
    ) -> Response {
        s3.requests.fetch_add(1, Ordering::SeqCst);
        let targeted = s3
            .fail_only
            .lock()
            .unwrap()
            .as_ref()
            .is_none_or(|m| *m == method);
        if targeted
            && s3
                .fail_next
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return respond(StatusCode::SERVICE_UNAVAILABLE, &[], "busy");
        }
        let path = uri.path().trim_start_matches('/');
        let (bucket, key) = match path.split_once('/') {
            Some((bucket, key)) => (bucket.to_string(), decode(key)),
            None => (path.to_string(), String::new()),
        };
        let query: HashMap<String, String> = uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (decode(k), decode(v)),
                None => (decode(kv), String::new()),
            })
            .collect();
        let full = format!("{bucket}/{key}");

        if key.is_empty() {
            return if method == Method::GET
                && query.get("list-type").map(String::as_str) == Some("2")
            {
                list(&s3, &bucket, &query)
            } else if method == Method::POST && query.contains_key("delete") {
                let text = String::from_utf8(body.to_vec()).unwrap();
                let mut deleted = String::new();
                let mut objects = s3.objects.lock().unwrap();
                for piece in text.split("<Key>").skip(1) {
                    let key = xml_unescape(piece.split("</Key>").next().unwrap());
                    objects.remove(&format!("{bucket}/{key}"));
                    deleted.push_str(&format!(
                        "<Deleted><Key>{}</Key></Deleted>",
                        xml_escape(&key)
                    ));
                }
                xml(format!("<DeleteResult>{deleted}</DeleteResult>"))
            } else {
                respond(StatusCode::NOT_IMPLEMENTED, &[], "bucket operation")
            };
        }

        match method {
            Method::PUT if query.contains_key("uploadId") => {
                let number: u32 = query["partNumber"].parse().unwrap();
                let mut uploads = s3.uploads.lock().unwrap();
                let Some((_, parts)) = uploads.get_mut(&query["uploadId"]) else {
                    return not_found();
                };
                let tag = etag(&body);
                parts.insert(number, body);
                respond(StatusCode::OK, &[("etag", tag)], "")
            }
            Method::PUT => {
                let tag = etag(&body);
                s3.objects.lock().unwrap().insert(full, body);
                respond(StatusCode::OK, &[("etag", tag)], "")
            }
            Method::POST if query.contains_key("uploads") => {
                let id = format!("upload-{}", s3.next_upload.fetch_add(1, Ordering::SeqCst));
                s3.uploads
                    .lock()
                    .unwrap()
                    .insert(id.clone(), (full, BTreeMap::new()));
                xml(format!(
                    "<InitiateMultipartUploadResult><Bucket>{bucket}</Bucket><Key>{}</Key><UploadId>{id}</UploadId></InitiateMultipartUploadResult>",
                    xml_escape(&key)
                ))
            }
            Method::POST if query.contains_key("uploadId") => {
                let Some((object, parts)) = s3.uploads.lock().unwrap().remove(&query["uploadId"])
                else {
                    return not_found();
                };
                let whole: Vec<u8> = parts.values().flat_map(|p| p.iter().copied()).collect();
                let tag = etag(&whole);
                s3.objects
                    .lock()
                    .unwrap()
                    .insert(object, Bytes::from(whole));
                xml(format!(
                    "<CompleteMultipartUploadResult><Key>{}</Key><ETag>{}</ETag></CompleteMultipartUploadResult>",
                    xml_escape(&key),
                    xml_escape(&tag)
                ))
            }
            Method::DELETE if query.contains_key("uploadId") => {
                s3.uploads.lock().unwrap().remove(&query["uploadId"]);
                respond(StatusCode::NO_CONTENT, &[], "")
            }
            Method::DELETE => {
                s3.objects.lock().unwrap().remove(&full);
                respond(StatusCode::NO_CONTENT, &[], "")
            }
            Method::GET | Method::HEAD => {
                let Some(object) = s3.objects.lock().unwrap().get(&full).cloned() else {
                    return not_found();
                };
                let headers = [
                    ("content-length", object.len().to_string()),
                    ("etag", etag(&object)),
                    ("last-modified", "Mon, 01 Jan 2024 00:00:00 GMT".to_string()),
                ];
                let body = if method == Method::HEAD {
                    Bytes::new()
                } else {
                    object
                };
                respond(StatusCode::OK, &headers, body)
            }
            _ => respond(StatusCode::NOT_IMPLEMENTED, &[], "object operation"),
        }
    }

    fn list(s3: &MockS3, bucket: &str, query: &HashMap<String, String>) -> Response {
        let prefix = query.get("prefix").cloned().unwrap_or_default();
        let delimiter = query.get("delimiter").filter(|d| !d.is_empty());
        let mut contents = String::new();
        let mut prefixes = BTreeSet::new();
        for (full, body) in s3.objects.lock().unwrap().iter() {
            let Some(key) = full.strip_prefix(&format!("{bucket}/")) else {
                continue;
            };
            let Some(rest) = key.strip_prefix(prefix.as_str()) else {
                continue;
            };
            if let Some(d) = delimiter
                && let Some(at) = rest.find(d.as_str())
            {
                prefixes.insert(format!("{prefix}{}", &rest[..at + d.len()]));
                continue;
            }
            contents.push_str(&format!(
                "<Contents><Key>{}</Key><Size>{}</Size><LastModified>2024-01-01T00:00:00.000Z</LastModified><ETag>{}</ETag></Contents>",
                xml_escape(key),
                body.len(),
                xml_escape(&etag(body))
            ));
        }
        let prefixes: String = prefixes
            .iter()
            .map(|p| {
                format!(
                    "<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>",
                    xml_escape(p)
                )
            })
            .collect();
        xml(format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>{bucket}</Name><Prefix>{}</Prefix><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated>{contents}{prefixes}</ListBucketResult>",
            xml_escape(&prefix)
        ))
    }

    async fn start_mock() -> (Arc<MockS3>, String) {
        let s3 = Arc::new(MockS3::default());
        let app = axum::Router::new()
            .fallback(mock_s3)
            .layer(DefaultBodyLimit::disable())
            .with_state(Arc::clone(&s3));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (s3, endpoint)
    }

    fn open_s3(endpoint: &str, max_retries: &str) -> CheckpointStore {
        CheckpointStore::open_with_options(
            "s3://bucket/team/ckpts",
            RUN,
            &[
                ("aws_endpoint", endpoint),
                ("aws_allow_http", "true"),
                ("aws_access_key_id", "test"),
                ("aws_secret_access_key", "test"),
                ("aws_region", "us-east-1"),
                ("aws_virtual_hosted_style_request", "false"),
                ("max_retries", max_retries),
                ("retry_init_backoff", "1ms"),
                ("retry_max_backoff", "5ms"),
                ("retry_timeout", "10s"),
            ],
        )
        .unwrap()
    }

    #[tokio::test]
    async fn s3_round_trip_through_a_mock_server() {
        let (s3, endpoint) = start_mock().await;
        let store = open_s3(&endpoint, "2").with_multipart_sizes(4096, 5000);
        assert_eq!(store.describe(), "s3://bucket/team/ckpts/runs/run-1");
        assert!(store.complete().await.unwrap().is_empty());

        let tmp = tempfile::tempdir().unwrap();
        let ckpts = tmp.path().join("ckpt");
        let mut dirs = BTreeMap::new();
        for (i, step) in [10u64, 20, 30].into_iter().enumerate() {
            let dir = write_checkpoint(&ckpts, step, i as u8);
            store.upload(step, &dir).await.unwrap();
            dirs.insert(step, dir);
        }
        let keys = s3.keys();
        let manifest = "bucket/team/ckpts/runs/run-1/00000000000000000030/MANIFEST.json";
        assert!(keys.iter().any(|k| k == manifest), "{keys:?}");
        let nested = "bucket/team/ckpts/runs/run-1/00000000000000000030/files/opt/state.json";
        assert!(keys.iter().any(|k| k == nested), "{keys:?}");
        assert!(
            s3.next_upload.load(Ordering::SeqCst) >= 3,
            "no multipart upload"
        );
        assert!(s3.uploads.lock().unwrap().is_empty());

        let steps = complete_steps(&store).await;
        assert_eq!(steps, [30, 20, 10]);

        // 30 loses its manifest: not complete, 20 is restored.
        s3.objects.lock().unwrap().remove(manifest);
        let dest = tmp.path().join("restored");
        let (m, path) = store.restore_newest(&dest).await.unwrap().unwrap();
        assert_eq!(m.step, 20);
        assert_eq!(read_tree(&path), read_tree(&dirs[&20]));

        // 20's model is corrupted: 10 is restored.
        let model20 = "bucket/team/ckpts/runs/run-1/00000000000000000020/files/model.bin";
        s3.objects
            .lock()
            .unwrap()
            .insert(model20.into(), Bytes::from(vec![7u8; 10_000]));
        let (m, path) = store.restore_newest(&dest).await.unwrap().unwrap();
        assert_eq!(m.step, 10);
        assert_eq!(read_tree(&path), read_tree(&dirs[&10]));

        // Prune to one: 10 stays (the newest complete), 30 (incomplete, newer) stays.
        store.upload(20, &dirs[&20]).await.unwrap();
        assert_eq!(store.prune(1).await.unwrap(), 1);
        let steps = complete_steps(&store).await;
        assert_eq!(steps, [20]);
        let keys = s3.keys();
        assert!(
            !keys.iter().any(|k| k.contains("/00000000000000000010/")),
            "{keys:?}"
        );
        assert!(
            keys.iter()
                .any(|k| k.contains("/00000000000000000030/files/")),
            "{keys:?}"
        );
    }

    #[tokio::test]
    async fn s3_errors_name_the_object_and_retries_ride_out_a_blip() {
        let (s3, endpoint) = start_mock().await;
        let store = open_s3(&endpoint, "1");
        let tmp = tempfile::tempdir().unwrap();
        let dir = write_checkpoint(&tmp.path().join("ckpt"), 10, 1);

        // Everything fails: the first request (clearing an old manifest of the step) says so.
        s3.fail_next.store(1_000, Ordering::SeqCst);
        let err = store.upload(10, &dir).await.unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, StoreError::Object { .. }), "{message}");
        assert!(
            message.starts_with(
                "delete s3://bucket/team/ckpts/runs/run-1/00000000000000000010/MANIFEST.json failed: "
            ),
            "{message}"
        );
        assert!(message.contains("503"), "{message}");
        assert!(std::error::Error::source(&err).is_some());
        // One attempt: the request and its one retry.
        assert_eq!(s3.requests.load(Ordering::SeqCst), 2);

        // Uploads fail: the error names the file's object.
        *s3.fail_only.lock().unwrap() = Some(Method::PUT);
        let err = store.upload(10, &dir).await.unwrap_err();
        let message = err.to_string();
        let files = "s3://bucket/team/ckpts/runs/run-1/00000000000000000010/files/";
        assert!(
            message.starts_with(&format!("upload {files}model.bin failed: "))
                || message.starts_with(&format!("upload {files}opt/state.json failed: ")),
            "{message}"
        );
        assert!(message.contains("503"), "{message}");
        s3.fail_next.store(0, Ordering::SeqCst);
        *s3.fail_only.lock().unwrap() = None;
        assert!(store.complete().await.unwrap().is_empty());

        // A single 503 is retried by the client.
        s3.fail_next.store(1, Ordering::SeqCst);
        store.upload(10, &dir).await.unwrap();
        let steps = complete_steps(&store).await;
        assert_eq!(steps, [10]);
    }
}
