//! Test helpers shared by this crate's unit tests: a GGUF writer and the test model.

use super::format::MAGIC;
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

    pub(crate) fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
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
