//! Quantized weight formats and the matrix kernels over them.
//!
//! * [`WeightType`] names the GGML tensor types the engine reads; [`dequantize_row`] and
//!   [`quantize_row`] are the scalar reference codecs of their GGUF byte layouts.
//! * [`QMatrix`] holds one weight matrix. Every quantized type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
//!   Q4_K, Q5_K, Q6_K) is repacked at load into 16-row tiles (see `packed`) of about its GGUF
//!   size, which the integer kernels stream; F32 and F16 keep their GGUF bytes and go through
//!   a dequantize-and-f32-dot path. A matrix may stack parts of different types (a fused
//!   Q, K, V whose V is Q8_0 in a Q4_K_M file), each streamed by its own kernel.
//! * [`matmul`] computes `out[b * rows + r] = dot(W[r], x[b])`. It quantizes the activations
//!   once per call into 32-value blocks (f32 scale, i8 quants, their sum), then every 16-row
//!   tile meets every activation row with integer dot products, so a batch reuses each weight
//!   block from registers. The kernel is fixed once per process: AVX-512 VNNI, AVX2 or
//!   scalar, the one [`Kernel::select`] chose (`frugal serve` times the model's matrices on
//!   each at start, see `model::calibrate`), else the widest the CPU has. The SIMD kernels
//!   prefetch the weights ahead into L1 or L2, as [`Prefetch`] says (chosen the same way).
//!   Work is split over the rayon pool by row tiles.
//!
//! Threading: run the whole decode step inside `pool.install(..)`, so that each matmul starts
//! on a pool thread and the other thread steals half of it (~1 us). Called from outside the
//! pool, every call hands its work over and sleeps until done, and the pool's threads fall
//! asleep between calls: a SmolLM2-135M Q4_0 step measured 1.8 ms inside, 5.2 ms outside.
//!
//! Weight block formula per 32 weights with activation block (dx, qx, S = sum qx):
//! `dot = dw * dx * sum(qw * qx) + c * dx * S` where `c` is Q4_1's / Q5_1's `m` (K types:
//! `dw = d * sc`, `c = -dmin * m` of the sub-block), and for Q4_0 / Q5_0 / Q8_0 / Q6_K the
//! stored unsigned quants carry an offset (8 / 16 / 128 / 32) removed as `- offset * S`
//! inside the integer sum, which is therefore exact on every path. Q6_K's two 16-weight
//! halves have their own scales, so it takes two integer sums per block.

mod blocks;
mod kquants;
mod out;
mod packed;
mod prefetch;
mod wide;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::cell::RefCell;
use std::fmt;
use std::ops::Range;
use std::sync::OnceLock;

use rayon::prelude::*;

use blocks::{QK, QK_K};
use out::{Part, StripedOut};
use packed::{ActRef, AlignedBuf, MAX_NB, PackKind, Packed, Sums, TILE, TileCall};
pub use prefetch::Prefetch;
pub use wide::Wide;

/// GGML tensor types the engine can load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum WeightType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl WeightType {
    /// Every supported type, in GGML id order.
    pub const ALL: [WeightType; 10] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q5_1,
        WeightType::Q8_0,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
    ];

    /// The type for a GGML `ggml_type` id as stored in GGUF tensor infos.
    pub fn from_ggml_id(id: u32) -> Result<WeightType, QuantError> {
        Ok(match id {
            0 => WeightType::F32,
            1 => WeightType::F16,
            2 => WeightType::Q4_0,
            3 => WeightType::Q4_1,
            6 => WeightType::Q5_0,
            7 => WeightType::Q5_1,
            8 => WeightType::Q8_0,
            12 => WeightType::Q4_K,
            13 => WeightType::Q5_K,
            14 => WeightType::Q6_K,
            _ => return Err(QuantError::UnsupportedGgmlType(id)),
        })
    }

    pub fn ggml_id(self) -> u32 {
        match self {
            WeightType::F32 => 0,
            WeightType::F16 => 1,
            WeightType::Q4_0 => 2,
            WeightType::Q4_1 => 3,
            WeightType::Q5_0 => 6,
            WeightType::Q5_1 => 7,
            WeightType::Q8_0 => 8,
            WeightType::Q4_K => 12,
            WeightType::Q5_K => 13,
            WeightType::Q6_K => 14,
        }
    }

    /// Weights per block.
    pub fn block_size(self) -> usize {
        match self {
            WeightType::F32 | WeightType::F16 => 1,
            WeightType::Q4_0
            | WeightType::Q4_1
            | WeightType::Q5_0
            | WeightType::Q5_1
            | WeightType::Q8_0 => QK,
            WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            WeightType::F32 => 4,
            WeightType::F16 => 2,
            WeightType::Q4_0 => blocks::Q4_0_BYTES,
            WeightType::Q4_1 => blocks::Q4_1_BYTES,
            WeightType::Q5_0 => blocks::Q5_0_BYTES,
            WeightType::Q5_1 => blocks::Q5_1_BYTES,
            WeightType::Q8_0 => blocks::Q8_0_BYTES,
            WeightType::Q4_K => blocks::Q4_K_BYTES,
            WeightType::Q5_K => blocks::Q5_K_BYTES,
            WeightType::Q6_K => blocks::Q6_K_BYTES,
        }
    }

    /// Bytes of `n` weights; `n` must be a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Result<usize, QuantError> {
        let bs = self.block_size();
        if !n.is_multiple_of(bs) {
            return Err(QuantError::NotBlockMultiple {
                weight_type: self,
                len: n,
                block: bs,
            });
        }
        (n / bs)
            .checked_mul(self.block_bytes())
            .ok_or(QuantError::TooLarge)
    }

    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "F32",
            WeightType::F16 => "F16",
            WeightType::Q4_0 => "Q4_0",
            WeightType::Q4_1 => "Q4_1",
            WeightType::Q5_0 => "Q5_0",
            WeightType::Q5_1 => "Q5_1",
            WeightType::Q8_0 => "Q8_0",
            WeightType::Q4_K => "Q4_K",
            WeightType::Q5_K => "Q5_K",
            WeightType::Q6_K => "Q6_K",
        }
    }

    /// Whether the integer kernels read this type as stored (else it is dequantized per use).
    pub fn has_fast_kernel(self) -> bool {
        self.pack_kind().is_some()
    }

    fn pack_kind(self) -> Option<PackKind> {
        match self {
            WeightType::Q8_0 => Some(PackKind::Q8_0),
            WeightType::Q4_0 => Some(PackKind::Q4_0),
            WeightType::Q4_1 => Some(PackKind::Q4_1),
            WeightType::Q5_0 => Some(PackKind::Q5_0),
            WeightType::Q5_1 => Some(PackKind::Q5_1),
            WeightType::Q4_K => Some(PackKind::Q4_K),
            WeightType::Q5_K => Some(PackKind::Q5_K),
            WeightType::Q6_K => Some(PackKind::Q6_K),
            WeightType::F32 | WeightType::F16 => None,
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for WeightType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("unsupported GGML tensor type id {0}")]
    UnsupportedGgmlType(u32),
    #[error("{weight_type} needs a multiple of {block} weights, got {len}")]
    NotBlockMultiple {
        weight_type: WeightType,
        len: usize,
        block: usize,
    },
    #[error("{what}: expected length {expected}, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("matrix has no columns")]
    NoColumns,
    #[error("matrix size overflows")]
    TooLarge,
    #[error("row {row} out of range for {rows} rows")]
    RowOutOfRange { row: usize, rows: usize },
    #[error("row range {start}..{end} out of range for {rows} rows")]
    RowRange {
        start: usize,
        end: usize,
        rows: usize,
    },
    #[error("cannot stack matrices: {0}")]
    Stack(&'static str),
    #[error("kernel {0} is not available on this CPU")]
    KernelUnavailable(Kernel),
    #[error("unknown kernel {0:?}: expected avx512, avx2 or scalar")]
    UnknownKernel(String),
    #[error("unknown prefetch {0:?}: expected l1 or l2")]
    UnknownPrefetch(String),
    #[error("kernel {wanted} asked for after {active} was already in use")]
    KernelInUse { wanted: Kernel, active: Kernel },
}

fn expect_len(what: &'static str, expected: usize, got: usize) -> Result<(), QuantError> {
    if expected == got {
        Ok(())
    } else {
        Err(QuantError::Length {
            what,
            expected,
            got,
        })
    }
}

/// Dequantize `out.len()` weights from `bytes` (exactly their GGUF encoding) into `out`.
pub fn dequantize_row(t: WeightType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    expect_len("dequantize_row bytes", t.row_bytes(out.len())?, bytes.len())?;
    match t {
        WeightType::F32 => blocks::dequant_f32(bytes, out),
        WeightType::F16 => blocks::dequant_f16(bytes, out),
        WeightType::Q4_0 => blocks::dequant_q4_0(bytes, out),
        WeightType::Q4_1 => blocks::dequant_q4_1(bytes, out),
        WeightType::Q5_0 => blocks::dequant_q5_0(bytes, out),
        WeightType::Q5_1 => blocks::dequant_q5_1(bytes, out),
        WeightType::Q8_0 => blocks::dequant_q8_0(bytes, out),
        WeightType::Q4_K => blocks::dequant_q4_k(bytes, out),
        WeightType::Q5_K => blocks::dequant_q5_k(bytes, out),
        WeightType::Q6_K => blocks::dequant_q6_k(bytes, out),
    }
    Ok(())
}

/// Quantize `x` into `out` (exactly its GGUF encoding) with ggml's reference quantizers, the
/// ones `llama-quantize` uses without an importance matrix (the K types' scale searches are in
/// `kquants`).
pub fn quantize_row(t: WeightType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    expect_len("quantize_row bytes", t.row_bytes(x.len())?, out.len())?;
    match t {
        WeightType::F32 => blocks::quant_f32(x, out),
        WeightType::F16 => blocks::quant_f16(x, out),
        WeightType::Q4_0 => blocks::quant_q4_0(x, out),
        WeightType::Q4_1 => blocks::quant_q4_1(x, out),
        WeightType::Q5_0 => blocks::quant_q5_0(x, out),
        WeightType::Q5_1 => blocks::quant_q5_1(x, out),
        WeightType::Q8_0 => blocks::quant_q8_0(x, out),
        WeightType::Q4_K => kquants::quant_q4_k(x, out),
        WeightType::Q5_K => kquants::quant_q5_k(x, out),
        WeightType::Q6_K => kquants::quant_q6_k(x, out),
    }
    Ok(())
}

/// The integer kernel implementations. [`Kernel::active`] is what [`matmul`] uses: the one
/// [`Kernel::select`] chose (by measurement at start, or `FRUGAL_ISA` so that every path can
/// be tested and benchmarked on one machine), else the widest the CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    Scalar,
    Avx2,
    Avx512Vnni,
}

/// A kernel together with the proof that the CPU can run it.
#[derive(Debug, Clone, Copy)]
enum Isa {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(x86::Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(x86::Avx512Vnni),
}

#[cfg(target_arch = "x86_64")]
fn detected() -> &'static (Option<x86::Avx512Vnni>, Option<x86::Avx2>) {
    static DETECTED: OnceLock<(Option<x86::Avx512Vnni>, Option<x86::Avx2>)> = OnceLock::new();
    DETECTED.get_or_init(|| (x86::Avx512Vnni::detect(), x86::Avx2::detect()))
}

/// Runs `work` compiled for the vectors of the [active](Kernel::active) kernel's ISA.
#[inline]
pub fn vectorized(work: impl Wide) {
    match Kernel::active().isa() {
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx512(k)) => k.vectorized(work),
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx2(k)) => k.vectorized(work),
        _ => work.run(),
    }
}

/// The kernel in use for the process, fixed by the first [`Kernel::active`] or
/// [`Kernel::select`].
static ACTIVE: OnceLock<Kernel> = OnceLock::new();

impl Kernel {
    /// The widest kernel this CPU runs (detected once), not always the fastest: see
    /// `model::calibrate`.
    pub fn best() -> Kernel {
        static BEST: OnceLock<Kernel> = OnceLock::new();
        *BEST.get_or_init(|| {
            [Kernel::Avx512Vnni, Kernel::Avx2]
                .into_iter()
                .find(|k| k.is_available())
                .unwrap_or(Kernel::Scalar)
        })
    }

    /// The kernel [`matmul`] uses: the one [selected](Kernel::select), else [`Kernel::best`].
    pub fn active() -> Kernel {
        *ACTIVE.get_or_init(Kernel::best)
    }

    /// The kernel fixed for the process, if one is yet (selected, or used by a matmul).
    pub fn fixed() -> Option<Kernel> {
        ACTIVE.get().copied()
    }

    /// Use `self` for every later matmul in this process instead of the fastest (e.g. the
    /// AVX2 path on an AVX-512 machine). Fails when the CPU lacks it, or when another kernel
    /// already ran: the choice is made once, before the first matmul.
    pub fn select(self) -> Result<(), QuantError> {
        if !self.is_available() {
            return Err(QuantError::KernelUnavailable(self));
        }
        match *ACTIVE.get_or_init(|| self) {
            active if active == self => Ok(()),
            active => Err(QuantError::KernelInUse {
                wanted: self,
                active,
            }),
        }
    }

    /// `FRUGAL_ISA=avx512|avx2|scalar`: the kernel it names, [`select`](Kernel::select)ed,
    /// so each path can be tested and benchmarked on any machine; unset or empty, the fastest
    /// the CPU has runs.
    pub fn select_from_env() -> Result<(), QuantError> {
        match std::env::var_os("FRUGAL_ISA") {
            Some(name) if !name.is_empty() => Kernel::from_name(&name.to_string_lossy())?.select(),
            _ => Ok(()),
        }
    }

    /// The kernel for a name as `FRUGAL_ISA` spells it: `avx512`, `avx2` or `scalar`.
    pub fn from_name(name: &str) -> Result<Kernel, QuantError> {
        match name {
            "avx512" => Ok(Kernel::Avx512Vnni),
            "avx2" => Ok(Kernel::Avx2),
            "scalar" => Ok(Kernel::Scalar),
            _ => Err(QuantError::UnknownKernel(name.to_owned())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Avx512Vnni => "avx512",
            Kernel::Avx2 => "avx2",
            Kernel::Scalar => "scalar",
        }
    }

    pub fn is_available(self) -> bool {
        self.isa().is_some()
    }

    fn isa(self) -> Option<Isa> {
        match self {
            Kernel::Scalar => Some(Isa::Scalar),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => detected().1.map(Isa::Avx2),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => detected().0.map(Isa::Avx512),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }
}

impl Prefetch {
    /// `FRUGAL_PREFETCH=l1|l2`: the prefetch it names, [set](Prefetch::set); unset or empty,
    /// nothing changes.
    pub fn set_from_env() -> Result<(), QuantError> {
        match std::env::var("FRUGAL_PREFETCH") {
            Ok(name) if !name.is_empty() => {
                Prefetch::from_name(&name)
                    .ok_or(QuantError::UnknownPrefetch(name))?
                    .set();
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[derive(Debug, Clone)]
enum Repr {
    /// Quantized types in 16-row tiles for the integer kernels: one part, or parts of
    /// different types stacked, every part but the last a whole number of tiles.
    Packed(Vec<Packed>),
    /// F32 / F16 bytes, row-major, for the dequantize-and-dot path.
    Raw { bytes: AlignedBuf, row_bytes: usize },
}

/// The part holding global tile `t`, and the tile's index within it.
fn part_of(parts: &[Packed], mut t: usize) -> Option<(&Packed, usize)> {
    for p in parts {
        if t < p.tiles() {
            return Some((p, t));
        }
        t -= p.tiles();
    }
    None
}

/// One weight matrix: `rows` output features, each `cols` contiguous input weights (GGUF dims
/// `[cols, rows]`).
#[derive(Debug, Clone)]
pub struct QMatrix {
    weight_type: WeightType,
    rows: usize,
    cols: usize,
    repr: Repr,
}

impl QMatrix {
    /// Load a matrix from its GGUF bytes; `bytes` must be exactly `rows` rows of `cols` weights.
    pub fn from_bytes(
        t: WeightType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<QMatrix, QuantError> {
        if cols == 0 {
            return Err(QuantError::NoColumns);
        }
        let row_bytes = t.row_bytes(cols)?;
        let total = row_bytes.checked_mul(rows).ok_or(QuantError::TooLarge)?;
        expect_len("matrix bytes", total, bytes.len())?;
        let repr = match t.pack_kind() {
            Some(kind) => Repr::Packed(vec![Packed::pack(kind, rows, cols, bytes)]),
            None => {
                let mut buf = AlignedBuf::zeroed(total);
                buf.as_mut_slice().copy_from_slice(bytes);
                Repr::Raw {
                    bytes: buf,
                    row_bytes,
                }
            }
        };
        Ok(QMatrix {
            weight_type: t,
            rows,
            cols,
            repr,
        })
    }

    /// The rows of `parts` one after the other, each part keeping its type and kernel (a
    /// fused Q, K, V of mixed types). Every part must be of a quantized type and have `cols`
    /// columns, and every part but the last a multiple of 16 rows (whole tiles).
    pub fn stack(parts: Vec<QMatrix>) -> Result<QMatrix, QuantError> {
        let first = parts.first().ok_or(QuantError::Stack("no parts"))?;
        let (weight_type, cols) = (first.weight_type, first.cols);
        let n = parts.len();
        let mut rows = 0;
        let mut packed = Vec::with_capacity(n);
        for (i, m) in parts.into_iter().enumerate() {
            if m.cols != cols {
                return Err(QuantError::Stack("parts differ in columns"));
            }
            if i + 1 < n && !m.rows.is_multiple_of(TILE) {
                return Err(QuantError::Stack(
                    "a part that is not the last is no whole tiles",
                ));
            }
            let Repr::Packed(ps) = m.repr else {
                return Err(QuantError::Stack("F32 and F16 parts do not stack"));
            };
            rows += m.rows;
            packed.extend(ps);
        }
        Ok(QMatrix {
            weight_type,
            rows,
            cols,
            repr: Repr::Packed(packed),
        })
    }

    /// Quantize a row-major f32 matrix with the quantizer of `t` (see [`quantize_row`]).
    pub fn from_f32(
        t: WeightType,
        rows: usize,
        cols: usize,
        data: &[f32],
    ) -> Result<QMatrix, QuantError> {
        if cols == 0 {
            return Err(QuantError::NoColumns);
        }
        let n = rows.checked_mul(cols).ok_or(QuantError::TooLarge)?;
        expect_len("matrix values", n, data.len())?;
        let row_bytes = t.row_bytes(cols)?;
        let mut bytes = vec![0u8; row_bytes.checked_mul(rows).ok_or(QuantError::TooLarge)?];
        for (x, o) in data
            .chunks_exact(cols)
            .zip(bytes.chunks_exact_mut(row_bytes))
        {
            quantize_row(t, x, o)?;
        }
        QMatrix::from_bytes(t, rows, cols, &bytes)
    }

    /// Dequantize and quantize again as `to` (see [`quantize_row`]), e.g. a Q4_1 model onto
    /// the Q4_0 kernel, or any model to F32 for exact reference logits.
    pub fn requantize(&self, to: WeightType) -> Result<QMatrix, QuantError> {
        let row_bytes = to.row_bytes(self.cols)?;
        let mut bytes = vec![
            0u8;
            row_bytes
                .checked_mul(self.rows)
                .ok_or(QuantError::TooLarge)?
        ];
        let mut row = vec![0f32; self.cols];
        for (r, o) in bytes.chunks_exact_mut(row_bytes).enumerate() {
            self.dequantize_row(r, &mut row)?;
            quantize_row(to, &row, o)?;
        }
        QMatrix::from_bytes(to, self.rows, self.cols, &bytes)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The type of the matrix (of its first part, when [stacked](QMatrix::stack)).
    pub fn weight_type(&self) -> WeightType {
        self.weight_type
    }

    /// Bytes of memory the matrix holds (after repacking, with tile padding).
    pub fn bytes(&self) -> usize {
        match &self.repr {
            Repr::Packed(ps) => ps.iter().map(|p| p.buf.capacity_bytes()).sum(),
            Repr::Raw { bytes, .. } => bytes.capacity_bytes(),
        }
    }

    /// Row `r` as f32 (embedding lookups); `out.len()` must be `cols`. Values equal
    /// [`dequantize_row`] of the row's original GGUF bytes.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), QuantError> {
        if r >= self.rows {
            return Err(QuantError::RowOutOfRange {
                row: r,
                rows: self.rows,
            });
        }
        expect_len("dequantize_row output", self.cols, out.len())?;
        match &self.repr {
            Repr::Packed(ps) => {
                let (p, t) = part_of(ps, r / TILE).ok_or(QuantError::RowOutOfRange {
                    row: r,
                    rows: self.rows,
                })?;
                p.dequantize_row(t * TILE + r % TILE, out);
                Ok(())
            }
            Repr::Raw { bytes, row_bytes } => dequantize_row(
                self.weight_type,
                &bytes.as_slice()[r * row_bytes..(r + 1) * row_bytes],
                out,
            ),
        }
    }
}

/// Reusable buffers for quantized activations, so steady-state matmuls allocate nothing.
#[derive(Debug, Default, Clone)]
pub struct Scratch {
    q: Vec<i8>,
    d: Vec<f32>,
    sum: Vec<i32>,
    lo: Vec<i32>,
    sd: Vec<f32>,
    neg8: Vec<i32>,
    neg128: Vec<i32>,
}

/// Activations prepared for [`matmul_input`]: the f32 rows and, when `cols` is a multiple of
/// 32, their Q8 blocks. One input can feed several matrices (q, k, v; gate, up).
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    x: &'a [f32],
    batch: usize,
    cols: usize,
    act: Option<ActRef<'a>>,
}

impl Input<'_> {
    pub fn batch(&self) -> usize {
        self.batch
    }

    pub fn cols(&self) -> usize {
        self.cols
    }
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch::default()
    }

    /// Quantize `x` (`batch` rows of `cols`) into this scratch and return the input view.
    /// When `cols` is not a multiple of 32 only the f32 path (F32 / F16 matrices) can use it.
    pub fn quantize<'a>(
        &'a mut self,
        x: &'a [f32],
        batch: usize,
        cols: usize,
    ) -> Result<Input<'a>, QuantError> {
        self.prepare(x, batch, cols, true, None, Kernel::active())
    }

    /// [`Scratch::quantize`], split over `pool` when the input is large (batched rows): at
    /// ~7.5 ns per 32 values, 16 rows of 1536 take ~6 us on one thread.
    pub fn quantize_par<'a>(
        &'a mut self,
        x: &'a [f32],
        batch: usize,
        cols: usize,
        pool: &rayon::ThreadPool,
    ) -> Result<Input<'a>, QuantError> {
        self.prepare(x, batch, cols, true, Some(pool), Kernel::active())
    }

    fn prepare<'a>(
        &'a mut self,
        x: &'a [f32],
        batch: usize,
        cols: usize,
        quantize: bool,
        pool: Option<&rayon::ThreadPool>,
        kernel: Kernel,
    ) -> Result<Input<'a>, QuantError> {
        let n = batch.checked_mul(cols).ok_or(QuantError::TooLarge)?;
        expect_len("activations", n, x.len())?;
        if !quantize || !cols.is_multiple_of(QK) {
            return Ok(Input {
                x,
                batch,
                cols,
                act: None,
            });
        }
        let blocks = n / QK;
        self.q.resize(n, 0);
        self.d.resize(blocks, 0.0);
        self.sum.resize(blocks, 0);
        self.lo.resize(blocks, 0);
        self.sd.resize(blocks, 0.0);
        self.neg8.resize(blocks, 0);
        self.neg128.resize(blocks, 0);
        let (q, d, sd) = (&mut self.q[..], &mut self.d[..], &mut self.sd[..]);
        let (sum, lo) = (&mut self.sum[..], &mut self.lo[..]);
        let threads = pool.map_or(1, |p| p.current_num_threads());
        let isa = kernel.isa().ok_or(QuantError::KernelUnavailable(kernel))?;
        match pool {
            Some(pool) if threads > 1 && blocks >= PAR_MIN_QUANT_BLOCKS => {
                let per = blocks.div_ceil(threads);
                pool.install(|| {
                    x.par_chunks(per * QK)
                        .zip(q.par_chunks_mut(per * QK))
                        .zip(d.par_chunks_mut(per))
                        .zip(sum.par_chunks_mut(per))
                        .zip(lo.par_chunks_mut(per))
                        .zip(sd.par_chunks_mut(per))
                        .for_each(|(((((x, q), d), sum), lo), sd)| {
                            quantize_blocks(isa, x, q, d, Sums { sum, lo, sd })
                        });
                });
            }
            _ => quantize_blocks(isa, x, q, d, Sums { sum, lo, sd }),
        }
        for ((n8, n128), &s) in self.neg8.iter_mut().zip(self.neg128.iter_mut()).zip(&*sum) {
            *n8 = -8 * s;
            *n128 = -128 * s;
        }
        let (neg8, neg128) = (&self.neg8[..], &self.neg128[..]);
        let act = ActRef {
            q,
            d,
            sum,
            lo: &self.lo[..],
            sd,
            neg8,
            neg128,
            nb: cols / QK,
            batch,
        };
        Ok(Input {
            x,
            batch,
            cols,
            act: Some(act),
        })
    }
}

/// Activation blocks below which quantizing on more threads does not pay (~2 us of work).
const PAR_MIN_QUANT_BLOCKS: usize = 256;

/// Quantize whole blocks (`x.len() == q.len() == 32 * d.len()`, and so on) with the SIMD of
/// `isa`, or the bit-identical scalar code.
fn quantize_blocks(isa: Isa, x: &[f32], q: &mut [i8], d: &mut [f32], mut s: Sums<'_>) {
    let done = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(k) => k.quantize(x, q, d, s.reborrow()),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(k) => k.quantize(x, q, d, s.reborrow()),
        Isa::Scalar => false,
    };
    if !done {
        for (k, (xb, qb)) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).enumerate() {
            let (dk, sk, lk) = packed::quantize_act_block(xb, qb);
            d[k] = dk;
            s.sum[k] = sk;
            s.lo[k] = lk;
            s.sd[k] = dk * sk as f32;
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::new());
}

/// `out[b * rows + r] = dot(W[r], x[b])` for `x` of `batch` rows of `w.cols()`, split over the
/// pool's threads (call it from inside `pool.install`, see the module docs). Uses a
/// per-thread [`Scratch`], so it allocates only on the first call (or when the activations
/// grow).
pub fn matmul(
    w: &QMatrix,
    x: &[f32],
    batch: usize,
    out: &mut [f32],
    pool: &rayon::ThreadPool,
) -> Result<(), QuantError> {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => matmul_with_scratch(w, x, batch, out, pool, &mut s),
        // Re-entered from inside a matmul on this thread: use a fresh scratch.
        Err(_) => matmul_with_scratch(w, x, batch, out, pool, &mut Scratch::new()),
    })
}

/// [`matmul`] with an explicit scratch.
pub fn matmul_with_scratch(
    w: &QMatrix,
    x: &[f32],
    batch: usize,
    out: &mut [f32],
    pool: &rayon::ThreadPool,
    scratch: &mut Scratch,
) -> Result<(), QuantError> {
    let (kernel, prefetch) = (Kernel::active(), Prefetch::active());
    matmul_with_kernel(w, x, batch, out, pool, scratch, kernel, prefetch)
}

/// [`matmul_with_scratch`] on `kernel` prefetching as `prefetch` says, which also quantizes
/// the activations, whatever the process's kernel and prefetch: what the calibration at
/// start times.
#[allow(clippy::too_many_arguments)]
pub fn matmul_with_kernel(
    w: &QMatrix,
    x: &[f32],
    batch: usize,
    out: &mut [f32],
    pool: &rayon::ThreadPool,
    scratch: &mut Scratch,
    kernel: Kernel,
    prefetch: Prefetch,
) -> Result<(), QuantError> {
    let needs_q8 = matches!(w.repr, Repr::Packed(_));
    let input = scratch.prepare(x, batch, w.cols, needs_q8, Some(pool), kernel)?;
    matmul_input_tuned(w, &input, out, pool, kernel, prefetch)
}

/// [`matmul`] on prepared activations (quantized once, used for several matrices).
pub fn matmul_input(
    w: &QMatrix,
    input: &Input<'_>,
    out: &mut [f32],
    pool: &rayon::ThreadPool,
) -> Result<(), QuantError> {
    matmul_input_with_kernel(w, input, out, pool, Kernel::active())
}

/// [`matmul_input`] with a chosen kernel (for tests and benchmarks).
pub fn matmul_input_with_kernel(
    w: &QMatrix,
    input: &Input<'_>,
    out: &mut [f32],
    pool: &rayon::ThreadPool,
    kernel: Kernel,
) -> Result<(), QuantError> {
    matmul_input_tuned(w, input, out, pool, kernel, Prefetch::active())
}

fn matmul_input_tuned(
    w: &QMatrix,
    input: &Input<'_>,
    out: &mut [f32],
    pool: &rayon::ThreadPool,
    kernel: Kernel,
    prefetch: Prefetch,
) -> Result<(), QuantError> {
    let isa = kernel.isa().ok_or(QuantError::KernelUnavailable(kernel))?;
    check_shapes(w, input, w.rows, out.len())?;
    let mut out = StripedOut::new(out, w.rows);
    run(w, input, 0..w.rows, &mut out, Some(pool), (isa, prefetch))
}

/// Only output rows `rows` of `W x`, on the calling thread: `out` is `batch` x `rows.len()`,
/// `out[b * rows.len() + (r - rows.start)]`. For callers that split work themselves.
pub fn matmul_rows(
    w: &QMatrix,
    input: &Input<'_>,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<(), QuantError> {
    if rows.start > rows.end || rows.end > w.rows {
        return Err(QuantError::RowRange {
            start: rows.start,
            end: rows.end,
            rows: w.rows,
        });
    }
    let isa = Kernel::active()
        .isa()
        .ok_or(QuantError::KernelUnavailable(Kernel::active()))?;
    check_shapes(w, input, rows.len(), out.len())?;
    let mut out = StripedOut::new(out, rows.len());
    run(w, input, rows, &mut out, None, (isa, Prefetch::active()))
}

fn check_shapes(
    w: &QMatrix,
    input: &Input<'_>,
    out_rows: usize,
    out_len: usize,
) -> Result<(), QuantError> {
    expect_len("input cols", w.cols, input.cols)?;
    let n = input
        .batch
        .checked_mul(out_rows)
        .ok_or(QuantError::TooLarge)?;
    expect_len("output", n, out_len)?;
    if matches!(w.repr, Repr::Packed(_)) && input.act.is_none() {
        // Only reachable with an Input prepared without quantization for another matrix.
        return Err(QuantError::Length {
            what: "quantized activations",
            expected: 1,
            got: 0,
        });
    }
    Ok(())
}

/// Below this many (tile x block x activation row) units, about 1.5 us of work, a call runs on
/// the calling thread alone. Measured on a SmolLM2-shaped decode step run inside
/// `pool.install`: splitting even the 192x576 projections pays (thresholds 0 and 256 tie, 1024
/// was 2x slower), because a pool thread left idle between calls falls asleep and the next
/// split call then waits for it to wake up.
const PAR_MIN_WORK: usize = 256;
/// Chunks per thread: more than one lets a thread slowed by other load be helped; 1, 2 and 4
/// measured the same when the machine was otherwise idle.
const CHUNKS_PER_THREAD: usize = 2;

/// Compute output rows `rows` (written at column `r - rows.start` of `out`'s strips).
fn run(
    w: &QMatrix,
    input: &Input<'_>,
    rows: Range<usize>,
    out: &mut StripedOut<'_>,
    pool: Option<&rayon::ThreadPool>,
    isa: (Isa, Prefetch),
) -> Result<(), QuantError> {
    if rows.is_empty() || input.batch == 0 {
        return Ok(());
    }
    let tiles = rows.start / TILE..rows.end.div_ceil(TILE);
    let n = tiles.len();
    let work = n * w.cols.div_ceil(QK) * input.batch;
    let threads = pool.map_or(1, |p| p.current_num_threads());
    let chunks = if threads > 1 && work >= PAR_MIN_WORK {
        (threads * CHUNKS_PER_THREAD).min(n)
    } else {
        1
    };
    let tile_range = |c: usize| tiles.start + c * n / chunks..tiles.start + (c + 1) * n / chunks;
    let col_range = |c: usize| {
        let tr = tile_range(c);
        (tr.start * TILE).max(rows.start) - rows.start..(tr.end * TILE).min(rows.end) - rows.start
    };
    let pool = if chunks > 1 { pool } else { None };
    let ok = out.run_parts(chunks, col_range, pool, |c, part| {
        compute_tiles(w, input, tile_range(c), &rows, part, isa);
    });
    if ok {
        Ok(())
    } else {
        Err(QuantError::RowRange {
            start: rows.start,
            end: rows.end,
            rows: w.rows,
        })
    }
}

/// All tiles in `tiles`, all activation rows; writes the rows that fall inside `rows`.
fn compute_tiles(
    w: &QMatrix,
    input: &Input<'_>,
    tiles: Range<usize>,
    rows: &Range<usize>,
    part: &Part<'_>,
    isa: (Isa, Prefetch),
) {
    let mut buf = [0f32; TILE * MAX_NB];
    for t in tiles {
        let r_lo = (t * TILE).max(rows.start);
        let r_hi = (t * TILE + TILE).min(rows.end);
        let mut b0 = 0;
        while b0 < input.batch {
            let nbat = MAX_NB.min(input.batch - b0);
            match (&w.repr, &input.act) {
                (Repr::Packed(ps), Some(act)) => {
                    if let Some((p, pt)) = part_of(ps, t) {
                        tile_packed(p, pt, act, b0, nbat, isa, &mut buf);
                    }
                }
                _ => tile_generic(w, input, r_lo..r_hi, b0, nbat, &mut buf),
            }
            for b in 0..nbat {
                let vals = &buf[b * TILE + (r_lo - t * TILE)..b * TILE + (r_hi - t * TILE)];
                part.write(b0 + b, r_lo - rows.start, vals);
            }
            b0 += nbat;
        }
    }
}

fn tile_packed(
    p: &Packed,
    t: usize,
    act: &ActRef<'_>,
    b0: usize,
    nbat: usize,
    (isa, pf): (Isa, Prefetch),
    buf: &mut [f32; TILE * MAX_NB],
) {
    let call = TileCall {
        kind: p.kind,
        tile: p.tile(t),
        geom: p.geom(),
        act: *act,
        b0,
        nbat,
    };
    let done = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(k) => k.tile(&call, buf, pf),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(k) => k.tile(&call, buf, pf),
        Isa::Scalar => false,
    };
    if !done {
        packed::tile_scalar(&call, buf);
    }
}

/// F32 / F16: convert 256 weights at a time on the stack, f32 dot with every activation row
/// of the chunk. `buf[b * TILE + (r % TILE)]`.
fn tile_generic(
    w: &QMatrix,
    input: &Input<'_>,
    rows: Range<usize>,
    b0: usize,
    nbat: usize,
    buf: &mut [f32; TILE * MAX_NB],
) {
    let Repr::Raw { bytes, row_bytes } = &w.repr else {
        return;
    };
    let t = w.weight_type;
    let piece = QK_K;
    let piece_bytes = t.block_bytes() * piece;
    let mut wf = [0f32; QK_K];
    for r in rows {
        let row = &bytes.as_slice()[r * row_bytes..(r + 1) * row_bytes];
        let mut acc = [0f32; MAX_NB];
        for (pi, pb) in row.chunks(piece_bytes).enumerate() {
            let c0 = pi * piece;
            let n = piece.min(w.cols - c0);
            if dequantize_row(t, pb, &mut wf[..n]).is_err() {
                continue;
            }
            for (b, a) in acc.iter_mut().enumerate().take(nbat) {
                let xs = &input.x[(b0 + b) * w.cols + c0..(b0 + b) * w.cols + c0 + n];
                *a += dot_f32(&wf[..n], xs);
            }
        }
        for (b, a) in acc.iter().enumerate().take(nbat) {
            buf[b * TILE + r % TILE] = *a;
        }
    }
}

/// f32 dot with 16 independent partial sums (vectorizable, and more accurate than one chain).
/// Inlined, so a caller compiled for wider vectors (see [`vectorized`]) gets them here too.
#[inline(always)]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests;
