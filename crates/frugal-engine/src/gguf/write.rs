//! Writing GGUF v3 files, streamed tensor by tensor.
//!
//! [`GgufWriter::create`] writes the header (metadata and every tensor descriptor, with
//! offsets computed from the shapes up front) into a temporary file beside the output;
//! [`GgufWriter::write_tensor`] appends each tensor's bytes in descriptor order, padded to the
//! alignment; [`GgufWriter::finish`] syncs and renames the file into place. Until then the
//! output path is untouched, and a writer dropped early (an error, a panic) removes its
//! temporary file, so a failure never leaves a partial output behind.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::format::{DEFAULT_ALIGNMENT, MAGIC};
use super::types::{GgmlType, Value, vtype};

/// What can go wrong writing a GGUF file.
#[derive(Debug, Error)]
pub enum WriteError {
    /// Creating, writing, syncing or renaming the file failed (a full disk lands here).
    #[error("writing {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("general.alignment {0} is not a power of two")]
    BadAlignment(u64),
    #[error("tensor {tensor:?}: {dims:?} is not a whole number of {dtype} blocks")]
    Shape {
        tensor: String,
        dims: Vec<u64>,
        dtype: GgmlType,
    },
    #[error("tensor {tensor:?}: expected {expected} bytes of data, got {got}")]
    DataLength {
        tensor: String,
        expected: u64,
        got: usize,
    },
    #[error("{written} of {total} tensors written when the file was finished")]
    Incomplete { written: usize, total: usize },
    #[error("all {0} tensors are already written")]
    TooManyTensors(usize),
}

/// One tensor as the writer lays it out: the name, shape (`ne0` first) and type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub dtype: GgmlType,
}

impl TensorSpec {
    /// Bytes of this tensor's data, `None` when the shape is not whole blocks or overflows.
    pub fn n_bytes(&self) -> Option<u64> {
        let ne0 = self.dims.first().copied().unwrap_or(1);
        if !ne0.is_multiple_of(self.dtype.block_size() as u64) {
            return None;
        }
        let n = self
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        self.dtype.bytes_for(n)
    }
}

/// A GGUF file being written; see the module docs.
pub struct GgufWriter {
    path: PathBuf,
    tmp: PathBuf,
    /// `None` once finished (the temporary file has become `path`).
    file: Option<BufWriter<File>>,
    sizes: Vec<(String, u64)>,
    next: usize,
    alignment: u64,
    written: u64,
}

impl GgufWriter {
    /// Starts `path`: writes the header of `metadata` (in the order given; a
    /// `general.alignment` key sets the alignment, else 32) and `tensors` to a temporary file
    /// in the same directory.
    pub fn create(
        path: &Path,
        metadata: &[(String, Value)],
        tensors: &[TensorSpec],
    ) -> Result<GgufWriter, WriteError> {
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, v)) => {
                let a = v.as_i128().and_then(|a| u64::try_from(a).ok()).unwrap_or(0);
                if !a.is_power_of_two() {
                    return Err(WriteError::BadAlignment(a));
                }
                a
            }
            None => DEFAULT_ALIGNMENT,
        };
        let mut sizes = Vec::with_capacity(tensors.len());
        for t in tensors {
            let n = t.n_bytes().ok_or_else(|| WriteError::Shape {
                tensor: t.name.clone(),
                dims: t.dims.clone(),
                dtype: t.dtype,
            })?;
            sizes.push((t.name.clone(), n));
        }

        let mut header = Vec::new();
        header.extend_from_slice(&MAGIC);
        header.extend_from_slice(&3u32.to_le_bytes());
        header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (key, value) in metadata {
            put_str(&mut header, key);
            header.extend_from_slice(&type_id(value).to_le_bytes());
            put_value(&mut header, value);
        }
        let mut offset = 0u64;
        for (t, &(_, n)) in tensors.iter().zip(&sizes) {
            put_str(&mut header, &t.name);
            header.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                header.extend_from_slice(&d.to_le_bytes());
            }
            header.extend_from_slice(&t.dtype.id().to_le_bytes());
            header.extend_from_slice(&offset.to_le_bytes());
            offset = offset.saturating_add(n).next_multiple_of(alignment);
        }
        let pad = (header.len() as u64).next_multiple_of(alignment) - header.len() as u64;
        header.resize(header.len() + pad as usize, 0);

        let tmp = temp_path(path);
        let io = |source| WriteError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io)?;
        // From here on, dropping `writer` removes the temporary file.
        let mut writer = GgufWriter {
            path: path.to_owned(),
            tmp,
            file: Some(BufWriter::with_capacity(1 << 20, file)),
            sizes,
            next: 0,
            alignment,
            written: 0,
        };
        writer.put(&header)?;
        Ok(writer)
    }

    /// Appends the data of the next tensor in descriptor order, then pads to the alignment.
    pub fn write_tensor(&mut self, data: &[u8]) -> Result<(), WriteError> {
        let Some((name, expected)) = self.sizes.get(self.next) else {
            return Err(WriteError::TooManyTensors(self.sizes.len()));
        };
        if *expected != data.len() as u64 {
            return Err(WriteError::DataLength {
                tensor: name.clone(),
                expected: *expected,
                got: data.len(),
            });
        }
        self.next += 1;
        self.put(data)?;
        let pad = self.written.next_multiple_of(self.alignment) - self.written;
        self.put(&vec![0u8; pad as usize])
    }

    /// Completes the file: every tensor must have been written. Returns its size in bytes.
    pub fn finish(mut self) -> Result<u64, WriteError> {
        if self.next != self.sizes.len() {
            return Err(WriteError::Incomplete {
                written: self.next,
                total: self.sizes.len(),
            });
        }
        let io = |source| WriteError::Io {
            path: self.path.clone(),
            source,
        };
        if let Some(w) = self.file.take() {
            let file = w.into_inner().map_err(|e| io(e.into_error()))?;
            file.sync_all().map_err(io)?;
        }
        if let Err(e) = std::fs::rename(&self.tmp, &self.path) {
            // Still ours to clean up; `Drop` only does so while `file` is held.
            let _ = std::fs::remove_file(&self.tmp);
            return Err(io(e));
        }
        Ok(self.written)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        if let Some(w) = self.file.as_mut() {
            w.write_all(bytes).map_err(|source| WriteError::Io {
                path: self.path.clone(),
                source,
            })?;
        }
        self.written += bytes.len() as u64;
        Ok(())
    }
}

impl Drop for GgufWriter {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            // Best effort: the error that got us here is the one worth reporting.
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// `.NAME.tmp-PID` beside `path`: same directory, so the final rename cannot cross devices.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "out.gguf".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

pub(crate) fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => vtype::U8,
        Value::I8(_) => vtype::I8,
        Value::U16(_) => vtype::U16,
        Value::I16(_) => vtype::I16,
        Value::U32(_) => vtype::U32,
        Value::I32(_) => vtype::I32,
        Value::U64(_) => vtype::U64,
        Value::I64(_) => vtype::I64,
        Value::F32(_) => vtype::F32,
        Value::F64(_) => vtype::F64,
        Value::Bool(_) => vtype::BOOL,
        Value::String(_) => vtype::STRING,
        Value::Array(_) => vtype::ARRAY,
    }
}

pub(crate) fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            // The reader keeps no element type for an empty array; u8 is as good as any, as
            // an empty array has no values to misread.
            let elem = items.first().map_or(vtype::U8, type_id);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Gguf;
    use super::*;

    fn meta() -> Vec<(String, Value)> {
        vec![
            ("general.architecture".into(), Value::String("llama".into())),
            ("general.alignment".into(), Value::U32(64)),
            ("llama.block_count".into(), Value::U32(2)),
            ("x.f".into(), Value::F64(0.5)),
            ("x.b".into(), Value::Bool(true)),
            ("x.i8".into(), Value::I8(-3)),
            (
                "tokenizer.ggml.tokens".into(),
                Value::Array(vec![Value::String("a".into()), Value::String("é".into())]),
            ),
            (
                "x.nested".into(),
                Value::Array(vec![Value::Array(vec![Value::I32(1), Value::I32(-2)])]),
            ),
        ]
    }

    fn specs() -> Vec<TensorSpec> {
        vec![
            TensorSpec {
                name: "norm".into(),
                dims: vec![5],
                dtype: GgmlType::F32,
            },
            TensorSpec {
                name: "w".into(),
                dims: vec![64, 3],
                dtype: GgmlType::Q8_0,
            },
            TensorSpec {
                name: "k".into(),
                dims: vec![256, 2],
                dtype: GgmlType::Q4_K,
            },
        ]
    }

    fn data(t: &TensorSpec, seed: u8) -> Vec<u8> {
        let n = t.n_bytes().unwrap() as usize;
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    #[test]
    fn round_trip_through_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.gguf");
        let specs = specs();
        let mut w = GgufWriter::create(&path, &meta(), &specs).unwrap();
        let datas: Vec<Vec<u8>> = specs
            .iter()
            .enumerate()
            .map(|(i, t)| data(t, i as u8))
            .collect();
        for d in &datas {
            w.write_tensor(d).unwrap();
        }
        let size = w.finish().unwrap();
        let g = Gguf::open(&path).unwrap();
        assert_eq!(size, std::fs::metadata(&path).unwrap().len());
        assert_eq!(g.version, 3);
        assert_eq!(g.alignment(), 64);
        assert_eq!(g.data_offset() % 64, 0);
        let expected: std::collections::BTreeMap<_, _> = meta().into_iter().collect();
        assert_eq!(g.metadata, expected);
        assert_eq!(g.tensors.len(), 3);
        for ((t, spec), d) in g.tensors.iter().zip(&specs).zip(&datas) {
            assert_eq!(
                (&t.name, &t.dims, t.dtype),
                (&spec.name, &spec.dims, spec.dtype)
            );
            assert_eq!(t.offset % 64, 0, "{}", t.name);
            assert_eq!(g.tensor(&t.name).unwrap().data, &d[..]);
        }
        // Nothing else is left in the directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn default_alignment_is_32() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.gguf");
        let spec = TensorSpec {
            name: "t".into(),
            dims: vec![3],
            dtype: GgmlType::F32,
        };
        let mut w = GgufWriter::create(&path, &[], std::slice::from_ref(&spec)).unwrap();
        w.write_tensor(&[1u8; 12]).unwrap();
        assert_eq!(w.finish().unwrap() % 32, 0);
        let g = Gguf::open(&path).unwrap();
        assert_eq!((g.alignment(), g.data_offset() % 32), (32, 0));
    }

    /// An error midway, or a writer dropped unfinished, leaves neither the output nor the
    /// temporary file.
    #[test]
    fn temp_file_is_gone_after_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.gguf");
        let specs = specs();
        let mut w = GgufWriter::create(&path, &meta(), &specs).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        w.write_tensor(&data(&specs[0], 0)).unwrap();
        let err = w.write_tensor(&[0u8; 3]).unwrap_err();
        assert!(matches!(err, WriteError::DataLength { .. }), "{err}");
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

        let w = GgufWriter::create(&path, &meta(), &specs).unwrap();
        let err = w.finish().unwrap_err();
        assert_eq!(
            err.to_string(),
            "0 of 3 tensors written when the file was finished"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// A full disk is an I/O error naming the output, and leaves nothing behind.
    #[cfg(target_os = "linux")]
    #[test]
    fn disk_full_names_the_path() {
        let path = Path::new("/dev/full");
        // The temporary file is created beside the output: use a directory we can write to,
        // then point the buffered writer at /dev/full.
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.gguf");
        let specs = specs();
        let mut w = GgufWriter::create(&out, &meta(), &specs).unwrap();
        let full = File::options().write(true).open(path).unwrap();
        w.file = Some(BufWriter::with_capacity(16, full));
        let err = w.write_tensor(&data(&specs[0], 0)).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("writing {}: ", out.display())),
            "{msg}"
        );
        assert!(msg.contains("No space left"), "{msg}");
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn bad_shapes_and_alignment_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.gguf");
        let spec = TensorSpec {
            name: "w".into(),
            dims: vec![576, 2],
            dtype: GgmlType::Q4_K,
        };
        let err = GgufWriter::create(&path, &[], &[spec]).err().unwrap();
        assert!(matches!(err, WriteError::Shape { .. }), "{err}");
        let meta = [("general.alignment".to_owned(), Value::U32(48))];
        let err = GgufWriter::create(&path, &meta, &[]).err().unwrap();
        assert!(matches!(err, WriteError::BadAlignment(48)), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
