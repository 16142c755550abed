//! The load-time repacked layout of Q8_0 / Q4_0 / Q4_1 matrices, and the scalar kernel over it.
//!
//! Rows are grouped in tiles of [`TILE`] = 16 so that one 512-bit register holds the same four
//! weights of 16 rows: `vpdpbusd` then multiplies them with four activation bytes broadcast to
//! every lane and leaves one partial dot product per row in each 32-bit lane. A block of 32
//! weights becomes eight such vectors, so one activation block meets 16 rows with 8
//! instructions and no horizontal reduction; for batched input the same eight weight registers
//! serve every activation row.
//!
//! Tile layout (all offsets from the tile start, tiles `stride` bytes apart, 64-byte aligned):
//! * quants, per block `k` at `k * QB`: vector `i` (0..8) is 64 bytes, row `r` owns bytes
//!   `4r..4r+4`, holding weights `4i..4i+4` of that row's block.
//!   - Q8_0: `QB = 512`, one byte per weight, stored as `q + 128` (an unsigned byte, since
//!     `vpdpbusd` wants its first operand unsigned; the kernel subtracts `128 * sum(x)`).
//!   - Q4_0 / Q4_1: `QB = 256`, four 64-byte vectors; the low nibbles are vectors 0..4
//!     (weights 0..16) and the high nibbles vectors 4..8 (weights 16..32), so one load and two
//!     mask/shift ops yield two weight vectors. Q4_0 is kept as `q` in 0..15 and the kernel
//!     subtracts `8 * sum(x)`, which makes Q4_0 and Q4_1 one code path.
//! * `d` at `nb * QB`: per block 16 little-endian f16 scales, one per row (32 bytes, converted
//!   with one `vcvtph2ps`); kept f16 so the bytes streamed stay those of the GGUF file.
//! * Q4_1 only, `m` at `nb * QB + nb * 32`: per block 16 f16 minimums.
//!
//! Padding rows of the last tile are zero bytes with scale 0, and their outputs are dropped.

use super::blocks::{self, QK};

/// Rows per tile.
pub(crate) const TILE: usize = 16;
/// Activation rows a kernel call handles at once (a register accumulator each); larger
/// batches make several passes over a tile, which by then sits in L1. 16 (one pass for a
/// 16-sequence batch) was tried: no faster for Q8_0 / Q4_0 and ~7% slower for Q4_1 at batch
/// 16, as 16 accumulators, 8 weight vectors and the scales crowd the 32 zmm registers.
pub(crate) const MAX_NB: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PackKind {
    Q8_0,
    Q4_0,
    Q4_1,
}

impl PackKind {
    /// Quant bytes per block of one tile.
    pub(crate) const fn qb(self) -> usize {
        match self {
            PackKind::Q8_0 => 8 * 64,
            PackKind::Q4_0 | PackKind::Q4_1 => 4 * 64,
        }
    }

    /// Number of f16 per-row arrays (d, and m for Q4_1).
    const fn scale_sets(self) -> usize {
        match self {
            PackKind::Q4_1 => 2,
            _ => 1,
        }
    }

    fn gguf_block_bytes(self) -> usize {
        match self {
            PackKind::Q8_0 => blocks::Q8_0_BYTES,
            PackKind::Q4_0 => blocks::Q4_0_BYTES,
            PackKind::Q4_1 => blocks::Q4_1_BYTES,
        }
    }
}

/// A byte buffer whose visible part starts on a 64-byte boundary, so every 64-byte quant
/// vector load stays within one cache line. Built from a `Vec` with slack, so no unsafe.
#[derive(Debug, Clone)]
pub(crate) struct AlignedBuf {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    pub(crate) fn zeroed(len: usize) -> AlignedBuf {
        let v = vec![0u8; len + 64];
        // align_offset may in principle decline (usize::MAX); then run unaligned, still correct.
        let off = v.as_ptr().align_offset(64);
        let off = if off < 64 { off } else { 0 };
        AlignedBuf { v, off, len }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }

    pub(crate) fn capacity_bytes(&self) -> usize {
        self.v.len()
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Packed {
    pub(crate) kind: PackKind,
    /// Blocks of 32 per row.
    pub(crate) nb: usize,
    /// Bytes from one tile to the next.
    pub(crate) stride: usize,
    pub(crate) buf: AlignedBuf,
}

/// Where the pieces of a tile start, for a given kind and block count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TileGeom {
    pub(crate) nb: usize,
    pub(crate) d_off: usize,
    pub(crate) m_off: usize,
    /// Bytes actually used by the tile (quants and scales, without the alignment padding).
    pub(crate) used: usize,
}

impl TileGeom {
    pub(crate) fn new(kind: PackKind, nb: usize) -> TileGeom {
        let d_off = nb * kind.qb();
        let m_off = d_off + nb * 2 * TILE;
        TileGeom {
            nb,
            d_off,
            m_off,
            used: d_off + kind.scale_sets() * nb * 2 * TILE,
        }
    }
}

impl Packed {
    /// Repack GGUF bytes (`rows` rows of `cols` weights, lengths already validated).
    pub(crate) fn pack(kind: PackKind, rows: usize, cols: usize, bytes: &[u8]) -> Packed {
        let nb = cols / QK;
        let geom = TileGeom::new(kind, nb);
        let stride = geom.used.div_ceil(64) * 64;
        let tiles = rows.div_ceil(TILE);
        let mut buf = AlignedBuf::zeroed(tiles * stride);
        let bb = kind.gguf_block_bytes();
        let row_bytes = nb * bb;
        let dst = buf.as_mut_slice();
        for (r, row) in bytes.chunks_exact(row_bytes).take(rows).enumerate() {
            let tile = &mut dst[(r / TILE) * stride..(r / TILE) * stride + stride];
            let rr = r % TILE;
            for (k, blk) in row.chunks_exact(bb).enumerate() {
                let q = &mut tile[k * kind.qb()..(k + 1) * kind.qb()];
                let (scale_bytes, m_bytes): ([u8; 2], Option<[u8; 2]>) = match kind {
                    PackKind::Q8_0 => {
                        for i in 0..8 {
                            for t in 0..4 {
                                q[64 * i + 4 * rr + t] = blk[2 + 4 * i + t] ^ 0x80;
                            }
                        }
                        ([blk[0], blk[1]], None)
                    }
                    PackKind::Q4_0 | PackKind::Q4_1 => {
                        let qs_at = if kind == PackKind::Q4_0 { 2 } else { 4 };
                        let qs = &blk[qs_at..qs_at + QK / 2];
                        // GGML byte i holds weights i (low) and 16 + i (high), exactly the
                        // pairing of vectors j and 4 + j, so the bytes move unchanged.
                        for j in 0..4 {
                            q[64 * j + 4 * rr..64 * j + 4 * rr + 4]
                                .copy_from_slice(&qs[4 * j..4 * j + 4]);
                        }
                        let m = (kind == PackKind::Q4_1).then_some([blk[2], blk[3]]);
                        ([blk[0], blk[1]], m)
                    }
                };
                let d_at = geom.d_off + k * 2 * TILE + 2 * rr;
                tile[d_at..d_at + 2].copy_from_slice(&scale_bytes);
                if let Some(m) = m_bytes {
                    let m_at = geom.m_off + k * 2 * TILE + 2 * rr;
                    tile[m_at..m_at + 2].copy_from_slice(&m);
                }
            }
        }
        Packed {
            kind,
            nb,
            stride,
            buf,
        }
    }

    pub(crate) fn geom(&self) -> TileGeom {
        TileGeom::new(self.kind, self.nb)
    }

    pub(crate) fn tile(&self, t: usize) -> &[u8] {
        &self.buf.as_slice()[t * self.stride..(t + 1) * self.stride]
    }

    /// Rebuild block `k` of row `r` as its GGUF bytes (the inverse of `pack`), so that
    /// dequantizing goes through the one reference decoder. Returns the block's byte count.
    pub(crate) fn gguf_block(
        &self,
        r: usize,
        k: usize,
        out: &mut [u8; blocks::Q8_0_BYTES],
    ) -> usize {
        let geom = self.geom();
        let tile = self.tile(r / TILE);
        let rr = r % TILE;
        let q = &tile[k * self.kind.qb()..(k + 1) * self.kind.qb()];
        let d_at = geom.d_off + k * 2 * TILE + 2 * rr;
        out[..2].copy_from_slice(&tile[d_at..d_at + 2]);
        match self.kind {
            PackKind::Q8_0 => {
                for i in 0..8 {
                    for t in 0..4 {
                        out[2 + 4 * i + t] = q[64 * i + 4 * rr + t] ^ 0x80;
                    }
                }
                blocks::Q8_0_BYTES
            }
            PackKind::Q4_0 | PackKind::Q4_1 => {
                let mut at = 2;
                if self.kind == PackKind::Q4_1 {
                    let m_at = geom.m_off + k * 2 * TILE + 2 * rr;
                    out[2..4].copy_from_slice(&tile[m_at..m_at + 2]);
                    at = 4;
                }
                for j in 0..4 {
                    out[at + 4 * j..at + 4 * j + 4]
                        .copy_from_slice(&q[64 * j + 4 * rr..64 * j + 4 * rr + 4]);
                }
                at + QK / 2
            }
        }
    }
}

/// Activations quantized per 32 values: i8 quants, f32 scale, the integer sum of the quants,
/// `d * sum` (the factor of Q4_1's min term), and `-8 * sum` / `-128 * sum` (the start values
/// of the Q4_0 / Q8_0 integer accumulators, stored so the kernel broadcasts them straight
/// from memory instead of spending a vector-port uop per block and row on it). Row `b`,
/// block `k` is entry `b * nb + k`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActRef<'a> {
    pub(crate) q: &'a [i8],
    pub(crate) d: &'a [f32],
    pub(crate) sum: &'a [i32],
    pub(crate) sd: &'a [f32],
    pub(crate) neg8: &'a [i32],
    pub(crate) neg128: &'a [i32],
    pub(crate) nb: usize,
    pub(crate) batch: usize,
}

impl ActRef<'_> {
    /// True when every array covers `batch * nb` blocks, which the kernels rely on.
    pub(crate) fn is_consistent(&self) -> bool {
        let n = self.batch * self.nb;
        self.q.len() >= n * QK
            && [
                self.d.len(),
                self.sum.len(),
                self.sd.len(),
                self.neg8.len(),
                self.neg128.len(),
            ]
            .iter()
            .all(|&l| l >= n)
    }
}

/// Quantize one block of 32 activations the way the SIMD quantizers do, bit for bit:
/// d = amax / 127, q = round_ties_even(x * (127 / amax)) (what `vcvtps2dq` does).
pub(crate) fn quantize_act_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        let r = (v * id).round_ties_even().clamp(-128.0, 127.0) as i32;
        sum += r;
        *o = r as i8;
    }
    (d, sum)
}

/// Scalar kernel: one tile, activation rows `b0 .. b0 + nbat`, writes `out[b * TILE + r]`.
/// Computes exactly the integers the SIMD kernels compute; only the float rounding of the
/// scale products and of the accumulation order may differ.
pub(crate) fn tile_scalar(
    kind: PackKind,
    tile: &[u8],
    geom: TileGeom,
    act: &ActRef<'_>,
    b0: usize,
    nbat: usize,
    out: &mut [f32; TILE * MAX_NB],
) {
    let nb = geom.nb;
    let qb = kind.qb();
    out.fill(0.0);
    for k in 0..nb {
        let q = &tile[k * qb..(k + 1) * qb];
        let d_at = geom.d_off + k * 2 * TILE;
        let m_at = geom.m_off + k * 2 * TILE;
        for b in 0..nbat {
            let e = (b0 + b) * nb + k;
            let xq = &act.q[e * QK..(e + 1) * QK];
            let init = match kind {
                PackKind::Q8_0 => act.neg128[e],
                PackKind::Q4_0 => act.neg8[e],
                PackKind::Q4_1 => 0,
            };
            for r in 0..TILE {
                let mut dot = init;
                for (i, xi) in xq.chunks_exact(4).enumerate() {
                    for (t, &xv) in xi.iter().enumerate() {
                        let w = match kind {
                            PackKind::Q8_0 => q[64 * i + 4 * r + t],
                            _ if i < 4 => q[64 * i + 4 * r + t] & 0x0F,
                            _ => q[64 * (i - 4) + 4 * r + t] >> 4,
                        };
                        dot += i32::from(w) * i32::from(xv);
                    }
                }
                let dw = blocks::f16_bits_to_f32(blocks::read_u16(tile, d_at + 2 * r));
                let o = &mut out[b * TILE + r];
                *o += dot as f32 * (dw * act.d[e]);
                if kind == PackKind::Q4_1 {
                    let mw = blocks::f16_bits_to_f32(blocks::read_u16(tile, m_at + 2 * r));
                    *o += mw * act.sd[e];
                }
            }
        }
    }
}
