//! The checkpoint directories on this machine: those a trainer has published, and the
//! files of one to upload.

use std::path::{Path as FsPath, PathBuf};

use super::error::StoreError;

/// Directories nested deeper than this in a checkpoint are refused (a symlink loop).
const MAX_DEPTH: usize = 64;

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

pub(super) struct LocalFile {
    /// `/`-separated, relative to the checkpoint directory.
    pub(super) rel: String,
    pub(super) path: PathBuf,
}

/// Every regular file under `dir`, sorted by relative path.
pub(super) async fn collect_files(dir: &FsPath) -> Result<Vec<LocalFile>, StoreError> {
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

#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[cfg(test)]
mod tests {
    use super::*;

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
}
