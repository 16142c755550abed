//! What a GGUF file holds: metadata values, ggml tensor types and tensor descriptors.

use std::fmt;

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
pub(super) mod vtype {
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

/// Absolute byte range of a tensor's data, in u128 so that no file contents can overflow it.
pub(super) fn tensor_range(info: &TensorInfo, data_offset: usize) -> (u128, u128) {
    let start = data_offset as u128 + u128::from(info.offset);
    let n_elements: u128 = info.dims.iter().map(|&d| u128::from(d)).product();
    let n_bytes = n_elements / info.dtype.block_size() as u128 * info.dtype.block_bytes() as u128;
    (start, start + n_bytes)
}
