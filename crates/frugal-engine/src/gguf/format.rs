//! What the GGUF format fixes: its magic, alignment and limits, and the errors of a file
//! that breaks them.

use std::path::PathBuf;

use thiserror::Error;

use super::types::GgmlType;

/// The four bytes every GGUF file starts with.
pub(super) const MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment when the file does not set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions (`GGML_MAX_DIMS`).
pub(super) const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal GGUF but unused in practice; a cap keeps a crafted file from
/// recursing deep enough to overflow the stack.
pub(super) const MAX_ARRAY_DEPTH: usize = 4;
/// Smallest possible encoding of one tensor descriptor (empty name length, n_dims, type,
/// offset): used to bound the up-front allocation for the tensor list.
pub(super) const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8;

/// Everything that can go wrong opening a GGUF file or reading values out of it.
#[derive(Debug, Error)]
pub enum GgufError {
    /// The file could not be read at all.
    #[error("reading {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Any other error, tagged with the file it happened in.
    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<GgufError>,
    },
    #[error("not a GGUF file (starts with {found:02x?}, expected \"GGUF\")")]
    NotGguf { found: Vec<u8> },
    #[error("unsupported GGUF version {version} (supported: 2, 3){hint}")]
    UnsupportedVersion { version: u32, hint: &'static str },
    #[error("truncated: {what} at byte offset {offset} needs {needed} bytes, file has {len}")]
    Truncated {
        what: String,
        offset: usize,
        needed: u64,
        len: usize,
    },
    #[error(
        "{what} at byte offset {offset} claims {claimed} bytes or more, but only {remaining} remain"
    )]
    LengthTooLarge {
        what: String,
        offset: usize,
        claimed: u128,
        remaining: usize,
    },
    #[error("{what} at byte offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: usize },
    #[error("metadata key {key:?} at byte offset {offset}: unknown value type id {type_id}")]
    UnknownValueType {
        key: String,
        offset: usize,
        type_id: u32,
    },
    #[error("metadata key {key:?} at byte offset {offset}: invalid bool byte {byte}")]
    InvalidBool {
        key: String,
        offset: usize,
        byte: u8,
    },
    #[error("metadata key {key:?}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels")]
    ArrayTooDeep { key: String },
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    #[error("general.alignment = {0} is invalid (must be a power of two)")]
    BadAlignment(u64),
    #[error("tensor {tensor:?}: {n_dims} dimensions, ggml supports at most {MAX_DIMS}")]
    TooManyDims { tensor: String, n_dims: u32 },
    #[error("tensor {tensor:?}: unknown ggml type id {id}")]
    UnknownGgmlType { tensor: String, id: u32 },
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    #[error("tensor {tensor:?}: dimensions {dims:?} overflow the element count")]
    DimsOverflow { tensor: String, dims: Vec<u64> },
    #[error(
        "tensor {tensor:?}: row length {ne0} (dims {dims:?}) is not a multiple of the {dtype} block size {block_size}"
    )]
    NotBlockMultiple {
        tensor: String,
        dims: Vec<u64>,
        ne0: u64,
        dtype: GgmlType,
        block_size: usize,
    },
    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("truncated: tensor {tensor} needs bytes {start}..{end}, file has {len}")]
    TensorOutOfBounds {
        tensor: String,
        start: u128,
        end: u128,
        len: usize,
    },
    #[error("no tensor named {0:?}")]
    NoSuchTensor(String),
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("metadata key {key:?}: value {value} does not fit in {target}")]
    OutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },
}

impl GgufError {
    /// The underlying error, looking through the [`GgufError::InFile`] path tag.
    pub fn kind(&self) -> &GgufError {
        match self {
            GgufError::InFile { source, .. } => source.kind(),
            other => other,
        }
    }
}
