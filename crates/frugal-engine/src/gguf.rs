//! GGUF model files: parsing a GGUF v2/v3 file (header, metadata key/values, tensor
//! descriptors) and handing out each tensor's raw bytes.
//!
//! The whole file is read into memory with `std::fs::read` (no mmap, so no `unsafe` and no
//! surprises when the file changes underneath us). Parsing is defensive: every length and
//! count in the file is checked against the bytes that remain *before* anything is allocated,
//! every tensor's byte range is validated against the file size at open time, and malformed
//! input of any kind yields a [`GgufError`] rather than a panic. Only little-endian files are
//! supported (as written by llama.cpp's converters).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

pub mod write;

/// The four bytes every GGUF file starts with.
const MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment when the file does not set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal GGUF but unused in practice; a cap keeps a crafted file from
/// recursing deep enough to overflow the stack.
const MAX_ARRAY_DEPTH: usize = 4;
/// Smallest possible encoding of one tensor descriptor (empty name length, n_dims, type,
/// offset): used to bound the up-front allocation for the tensor list.
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8;

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

/// A metadata value. GGUF arrays are homogeneous; `Array` does not enforce that, but the
/// parser only ever produces homogeneous ones.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The GGUF type name, for error messages (`"u32"`, `"string"`, `"array of string"`).
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(items) => match items.first() {
                Some(first) => format!("array of {}", first.type_name()),
                None => "empty array".to_owned(),
            },
            other => scalar_type_name(other).to_owned(),
        }
    }

    /// Any integer value, widened; `None` for non-integers.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any float or integer value as `f64`; `None` otherwise.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            // Integers convert exactly up to 2^53, which covers every real hyperparameter.
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }
}

fn scalar_type_name(v: &Value) -> &'static str {
    match v {
        Value::U8(_) => "u8",
        Value::I8(_) => "i8",
        Value::U16(_) => "u16",
        Value::I16(_) => "i16",
        Value::U32(_) => "u32",
        Value::I32(_) => "i32",
        Value::U64(_) => "u64",
        Value::I64(_) => "i64",
        Value::F32(_) => "f32",
        Value::F64(_) => "f64",
        Value::Bool(_) => "bool",
        Value::String(_) => "string",
        Value::Array(_) => "array",
    }
}

/// GGUF metadata value type ids, as written in the file.
mod vtype {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;

    /// Fewest bytes one value of this type can occupy: bounds array allocations.
    pub fn min_size(t: u32) -> Option<usize> {
        Some(match t {
            U8 | I8 | BOOL => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | STRING => 8,
            ARRAY => 12,
            _ => return None,
        })
    }
}

/// ggml tensor element types, with their on-disk type ids.
#[allow(non_camel_case_types)] // the ggml names (Q4_0, Q4_K, ...) are what everyone greps for
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    BF16 = 30,
}

impl GgmlType {
    /// The type for a ggml type id, `None` for ids this reader does not know.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            30 => BF16,
            _ => return None,
        })
    }

    /// The ggml type id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Elements per block (1 for the float types).
    pub fn block_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => 256,
        }
    }

    /// Bytes per block, matching ggml's `block_*` structs.
    pub fn block_bytes(self) -> usize {
        use GgmlType::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            Q4_0 => 2 + 16,                // d: f16, 32 x 4-bit
            Q4_1 => 2 + 2 + 16,            // d, m: f16
            Q5_0 => 2 + 4 + 16,            // d, qh: u32 high bits
            Q5_1 => 2 + 2 + 4 + 16,        // d, m, qh
            Q8_0 => 2 + 32,                // d, 32 x i8
            Q8_1 => 2 + 2 + 32,            // d, s, 32 x i8
            Q2_K => 16 + 64 + 2 + 2,       // scales, qs, d, dmin
            Q3_K => 32 + 64 + 12 + 2,      // hmask, qs, scales, d
            Q4_K => 2 + 2 + 12 + 128,      // d, dmin, scales, qs
            Q5_K => 2 + 2 + 12 + 32 + 128, // d, dmin, scales, qh, qs
            Q6_K => 128 + 64 + 16 + 2,     // ql, qh, scales, d
            Q8_K => 4 + 256 + 16 * 2,      // d: f32, qs, bsums: 16 x i16
        }
    }

    /// ggml's lower-case name (`"q4_1"`).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2_K => "q2_K",
            Q3_K => "q3_K",
            Q4_K => "q4_K",
            Q5_K => "q5_K",
            Q6_K => "q6_K",
            Q8_K => "q8_K",
            BF16 => "bf16",
        }
    }

    /// Bytes needed for `n_elements` elements, `None` if not a whole number of blocks or the
    /// size overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.block_bytes() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor descriptor from the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions as in the file: `ne0` (the contiguous, fastest-varying one) first.
    pub dims: Vec<u64>,
    pub dtype: GgmlType,
    /// Byte offset of the data from the start of the (aligned) tensor data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Total element count. Validated at parse time not to overflow.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Size of the tensor's data in bytes. Validated at parse time.
    pub fn n_bytes(&self) -> u64 {
        self.n_elements() / self.dtype.block_size() as u64 * self.dtype.block_bytes() as u64
    }
}

/// A tensor's descriptor together with its bytes in the file.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    pub name: &'a str,
    pub dims: &'a [u64],
    pub dtype: GgmlType,
    pub data: &'a [u8],
}

impl Tensor<'_> {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file, owning all of its bytes.
pub struct Gguf {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: usize,
    index: HashMap<String, usize>,
    path: Option<PathBuf>,
    bytes: Vec<u8>,
}

impl fmt::Debug for Gguf {
    // Hand-written so that debugging a `Gguf` does not dump the whole file.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("file_bytes", &self.bytes.len())
            .finish()
    }
}

impl Gguf {
    /// Reads and parses the file at `path`. Errors name the file.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf, GgufError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io {
            path: path.to_owned(),
            source,
        })?;
        let mut gguf = Gguf::parse(bytes).map_err(|e| in_file(path, e))?;
        gguf.path = Some(path.to_owned());
        tracing::debug!(
            path = %path.display(),
            version = gguf.version,
            metadata = gguf.metadata.len(),
            tensors = gguf.tensors.len(),
            "opened GGUF"
        );
        Ok(gguf)
    }

    /// Parses a GGUF file held in memory.
    pub fn parse(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        let layout = parse_layout(&bytes)?;
        Ok(Gguf {
            version: layout.version,
            metadata: layout.metadata,
            tensors: layout.tensors,
            alignment: layout.alignment,
            data_offset: layout.data_offset,
            index: layout.index,
            path: None,
            bytes,
        })
    }

    /// The file this was opened from, if it came from [`Gguf::open`].
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Alignment of the tensor data section and of every tensor in it.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset in the file where tensor data starts.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// `general.architecture` (e.g. `"llama"`).
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.str("general.architecture")
    }

    /// The raw metadata value for `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// The descriptor of the tensor called `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// The tensor called `name` with its data, whose length is checked against its shape.
    pub fn tensor(&self, name: &str) -> Result<Tensor<'_>, GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| self.tag(GgufError::NoSuchTensor(name.to_owned())))?;
        let (start, end) = tensor_range(info, self.data_offset);
        let out_of_bounds = || {
            self.tag(GgufError::TensorOutOfBounds {
                tensor: info.name.clone(),
                start,
                end,
                len: self.bytes.len(),
            })
        };
        let s = usize::try_from(start).map_err(|_| out_of_bounds())?;
        let e = usize::try_from(end).map_err(|_| out_of_bounds())?;
        let data = self.bytes.get(s..e).ok_or_else(out_of_bounds)?;
        Ok(Tensor {
            name: &info.name,
            dims: &info.dims,
            dtype: info.dtype,
            data,
        })
    }

    // ---- typed metadata getters -------------------------------------------------------
    //
    // `opt_*` return `Ok(None)` when the key is absent but still fail when it is present
    // with the wrong type: a mistyped key is a broken file, not a missing default.

    pub fn u32(&self, key: &str) -> Result<u32, GgufError> {
        self.required(key, self.opt_u32(key)?)
    }

    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.opt_int(key, "u32")
    }

    pub fn u64(&self, key: &str) -> Result<u64, GgufError> {
        self.required(key, self.opt_u64(key)?)
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.opt_int(key, "u64")
    }

    pub fn i64(&self, key: &str) -> Result<i64, GgufError> {
        self.required(key, self.opt_i64(key)?)
    }

    pub fn opt_i64(&self, key: &str) -> Result<Option<i64>, GgufError> {
        self.opt_int(key, "i64")
    }

    /// A float; integer values are accepted too (some converters write e.g. `rope.freq_base`
    /// as an integer).
    pub fn f32(&self, key: &str) -> Result<f32, GgufError> {
        self.required(key, self.opt_f32(key)?)
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| self.wrong_type(key, "a number", v)),
        }
    }

    pub fn bool(&self, key: &str) -> Result<bool, GgufError> {
        self.required(key, self.opt_bool(key)?)
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "bool", v)),
        }
    }

    pub fn str(&self, key: &str) -> Result<&str, GgufError> {
        self.required(key, self.opt_str(key)?)
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "string", v)),
        }
    }

    pub fn str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.required(key, self.opt_str_array(key)?)
    }

    pub fn opt_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let items = v
            .as_array()
            .ok_or_else(|| self.wrong_type(key, "array of string", v))?;
        items
            .iter()
            .map(|item| {
                item.as_str()
                    .ok_or_else(|| self.wrong_type(key, "array of string", v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// An array of integers that each fit in `i32` (e.g. `tokenizer.ggml.token_type`).
    pub fn i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.required(key, self.opt_i32_array(key)?)
    }

    pub fn opt_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>, GgufError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let items = v
            .as_array()
            .ok_or_else(|| self.wrong_type(key, "array of integers", v))?;
        items
            .iter()
            .map(|item| {
                let n = item
                    .as_i128()
                    .ok_or_else(|| self.wrong_type(key, "array of integers", v))?;
                i32::try_from(n).map_err(|_| {
                    self.tag(GgufError::OutOfRange {
                        key: key.to_owned(),
                        value: n.to_string(),
                        target: "i32",
                    })
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// An array of floats (integers accepted).
    pub fn f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.required(key, self.opt_f32_array(key)?)
    }

    pub fn opt_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>, GgufError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let items = v
            .as_array()
            .ok_or_else(|| self.wrong_type(key, "array of numbers", v))?;
        items
            .iter()
            .map(|item| {
                item.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| self.wrong_type(key, "array of numbers", v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    fn opt_int<T: TryFrom<i128>>(
        &self,
        key: &str,
        target: &'static str,
    ) -> Result<Option<T>, GgufError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let n = v
            .as_i128()
            .ok_or_else(|| self.wrong_type(key, "an integer", v))?;
        T::try_from(n).map(Some).map_err(|_| {
            self.tag(GgufError::OutOfRange {
                key: key.to_owned(),
                value: n.to_string(),
                target,
            })
        })
    }

    fn required<T>(&self, key: &str, v: Option<T>) -> Result<T, GgufError> {
        v.ok_or_else(|| self.tag(GgufError::MissingKey(key.to_owned())))
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &Value) -> GgufError {
        self.tag(GgufError::WrongType {
            key: key.to_owned(),
            expected,
            found: found.type_name(),
        })
    }

    /// Tags an error with this file's path, when there is one.
    fn tag(&self, e: GgufError) -> GgufError {
        match &self.path {
            Some(p) => in_file(p, e),
            None => e,
        }
    }
}

fn in_file(path: &Path, e: GgufError) -> GgufError {
    GgufError::InFile {
        path: path.to_owned(),
        source: Box::new(e),
    }
}

/// Absolute byte range of a tensor's data, in u128 so that no file contents can overflow it.
fn tensor_range(info: &TensorInfo, data_offset: usize) -> (u128, u128) {
    let start = data_offset as u128 + u128::from(info.offset);
    let n_elements: u128 = info.dims.iter().map(|&d| u128::from(d)).product();
    let n_bytes = n_elements / info.dtype.block_size() as u128 * info.dtype.block_bytes() as u128;
    (start, start + n_bytes)
}

/// The header of a GGUF file: everything but the bytes themselves.
struct Layout {
    version: u32,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: usize,
    index: HashMap<String, usize>,
}

/// A read that ran off the end of the input; the caller adds what was being read.
#[derive(Clone, Copy)]
struct Short {
    offset: usize,
    needed: u64,
    len: usize,
}

impl Short {
    fn what(self, what: impl Into<String>) -> GgufError {
        GgufError::Truncated {
            what: what.into(),
            offset: self.offset,
            needed: self.needed,
            len: self.len,
        }
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Short> {
        let short = Short {
            offset: self.pos,
            needed: n as u64,
            len: self.buf.len(),
        };
        let end = self.pos.checked_add(n).ok_or(short)?;
        let s = self.buf.get(self.pos..end).ok_or(short)?;
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Short> {
        let s = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, Short> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, Short> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, Short> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A GGUF string (u64 length + UTF-8 bytes). The length is checked against the remaining
    /// input before anything is allocated.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.pos;
        let len = self
            .u64()
            .map_err(|s| s.what(format!("length of {}", what())))?;
        if len > self.remaining() as u64 {
            return Err(GgufError::LengthTooLarge {
                what: what(),
                offset: at,
                claimed: len.into(),
                remaining: self.remaining(),
            });
        }
        let start = self.pos;
        let bytes = self.take(len as usize).map_err(|s| s.what(what()))?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset: start,
            }),
        }
    }
}

fn parse_layout(buf: &[u8]) -> Result<Layout, GgufError> {
    if buf.get(..4) != Some(&MAGIC[..]) {
        return Err(GgufError::NotGguf {
            found: buf.iter().take(4).copied().collect(),
        });
    }
    let mut c = Cursor { buf, pos: 4 };
    let version = c.u32().map_err(|s| s.what("version"))?;
    if version != 2 && version != 3 {
        let swapped = version.swap_bytes();
        return Err(GgufError::UnsupportedVersion {
            version,
            hint: if swapped == 2 || swapped == 3 {
                " (this looks like a big-endian file, which is not supported)"
            } else {
                ""
            },
        });
    }
    let n_tensors = c.u64().map_err(|s| s.what("tensor count"))?;
    let n_kv = c.u64().map_err(|s| s.what("metadata count"))?;

    // No up-front reservation from n_kv: each entry consumes at least 13 bytes, so a bogus
    // count just runs into the end of the input.
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let type_at = c.pos;
        let type_id = c
            .u32()
            .map_err(|s| s.what(format!("value type of metadata key {key:?}")))?;
        let value = read_value(&mut c, &key, type_id, type_at, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(GgufError::DuplicateKey(key));
        }
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let a = v.as_i128().ok_or_else(|| GgufError::WrongType {
                key: "general.alignment".to_owned(),
                expected: "an integer",
                found: v.type_name(),
            })?;
            let a = u64::try_from(a).map_err(|_| GgufError::OutOfRange {
                key: "general.alignment".to_owned(),
                value: a.to_string(),
                target: "u64",
            })?;
            if !a.is_power_of_two() {
                return Err(GgufError::BadAlignment(a));
            }
            a
        }
    };

    let cap = usize::try_from(n_tensors)
        .unwrap_or(usize::MAX)
        .min(c.remaining() / MIN_TENSOR_INFO_BYTES);
    let mut tensors = Vec::with_capacity(cap);
    let mut index = HashMap::with_capacity(cap);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        let n_dims = c
            .u32()
            .map_err(|s| s.what(format!("dimension count of tensor {name:?}")))?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name,
                n_dims,
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(
                c.u64()
                    .map_err(|s| s.what(format!("dimensions of tensor {name:?}")))?,
            );
        }
        let type_id = c
            .u32()
            .map_err(|s| s.what(format!("type of tensor {name:?}")))?;
        let offset = c
            .u64()
            .map_err(|s| s.what(format!("data offset of tensor {name:?}")))?;
        let dtype = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownGgmlType {
            tensor: name.clone(),
            id: type_id,
        })?;
        if index.insert(name.clone(), tensors.len()).is_some() {
            return Err(GgufError::DuplicateTensor(name));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            dtype,
            offset,
        });
    }

    // The data section starts at the next multiple of the alignment after the header.
    let align = usize::try_from(alignment).unwrap_or(usize::MAX);
    let data_offset = c.pos.div_ceil(align).saturating_mul(align);

    for t in &tensors {
        validate_tensor(t, alignment, data_offset, buf.len())?;
    }

    Ok(Layout {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
        index,
    })
}

fn validate_tensor(
    t: &TensorInfo,
    alignment: u64,
    data_offset: usize,
    file_len: usize,
) -> Result<(), GgufError> {
    let n_elements = t
        .dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| GgufError::DimsOverflow {
            tensor: t.name.clone(),
            dims: t.dims.clone(),
        })?;
    // ggml quantizes row by row, so it is the row length that must be whole blocks.
    let ne0 = t.dims.first().copied().unwrap_or(1);
    let block_size = t.dtype.block_size();
    if !ne0.is_multiple_of(block_size as u64) {
        return Err(GgufError::NotBlockMultiple {
            tensor: t.name.clone(),
            dims: t.dims.clone(),
            ne0,
            dtype: t.dtype,
            block_size,
        });
    }
    if t.dtype.bytes_for(n_elements).is_none() {
        return Err(GgufError::DimsOverflow {
            tensor: t.name.clone(),
            dims: t.dims.clone(),
        });
    }
    if !t.offset.is_multiple_of(alignment) {
        return Err(GgufError::MisalignedTensor {
            tensor: t.name.clone(),
            offset: t.offset,
            alignment,
        });
    }
    let (start, end) = tensor_range(t, data_offset);
    if end > file_len as u128 {
        return Err(GgufError::TensorOutOfBounds {
            tensor: t.name.clone(),
            start,
            end,
            len: file_len,
        });
    }
    Ok(())
}

fn read_value(
    c: &mut Cursor<'_>,
    key: &str,
    type_id: u32,
    type_at: usize,
    depth: usize,
) -> Result<Value, GgufError> {
    let short = |s: Short| s.what(format!("value of metadata key {key:?}"));
    Ok(match type_id {
        vtype::U8 => Value::U8(c.u8().map_err(short)?),
        vtype::I8 => Value::I8(i8::from_le_bytes(c.array().map_err(short)?)),
        vtype::U16 => Value::U16(u16::from_le_bytes(c.array().map_err(short)?)),
        vtype::I16 => Value::I16(i16::from_le_bytes(c.array().map_err(short)?)),
        vtype::U32 => Value::U32(c.u32().map_err(short)?),
        vtype::I32 => Value::I32(i32::from_le_bytes(c.array().map_err(short)?)),
        vtype::F32 => Value::F32(f32::from_le_bytes(c.array().map_err(short)?)),
        vtype::U64 => Value::U64(c.u64().map_err(short)?),
        vtype::I64 => Value::I64(i64::from_le_bytes(c.array().map_err(short)?)),
        vtype::F64 => Value::F64(f64::from_le_bytes(c.array().map_err(short)?)),
        vtype::BOOL => {
            let at = c.pos;
            match c.u8().map_err(short)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                byte => {
                    return Err(GgufError::InvalidBool {
                        key: key.to_owned(),
                        offset: at,
                        byte,
                    });
                }
            }
        }
        vtype::STRING => Value::String(c.string(&|| format!("value of metadata key {key:?}"))?),
        vtype::ARRAY => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::ArrayTooDeep {
                    key: key.to_owned(),
                });
            }
            let elem_at = c.pos;
            let elem_type = c
                .u32()
                .map_err(|s| s.what(format!("array element type of metadata key {key:?}")))?;
            let min = vtype::min_size(elem_type).ok_or_else(|| GgufError::UnknownValueType {
                key: key.to_owned(),
                offset: elem_at,
                type_id: elem_type,
            })?;
            let count_at = c.pos;
            let count = c
                .u64()
                .map_err(|s| s.what(format!("array length of metadata key {key:?}")))?;
            let claimed = u128::from(count) * min as u128;
            if claimed > c.remaining() as u128 {
                return Err(GgufError::LengthTooLarge {
                    what: format!("array of {count} elements for metadata key {key:?}"),
                    offset: count_at,
                    claimed,
                    remaining: c.remaining(),
                });
            }
            // `count` is now bounded by the remaining input, so this allocation is too.
            let mut items = Vec::with_capacity(count as usize);
            for _ in 0..count {
                items.push(read_value(c, key, elem_type, elem_at, depth + 1)?);
            }
            Value::Array(items)
        }
        other => {
            return Err(GgufError::UnknownValueType {
                key: key.to_owned(),
                offset: type_at,
                type_id: other,
            });
        }
    })
}

/// Test helpers shared by this crate's unit tests: a GGUF writer and the test model.
#[cfg(test)]
pub(crate) mod testutil {
    use super::write::{put_str, put_value, type_id};
    use super::*;
    use std::sync::OnceLock;

    /// Where the SmolLM2 test model lives: `FRUGAL_TEST_MODEL` or the repository's models/.
    pub(crate) fn test_model_path() -> PathBuf {
        frugal_testkit::test_model(crate::DEFAULT_MODEL)
    }

    /// The test model, opened once per test binary. Fails (never skips) when it is missing:
    /// CI fetches the models before testing.
    pub(crate) fn test_model() -> &'static Gguf {
        static MODEL: OnceLock<Gguf> = OnceLock::new();
        MODEL.get_or_init(|| open_test_model(&test_model_path()))
    }

    /// The qwen2 model of the larger tier, opened once, as [`test_model`].
    pub(crate) fn large_test_model() -> &'static Gguf {
        static MODEL: OnceLock<Gguf> = OnceLock::new();
        MODEL.get_or_init(|| open_test_model(&frugal_testkit::model(crate::LARGE_MODEL)))
    }

    fn open_test_model(path: &Path) -> Gguf {
        Gguf::open(path).unwrap_or_else(|e| panic!("opening test model: {e}"))
    }

    /// Builds small GGUF files in memory.
    pub(crate) struct GgufBuilder {
        pub version: u32,
        pub alignment: u64,
        kvs: Vec<(String, Value)>,
        tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    }

    impl GgufBuilder {
        pub(crate) fn new() -> Self {
            GgufBuilder {
                version: 3,
                alignment: DEFAULT_ALIGNMENT,
                kvs: Vec::new(),
                tensors: Vec::new(),
            }
        }

        pub(crate) fn kv(mut self, key: &str, v: Value) -> Self {
            if key == "general.alignment"
                && let Some(a) = v.as_i128()
            {
                self.alignment = a as u64;
            }
            self.kvs.push((key.to_owned(), v));
            self
        }

        pub(crate) fn tensor(
            mut self,
            name: &str,
            dims: &[u64],
            type_id: u32,
            data: Vec<u8>,
        ) -> Self {
            self.tensors
                .push((name.to_owned(), dims.to_vec(), type_id, data));
            self
        }

        pub(crate) fn build(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&MAGIC);
            out.extend_from_slice(&self.version.to_le_bytes());
            out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
            out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
            for (k, v) in &self.kvs {
                put_str(&mut out, k);
                out.extend_from_slice(&type_id(v).to_le_bytes());
                put_value(&mut out, v);
            }
            let mut offset = 0u64;
            let mut offsets = Vec::new();
            for (name, dims, ty, data) in &self.tensors {
                put_str(&mut out, name);
                out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
                for d in dims {
                    out.extend_from_slice(&d.to_le_bytes());
                }
                out.extend_from_slice(&ty.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                offsets.push(offset);
                offset = (offset + data.len() as u64).div_ceil(self.alignment) * self.alignment;
            }
            let pad = |out: &mut Vec<u8>| {
                while !(out.len() as u64).is_multiple_of(self.alignment) {
                    out.push(0);
                }
            };
            if !self.tensors.is_empty() {
                pad(&mut out);
            }
            let base = out.len();
            for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
                out.resize(base + off as usize, 0);
                out.extend_from_slice(data);
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;

    /// splitmix64: a tiny seeded generator so the corruption test is reproducible.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn real_model_header() {
        let g = test_model();
        assert_eq!(g.version, 3);
        assert_eq!(g.metadata.len(), 33);
        assert_eq!(g.tensors.len(), 272);
        assert_eq!(g.architecture().unwrap(), "llama");
        assert_eq!(g.str("tokenizer.ggml.model").unwrap(), "gpt2");
        assert_eq!(g.str("tokenizer.ggml.pre").unwrap(), "smollm");
        assert_eq!(g.str_array("tokenizer.ggml.tokens").unwrap().len(), 49152);
        let types = g.i32_array("tokenizer.ggml.token_type").unwrap();
        assert_eq!(types.len(), 49152);
        assert!(types.contains(&3));
        let merges = g.str_array("tokenizer.ggml.merges").unwrap();
        assert_eq!(merges.len(), 48900);
        assert!(merges.iter().all(|m| m.split(' ').count() == 2));
        assert_eq!(g.u32("tokenizer.ggml.bos_token_id").unwrap(), 1);
        assert_eq!(g.u32("tokenizer.ggml.eos_token_id").unwrap(), 2);
        assert_eq!(g.u32("tokenizer.ggml.unknown_token_id").unwrap(), 0);
        assert_eq!(g.u32("tokenizer.ggml.padding_token_id").unwrap(), 2);
        assert!(!g.bool("tokenizer.ggml.add_bos_token").unwrap());
        assert!(
            g.str("tokenizer.chat_template")
                .unwrap()
                .contains("<|im_start|>")
        );
        assert_eq!(g.alignment(), 32);
        assert_eq!(g.data_offset() % 32, 0);
        assert!(g.path().is_some());

        let mut seen = std::collections::BTreeSet::new();
        for info in &g.tensors {
            seen.insert(info.dtype);
            let t = g.tensor(&info.name).unwrap();
            assert_eq!(t.data.len() as u64, info.n_bytes(), "{}", info.name);
            assert_eq!(t.dims, &info.dims[..]);
        }
        let seen: Vec<_> = seen.into_iter().collect();
        assert_eq!(seen, [GgmlType::F32, GgmlType::Q4_1, GgmlType::Q8_0]);
        // The last tensor ends within the file, no earlier than the last alignment boundary.
        let end = g
            .tensors
            .iter()
            .map(|t| g.data_offset() as u64 + t.offset + t.n_bytes())
            .max()
            .unwrap();
        assert!(end <= g.bytes().len() as u64);
        assert!(g.bytes().len() as u64 - end < 32);
    }

    #[test]
    fn real_model_tensor_shapes() {
        let g = test_model();
        let n_embd = g.u32("llama.embedding_length").unwrap() as u64;
        let n_vocab = 49152;
        let emb = g.tensor("token_embd.weight").unwrap();
        assert_eq!(emb.dims, &[n_embd, n_vocab]);
        let norm = g.tensor("output_norm.weight").unwrap();
        assert_eq!(norm.dtype, GgmlType::F32);
        assert_eq!(norm.dims, &[n_embd]);
        assert_eq!(norm.data.len() as u64, n_embd * 4);
        assert_eq!(g.u32("llama.block_count").unwrap(), 30);
        assert!(g.f32("llama.rope.freq_base").unwrap() > 0.0);
        assert!(g.f32("llama.attention.layer_norm_rms_epsilon").unwrap() > 0.0);
    }

    #[test]
    fn getter_errors_name_key_and_type() {
        let g = test_model();
        let e = g.u32("no.such.key").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("no.such.key") && msg.contains("missing"),
            "{msg}"
        );
        assert!(msg.contains("SmolLM2"), "path missing from {msg}");
        assert!(matches!(e.kind(), GgufError::MissingKey(_)));
        let msg = g.u32("general.architecture").unwrap_err().to_string();
        assert!(
            msg.contains("general.architecture") && msg.contains("string"),
            "{msg}"
        );
        let msg = g.str("llama.block_count").unwrap_err().to_string();
        assert!(msg.contains("expected string"), "{msg}");
        let msg = g
            .str_array("tokenizer.ggml.token_type")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("array of string") && msg.contains("array of i32"),
            "{msg}"
        );
        assert_eq!(g.opt_u32("no.such.key").unwrap(), None);
        assert!(g.opt_u32("general.architecture").is_err());
        let msg = g.tensor("nope.weight").unwrap_err().to_string();
        assert!(msg.contains("nope.weight"), "{msg}");
    }

    #[test]
    fn truncated_copies_error_without_panicking() {
        let g = test_model();
        let bytes = g.bytes();
        let len = bytes.len();
        let data = g.data_offset();
        let mut cuts = vec![0, 1, 3, 4, 7, 8, 12, 16, 20, 24, 30, 40, 100, 1000];
        // Inside the metadata (the vocabulary array is large), the tensor infos and the data.
        cuts.extend([50_000, 300_000, 700_000]);
        cuts.extend([
            data - 5000,
            data - 1000,
            data - 100,
            data - 1,
            data,
            data + 1,
        ]);
        cuts.extend([data + 1_000_000, len / 2, len - 1000, len - 1]);
        assert!(cuts.len() >= 20);
        for cut in cuts {
            let e = Gguf::parse(bytes[..cut].to_vec())
                .err()
                .unwrap_or_else(|| panic!("cut at {cut} parsed"));
            let msg = e.to_string();
            assert!(
                msg.contains("truncated") || msg.contains("not a GGUF") || msg.contains("claims"),
                "cut at {cut}: {msg}"
            );
        }
        // A cut in the data names the tensor and the byte range it needed.
        let msg = Gguf::parse(bytes[..len - 1].to_vec())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("truncated: tensor ") && msg.contains(&format!("file has {}", len - 1)),
            "{msg}"
        );
    }

    #[test]
    fn corrupted_header_never_panics() {
        let g = test_model();
        // Only the header region matters here, and the data is validated by offset arithmetic
        // alone, so parse a copy of header + a bit of data in place instead of cloning 100 MB
        // per iteration.
        let region = g.bytes().len().min(1 << 20).max(g.data_offset() + 4096);
        let mut buf = g.bytes().to_vec();
        let mut rng = Rng(0x5eed);
        let (mut ok, mut err) = (0, 0);
        for _ in 0..400 {
            let n = 1 + rng.below(4);
            let mut saved = Vec::new();
            for _ in 0..n {
                // Bias half the flips to the first 4 KiB, where the counts and lengths live.
                let span = if rng.below(2) == 0 { 4096 } else { region };
                let pos = rng.below(span.min(buf.len()));
                saved.push((pos, buf[pos]));
                buf[pos] ^= 1 << rng.below(8);
                if rng.below(4) == 0 {
                    buf[pos] = rng.next() as u8;
                }
            }
            match parse_layout(&buf) {
                Ok(_) => ok += 1,
                Err(e) => {
                    let _ = e.to_string();
                    err += 1;
                }
            }
            for (pos, b) in saved.into_iter().rev() {
                buf[pos] = b;
            }
        }
        assert!(err > 0, "no corruption was detected (ok={ok})");
        assert!(parse_layout(&buf).is_ok());
    }

    #[test]
    fn bad_magic_and_version() {
        let e = Gguf::parse(b"GGML\x03\0\0\0".to_vec()).unwrap_err();
        assert!(e.to_string().contains("not a GGUF file"), "{e}");
        let e = Gguf::parse(Vec::new()).unwrap_err();
        assert!(e.to_string().contains("not a GGUF file"), "{e}");
        let mut b = GgufBuilder::new();
        b.version = 1;
        let e = Gguf::parse(b.build()).unwrap_err();
        assert!(e.to_string().contains("unsupported GGUF version 1"), "{e}");
        let mut bytes = GgufBuilder::new().build();
        bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
        let e = Gguf::parse(bytes).unwrap_err();
        assert!(e.to_string().contains("big-endian"), "{e}");
        // Opening a non-GGUF file names it.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.bin");
        std::fs::write(&p, b"hello world").unwrap();
        let e = Gguf::open(&p).unwrap_err();
        assert!(
            e.to_string().contains("model.bin") && e.to_string().contains("not a GGUF"),
            "{e}"
        );
        let e = Gguf::open(dir.path().join("missing.gguf")).unwrap_err();
        assert!(matches!(e, GgufError::Io { .. }) && e.to_string().contains("missing.gguf"));
    }

    #[test]
    fn handbuilt_roundtrips_every_value_type() {
        let kvs = vec![
            ("t.u8", Value::U8(200)),
            ("t.i8", Value::I8(-100)),
            ("t.u16", Value::U16(60_000)),
            ("t.i16", Value::I16(-30_000)),
            ("t.u32", Value::U32(4_000_000_000)),
            ("t.i32", Value::I32(-2_000_000_000)),
            ("t.u64", Value::U64(u64::MAX)),
            ("t.i64", Value::I64(i64::MIN)),
            ("t.f32", Value::F32(1.5)),
            ("t.f64", Value::F64(-2.25e300)),
            ("t.bool", Value::Bool(true)),
            ("t.string", Value::String("héllo 🙂".to_owned())),
            (
                "t.strs",
                Value::Array(vec![Value::String("a".into()), Value::String("".into())]),
            ),
            ("t.ints", Value::Array(vec![Value::I32(1), Value::I32(-3)])),
            ("t.u8s", Value::Array(vec![Value::U8(1), Value::U8(3)])),
            ("t.empty", Value::Array(vec![])),
            (
                "t.nested",
                Value::Array(vec![
                    Value::Array(vec![Value::F32(0.5)]),
                    Value::Array(vec![]),
                ]),
            ),
        ];
        let mut b = GgufBuilder::new();
        for (k, v) in &kvs {
            b = b.kv(k, v.clone());
        }
        let data: Vec<u8> = (0..16)
            .flat_map(|i: u32| (i as f32).to_le_bytes())
            .collect();
        let q8: Vec<u8> = vec![7; 34 * 2];
        b = b
            .tensor("a", &[4, 4], 0, data.clone())
            .tensor("b", &[64], 8, q8.clone());
        let g = Gguf::parse(b.build()).unwrap();
        assert_eq!(g.metadata.len(), kvs.len());
        for (k, v) in &kvs {
            assert_eq!(g.get(k), Some(v), "{k}");
        }
        assert_eq!(g.u32("t.u8").unwrap(), 200);
        assert_eq!(g.u32("t.u16").unwrap(), 60_000);
        assert_eq!(g.i64("t.i8").unwrap(), -100);
        assert!(
            g.u32("t.i8")
                .unwrap_err()
                .to_string()
                .contains("does not fit in u32")
        );
        assert!(g.u32("t.u64").is_err());
        assert_eq!(g.u64("t.u64").unwrap(), u64::MAX);
        assert_eq!(g.f32("t.f32").unwrap(), 1.5);
        assert_eq!(g.f32("t.u8").unwrap(), 200.0);
        assert!(g.bool("t.bool").unwrap());
        assert_eq!(g.str("t.string").unwrap(), "héllo 🙂");
        assert_eq!(g.str_array("t.strs").unwrap(), ["a", ""]);
        assert_eq!(g.i32_array("t.ints").unwrap(), [1, -3]);
        assert_eq!(g.i32_array("t.u8s").unwrap(), [1, 3]);
        assert_eq!(g.str_array("t.empty").unwrap(), Vec::<&str>::new());
        assert_eq!(g.opt_str("t.absent").unwrap(), None);

        let a = g.tensor("a").unwrap();
        assert_eq!(
            (a.dims, a.dtype, a.data),
            (&[4u64, 4][..], GgmlType::F32, &data[..])
        );
        assert_eq!(a.n_elements(), 16);
        let t = g.tensor("b").unwrap();
        assert_eq!((t.dtype, t.data), (GgmlType::Q8_0, &q8[..]));
        assert_eq!(g.tensor_info("b").unwrap().offset, 64);
        assert_eq!(g.data_offset() % 32, 0);
    }

    #[test]
    fn custom_alignment() {
        let b = GgufBuilder::new()
            .kv("general.alignment", Value::U32(64))
            .tensor("x", &[3], 0, vec![1; 12])
            .tensor("y", &[2], 1, vec![2; 4]);
        let g = Gguf::parse(b.build()).unwrap();
        assert_eq!(g.alignment(), 64);
        assert_eq!(g.data_offset() % 64, 0);
        assert_eq!(g.tensor_info("y").unwrap().offset, 64);
        assert_eq!(g.tensor("y").unwrap().data, &[2; 4]);
        let b = GgufBuilder::new().kv("general.alignment", Value::U32(48));
        assert!(matches!(
            Gguf::parse(b.build()),
            Err(GgufError::BadAlignment(48))
        ));
    }

    #[test]
    fn malformed_tensors_are_errors() {
        let f32s = |n: usize| vec![0u8; n * 4];
        let err = |b: GgufBuilder| Gguf::parse(b.build()).unwrap_err().to_string();

        let msg = err(GgufBuilder::new().tensor("w", &[8], 77, f32s(8)));
        assert!(
            msg.contains("unknown ggml type id 77") && msg.contains("\"w\""),
            "{msg}"
        );
        let msg =
            err(GgufBuilder::new()
                .tensor("w", &[2], 0, f32s(2))
                .tensor("w", &[2], 0, f32s(2)));
        assert!(msg.contains("duplicate tensor name \"w\""), "{msg}");
        let msg = err(GgufBuilder::new().tensor("q", &[48, 2], 3, vec![0; 20 * 3]));
        assert!(
            msg.contains("not a multiple") && msg.contains("q4_1"),
            "{msg}"
        );
        let msg = err(GgufBuilder::new().tensor("big", &[8], 0, f32s(4)));
        assert!(msg.contains("truncated: tensor big needs bytes"), "{msg}");
        let msg = err(GgufBuilder::new().tensor("o", &[u64::MAX, 4], 0, vec![]));
        assert!(msg.contains("overflow"), "{msg}");
        let msg = err(GgufBuilder::new().tensor("d", &[1, 1, 1, 1, 1], 0, f32s(1)));
        assert!(msg.contains("5 dimensions"), "{msg}");
        // Absurd counts are errors before any allocation.
        let mut bytes = GgufBuilder::new()
            .kv("k", Value::Array(vec![Value::U64(1)]))
            .build();
        let count_at = bytes.len() - 16;
        bytes[count_at..count_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let msg = Gguf::parse(bytes).unwrap_err().to_string();
        assert!(msg.contains("claims") && msg.contains("\"k\""), "{msg}");
        let mut bytes = GgufBuilder::new()
            .kv("k", Value::String("abc".into()))
            .build();
        let len_at = bytes.len() - 11;
        bytes[len_at..len_at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        let msg = Gguf::parse(bytes).unwrap_err().to_string();
        assert!(
            msg.contains("claims") && msg.contains("byte offset"),
            "{msg}"
        );
        let mut bytes = GgufBuilder::new().build();
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(
            Gguf::parse(bytes)
                .unwrap_err()
                .to_string()
                .contains("truncated")
        );
        let msg = err(GgufBuilder::new()
            .kv("k", Value::U8(1))
            .kv("k", Value::U8(2)));
        assert!(msg.contains("duplicate metadata key"), "{msg}");
    }
}
