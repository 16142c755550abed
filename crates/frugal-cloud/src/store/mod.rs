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

mod error;
mod local;
mod manifest;
mod open;
mod restore;
#[cfg(test)]
mod s3_tests;

pub use error::StoreError;
pub use local::local_checkpoints;
pub use manifest::{MANIFEST_VERSION, Manifest, ManifestFile};

use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::{StreamExt, TryStreamExt, stream};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use local::{LocalFile, collect_files};
use manifest::{check_manifest, hex};

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

impl CheckpointStore {
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

enum ManifestState {
    Missing,
    Invalid(String),
    Valid(Manifest),
}

/// A step directory name in the store: exactly 20 ASCII digits.
fn parse_step_dir(name: &str) -> Option<u64> {
    if name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()) {
        name.parse().ok()
    } else {
        None
    }
}

#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[cfg(test)]
mod tests {
    use super::*;

    /// Steps of the store's complete checkpoints, newest first.
    pub(super) async fn complete_steps(store: &CheckpointStore) -> Vec<u64> {
        store
            .complete()
            .await
            .unwrap()
            .iter()
            .map(|m| m.step)
            .collect()
    }

    use std::collections::{BTreeMap, BTreeSet};
    use std::path::PathBuf;

    pub(super) const RUN: &str = "run-1";

    /// A checkpoint directory `<root>/<step>` with `model.bin` and `opt/state.json`.
    /// A store in a folder of a fresh temporary directory: the directory, the folder, the store.
    fn local_store() -> (tempfile::TempDir, PathBuf, CheckpointStore) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("store");
        let store = CheckpointStore::open(root.to_str().unwrap(), RUN).unwrap();
        (tmp, root, store)
    }

    pub(super) fn write_checkpoint(root: &FsPath, step: u64, seed: u8) -> PathBuf {
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
    pub(super) fn read_tree(dir: &FsPath) -> BTreeMap<String, Vec<u8>> {
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
        let (tmp, _, store) = local_store();
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
        let (tmp, store_root, store) = local_store();
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
        let (tmp, store_root, store) = local_store();
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
        let (tmp, store_root, store) = local_store();
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
}
