//! `MANIFEST.json`: what makes a checkpoint complete, and what a restore checks it against.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

/// The manifest format this module writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

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

/// Checks what a restore relies on: the manifest is for this run and step, and every path is
/// relative, plain and distinct, with no file where another needs a directory.
pub(super) fn check_manifest(manifest: &Manifest, run_id: &str, step: u64) -> Result<(), String> {
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

/// Lowercase hex, as the manifest writes a SHA-256.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}
