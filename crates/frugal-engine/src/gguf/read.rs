//! Parsing a GGUF header: a bounds-checked cursor over the bytes, metadata values and
//! tensor descriptors, each checked before anything is allocated.

use std::collections::{BTreeMap, HashMap};

use super::format::{
    DEFAULT_ALIGNMENT, GgufError, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS, MIN_TENSOR_INFO_BYTES,
};
use super::types::{GgmlType, TensorInfo, Value, tensor_range, vtype};

/// The header of a GGUF file: everything but the bytes themselves.
pub(super) struct Layout {
    pub(super) version: u32,
    pub(super) metadata: BTreeMap<String, Value>,
    pub(super) tensors: Vec<TensorInfo>,
    pub(super) alignment: u64,
    pub(super) data_offset: usize,
    pub(super) index: HashMap<String, usize>,
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

pub(super) fn parse_layout(buf: &[u8]) -> Result<Layout, GgufError> {
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
