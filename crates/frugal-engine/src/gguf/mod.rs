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

pub use format::{DEFAULT_ALIGNMENT, GgufError};
use read::parse_layout;
use types::tensor_range;
pub use types::{GgmlType, Tensor, TensorInfo, Value};

mod format;
mod read;
mod types;
pub mod write;

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

/// Test helpers shared by this crate's unit tests: a GGUF writer and the test model.
#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
