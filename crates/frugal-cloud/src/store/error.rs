//! Why a store operation failed.

use std::path::PathBuf;

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
