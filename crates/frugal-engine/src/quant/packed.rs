//! The load-time repacked layout of the integer-kernel types, and the scalar kernel over it.
//!
//! Rows are grouped in tiles of [`TILE`] = 16 so that one 512-bit register holds the same four
//! weights of 16 rows: `vpdpbusd` then multiplies them with four activation bytes broadcast to
//! every lane and leaves one partial dot product per row in each 32-bit lane. A block of 32
//! weights becomes eight such vectors, so one activation block meets 16 rows with 8
//! instructions and no horizontal reduction; for batched input the same eight weight registers
//! serve every activation row. K-quant super-blocks are eight (Q6_K: sixteen half) blocks of
//! 32 with scales of their own, so every type is, per 32 weights, unsigned integers `u`, an
//! integer offset removed through the activation sum, and per-row float scales.
//!
//! Tile layout (all offsets from the tile start, tiles `stride` bytes apart, 64-byte aligned):
//! * quants, per block `k` at `k * QB`: vector `i` (0..8) is 64 bytes, row `r` owns bytes
//!   `4r..4r+4`, holding weights `4i..4i+4` of that row's block.
//!   - Q8_0: `QB = 512`, one byte per weight, stored as `q + 128` (an unsigned byte, since
//!     `vpdpbusd` wants its first operand unsigned; the kernel subtracts `128 * sum(x)`).
//!   - every other type: four 64-byte nibble vectors first; the low nibbles are vectors 0..4
//!     (weights 0..16) and the high nibbles vectors 4..8 (weights 16..32), so one load and two
//!     mask/shift ops yield two weight vectors (the pairing GGML's Q4 bytes already have).
//!     Q5_0, Q5_1 and Q5_K add one 64-byte vector (`QB = 320`) whose byte `4r + t` holds in
//!     bit `i` the fifth bit of weight `4i + t`; Q6_K adds two (`QB = 384`) holding the top two
//!     bits of weights `4i + t` in bits `2i, 2i + 1` (vectors 0..4 in the first, 4..8 in the
//!     second). A shift and a mask put those bits in place for each weight vector.
//! * `d` at `d_off`: 16 little-endian f16 scales, one per row (32 bytes, converted with one
//!   `vcvtph2ps`), per block (Q4_0 .. Q8_0) or per super-block (K types); kept f16 so the bytes
//!   streamed stay those of the GGUF file.
//! * `m` at `m_off` (Q4_1, Q5_1: per block; Q4_K, Q5_K: `dmin` per super-block): 16 f16.
//! * K types, per block at `sc_off + 32 k`: 16 bytes then 16 more, one per row: Q4_K / Q5_K
//!   the 6-bit scale and min of the sub-block, unpacked from GGML's 12 bytes (which makes them
//!   2-3% larger than in the file); Q6_K the signed scales of its two 16-weight halves.
//!
//! Padding rows of the last tile are zero bytes with scale 0, and their outputs are dropped.

use super::blocks::{self, QK, QK_K};

/// Rows per tile.
pub(crate) const TILE: usize = 16;
/// Activation rows a kernel call handles at once (a register accumulator each); larger
/// batches make several passes over a tile, which by then sits in L1. 16 (one pass for a
/// 16-sequence batch) was tried: no faster for Q8_0 / Q4_0 and ~7% slower for Q4_1 at batch
/// 16, as 16 accumulators, 8 weight vectors and the scales crowd the 32 zmm registers.
pub(crate) const MAX_NB: usize = 8;
/// Blocks of 32 per K super-block.
pub(crate) const SUB: usize = QK_K / QK;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub(crate) enum PackKind {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl PackKind {
    #[cfg(test)]
    pub(crate) const ALL: [PackKind; 8] = [
        PackKind::Q8_0,
        PackKind::Q4_0,
        PackKind::Q4_1,
        PackKind::Q5_0,
        PackKind::Q5_1,
        PackKind::Q4_K,
        PackKind::Q5_K,
        PackKind::Q6_K,
    ];

    /// Quant bytes per block of one tile.
    pub(crate) const fn qb(self) -> usize {
        match self {
            PackKind::Q8_0 => 8 * 64,
            PackKind::Q4_0 | PackKind::Q4_1 | PackKind::Q4_K => 4 * 64,
            PackKind::Q5_0 | PackKind::Q5_1 | PackKind::Q5_K => 5 * 64,
            PackKind::Q6_K => 6 * 64,
        }
    }

    /// Whether scales come per 256-weight super-block with per-block integer sub-scales.
    pub(crate) const fn is_k(self) -> bool {
        matches!(self, PackKind::Q4_K | PackKind::Q5_K | PackKind::Q6_K)
    }

    /// Whether a per-row f16 array follows `d` (Q4_1 / Q5_1 `m`, Q4_K / Q5_K `dmin`).
    const fn has_m(self) -> bool {
        matches!(
            self,
            PackKind::Q4_1 | PackKind::Q5_1 | PackKind::Q4_K | PackKind::Q5_K
        )
    }

    /// The integer the stored quants are offset by (removed as `offset * sum(x)`).
    pub(crate) const fn offset(self) -> i32 {
        match self {
            PackKind::Q8_0 => 128,
            PackKind::Q4_0 => 8,
            PackKind::Q5_0 => 16,
            PackKind::Q6_K => 32,
            _ => 0,
        }
    }

    /// Weights per GGUF block.
    fn gguf_block_len(self) -> usize {
        if self.is_k() { QK_K } else { QK }
    }

    fn gguf_block_bytes(self) -> usize {
        match self {
            PackKind::Q8_0 => blocks::Q8_0_BYTES,
            PackKind::Q4_0 => blocks::Q4_0_BYTES,
            PackKind::Q4_1 => blocks::Q4_1_BYTES,
            PackKind::Q5_0 => blocks::Q5_0_BYTES,
            PackKind::Q5_1 => blocks::Q5_1_BYTES,
            PackKind::Q4_K => blocks::Q4_K_BYTES,
            PackKind::Q5_K => blocks::Q5_K_BYTES,
            PackKind::Q6_K => blocks::Q6_K_BYTES,
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
    /// Rows held (the last tile may be part padding).
    pub(crate) rows: usize,
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
    /// K types' per-block integer scales (32 bytes per block).
    pub(crate) sc_off: usize,
    /// Bytes actually used by the tile (quants and scales, without the alignment padding).
    pub(crate) used: usize,
}

impl TileGeom {
    pub(crate) fn new(kind: PackKind, nb: usize) -> TileGeom {
        // One f16 per row per block, or per super-block for the K types.
        let groups = if kind.is_k() { nb.div_ceil(SUB) } else { nb };
        let d_off = nb * kind.qb();
        let m_off = d_off + groups * 2 * TILE;
        let sc_off = if kind.has_m() {
            m_off + groups * 2 * TILE
        } else {
            m_off
        };
        let used = if kind.is_k() {
            sc_off + nb * 2 * TILE
        } else {
            sc_off
        };
        TileGeom {
            nb,
            d_off,
            m_off,
            sc_off,
            used,
        }
    }

    /// The 32-byte scale group streamed with block `k` (what the kernels prefetch).
    pub(crate) fn block_scales(&self, kind: PackKind, k: usize) -> usize {
        if kind.is_k() {
            self.sc_off + k * 2 * TILE
        } else {
            self.d_off + k * 2 * TILE
        }
    }

    /// Offset of the `d` group that block `k` uses.
    pub(crate) fn d_at(&self, kind: PackKind, k: usize) -> usize {
        self.d_off + if kind.is_k() { k / SUB } else { k } * 2 * TILE
    }

    /// Offset of the `m` (or `dmin`) group that block `k` uses.
    pub(crate) fn m_at(&self, kind: PackKind, k: usize) -> usize {
        self.m_off + if kind.is_k() { k / SUB } else { k } * 2 * TILE
    }
}

/// One 32-weight block of one row as the packed layout stores it: unsigned quants and the
/// bytes of its per-block scales (`d`, `m`: f16 bits; `sc`: K types' two integer scales).
#[derive(Debug, Clone, Copy, Default)]
struct Unit {
    u: [u8; QK],
    d: [u8; 2],
    m: [u8; 2],
    sc: [u8; 2],
}

/// The blocks of 32 of one GGUF block (`kind.gguf_block_len()` weights) as [`Unit`]s.
fn units(kind: PackKind, blk: &[u8], out: &mut [Unit; SUB]) {
    let f16 = |at: usize| [blk[at], blk[at + 1]];
    match kind {
        PackKind::Q8_0 => {
            let o = &mut out[0];
            for (u, &q) in o.u.iter_mut().zip(&blk[2..2 + QK]) {
                *u = q ^ 0x80;
            }
            o.d = f16(0);
        }
        PackKind::Q4_0 | PackKind::Q4_1 | PackKind::Q5_0 | PackKind::Q5_1 => {
            let (qh_at, qs_at) = match kind {
                PackKind::Q4_0 => (None, 2),
                PackKind::Q4_1 => (None, 4),
                PackKind::Q5_0 => (Some(2), 6),
                _ => (Some(4), 8),
            };
            let qh = qh_at.map_or(0, |at| {
                u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]])
            });
            let o = &mut out[0];
            for (i, u) in o.u.iter_mut().enumerate() {
                *u =
                    blocks::nibble(&blk[qs_at..qs_at + QK / 2], i) | ((((qh >> i) & 1) as u8) << 4);
            }
            o.d = f16(0);
            if matches!(kind, PackKind::Q4_1 | PackKind::Q5_1) {
                o.m = f16(2);
            }
        }
        PackKind::Q4_K | PackKind::Q5_K => {
            let (qh, qs) = if kind == PackKind::Q5_K {
                (&blk[16..48], &blk[48..176])
            } else {
                (&blk[..0], &blk[16..144])
            };
            for (j, o) in out.iter_mut().enumerate() {
                let (sc, m) = blocks::scale_min_k4(j, &blk[4..16]);
                for (l, u) in o.u.iter_mut().enumerate() {
                    let hi = qh.get(l).map_or(0, |h| ((h >> j) & 1) << 4);
                    *u = ((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F) | hi;
                }
                (o.d, o.m, o.sc) = (f16(0), f16(2), [sc, m]);
            }
        }
        PackKind::Q6_K => {
            let (ql, qh, sc) = (&blk[..128], &blk[128..192], &blk[192..208]);
            for (k, o) in out.iter_mut().enumerate() {
                let (n, g) = (k / 4, k % 4);
                for (l, u) in o.u.iter_mut().enumerate() {
                    let lo = (ql[64 * n + l + 32 * (g % 2)] >> (4 * (g / 2))) & 0x0F;
                    *u = lo | (((qh[32 * n + l] >> (2 * g)) & 3) << 4);
                }
                (o.d, o.sc) = (f16(208), [sc[8 * n + 2 * g], sc[8 * n + 2 * g + 1]]);
            }
        }
    }
}

/// Weight `4i + t` of row `r` of a tile block's quants `q` (the inverse of `put_quants`).
#[inline]
fn quant_at(kind: PackKind, q: &[u8], r: usize, i: usize, t: usize) -> u8 {
    let at = 4 * r + t;
    if kind == PackKind::Q8_0 {
        return q[64 * i + at];
    }
    let nib = (q[64 * (i % 4) + at] >> (4 * (i / 4))) & 0x0F;
    match kind {
        PackKind::Q5_0 | PackKind::Q5_1 | PackKind::Q5_K => nib | (((q[256 + at] >> i) & 1) << 4),
        PackKind::Q6_K => nib | (((q[256 + 64 * (i / 4) + at] >> (2 * (i % 4))) & 3) << 4),
        _ => nib,
    }
}

fn put_quants(kind: PackKind, q: &mut [u8], r: usize, u: &[u8; QK]) {
    for i in 0..8 {
        for t in 0..4 {
            let (at, w) = (4 * r + t, u[4 * i + t]);
            if kind == PackKind::Q8_0 {
                q[64 * i + at] = w;
                continue;
            }
            q[64 * (i % 4) + at] |= (w & 0x0F) << (4 * (i / 4));
            match kind {
                PackKind::Q5_0 | PackKind::Q5_1 | PackKind::Q5_K => q[256 + at] |= (w >> 4) << i,
                PackKind::Q6_K => q[256 + 64 * (i / 4) + at] |= (w >> 4) << (2 * (i % 4)),
                _ => {}
            }
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
        let (bb, per) = (kind.gguf_block_bytes(), kind.gguf_block_len() / QK);
        let row_bytes = nb / per * bb;
        let dst = buf.as_mut_slice();
        let mut us = [Unit::default(); SUB];
        for (r, row) in bytes.chunks_exact(row_bytes).take(rows).enumerate() {
            let tile = &mut dst[(r / TILE) * stride..(r / TILE) * stride + stride];
            let rr = r % TILE;
            for (g, blk) in row.chunks_exact(bb).enumerate() {
                units(kind, blk, &mut us);
                for (j, unit) in us.iter().take(per).enumerate() {
                    let k = g * per + j;
                    put_quants(
                        kind,
                        &mut tile[k * kind.qb()..(k + 1) * kind.qb()],
                        rr,
                        &unit.u,
                    );
                    let d_at = geom.d_at(kind, k) + 2 * rr;
                    tile[d_at..d_at + 2].copy_from_slice(&unit.d);
                    if kind.has_m() {
                        let m_at = geom.m_at(kind, k) + 2 * rr;
                        tile[m_at..m_at + 2].copy_from_slice(&unit.m);
                    }
                    if kind.is_k() {
                        let sc_at = geom.sc_off + k * 2 * TILE + rr;
                        tile[sc_at] = unit.sc[0];
                        tile[sc_at + TILE] = unit.sc[1];
                    }
                }
            }
        }
        Packed {
            kind,
            rows,
            nb,
            stride,
            buf,
        }
    }

    pub(crate) fn geom(&self) -> TileGeom {
        TileGeom::new(self.kind, self.nb)
    }

    pub(crate) fn tiles(&self) -> usize {
        self.rows.div_ceil(TILE)
    }

    pub(crate) fn tile(&self, t: usize) -> &[u8] {
        &self.buf.as_slice()[t * self.stride..(t + 1) * self.stride]
    }

    /// Row `r` as f32 (`out.len() == 32 * nb`), bit for bit what the GGUF reference decoder
    /// gives for the bytes this row was packed from (the same float operations in the same
    /// order).
    pub(crate) fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let (kind, geom) = (self.kind, self.geom());
        let tile = self.tile(r / TILE);
        let rr = r % TILE;
        for (k, o) in out.chunks_exact_mut(QK).enumerate() {
            let q = &tile[k * kind.qb()..(k + 1) * kind.qb()];
            let s = RowScales::read(kind, tile, geom, k, rr);
            for (w, v) in o.iter_mut().enumerate() {
                let u = quant_at(kind, q, rr, w / 4, w % 4);
                *v = match kind {
                    PackKind::Q8_0 => f32::from((u ^ 0x80) as i8) * s.d,
                    PackKind::Q4_0 | PackKind::Q5_0 => (i32::from(u) - kind.offset()) as f32 * s.d,
                    PackKind::Q4_1 | PackKind::Q5_1 => f32::from(u) * s.d + s.m,
                    PackKind::Q4_K | PackKind::Q5_K => {
                        s.d * f32::from(s.sc[0]) * f32::from(u) - s.m * f32::from(s.sc[1])
                    }
                    PackKind::Q6_K => {
                        let sc = s.sc[w / 16] as i8;
                        s.d * f32::from(sc) * (i32::from(u) - 32) as f32
                    }
                };
            }
        }
    }
}

/// The scales row `r` of a tile applies to block `k`, as stored.
struct RowScales {
    d: f32,
    /// Q4_1 / Q5_1 `m`, K types' `dmin`; 0 elsewhere.
    m: f32,
    sc: [u8; 2],
}

impl RowScales {
    fn read(kind: PackKind, tile: &[u8], geom: TileGeom, k: usize, r: usize) -> RowScales {
        let f = |at: usize| blocks::f16_bits_to_f32(blocks::read_u16(tile, at + 2 * r));
        let sc_at = geom.sc_off + k * 2 * TILE + r;
        RowScales {
            d: f(geom.d_at(kind, k)),
            m: if kind.has_m() {
                f(geom.m_at(kind, k))
            } else {
                0.0
            },
            sc: if kind.is_k() {
                [tile[sc_at], tile[sc_at + TILE]]
            } else {
                [0, 0]
            },
        }
    }
}

/// Activations quantized per 32 values: i8 quants, f32 scale, the integer sum of the quants,
/// the sum of its first 16 (Q6_K's halves have scales of their own), `d * sum` (the factor of
/// the min terms), and `-8 * sum` / `-128 * sum` (the start values of the Q4_0 / Q8_0 integer
/// accumulators, stored so the kernel broadcasts them straight from memory instead of
/// spending a vector-port uop per block and row on it). Row `b`, block `k` is entry
/// `b * nb + k`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActRef<'a> {
    pub(crate) q: &'a [i8],
    pub(crate) d: &'a [f32],
    pub(crate) sum: &'a [i32],
    pub(crate) lo: &'a [i32],
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
                self.lo.len(),
                self.sd.len(),
                self.neg8.len(),
                self.neg128.len(),
            ]
            .iter()
            .all(|&l| l >= n)
    }
}

/// Per activation block: the sum of its quants, of the first 16 of them, and `d * sum`.
pub(crate) struct Sums<'a> {
    pub(crate) sum: &'a mut [i32],
    pub(crate) lo: &'a mut [i32],
    pub(crate) sd: &'a mut [f32],
}

impl Sums<'_> {
    /// The same arrays, for a call that leaves them to this one afterwards.
    pub(crate) fn reborrow(&mut self) -> Sums<'_> {
        Sums {
            sum: self.sum,
            lo: self.lo,
            sd: self.sd,
        }
    }
}

/// One kernel call: a tile of `kind` laid out as `geom` says, against activation rows
/// `b0 .. b0 + nbat`. The SIMD kernels check it (`x86::check`) before they read through raw
/// pointers.
#[derive(Clone, Copy)]
pub(crate) struct TileCall<'a> {
    pub(crate) kind: PackKind,
    pub(crate) tile: &'a [u8],
    pub(crate) geom: TileGeom,
    pub(crate) act: ActRef<'a>,
    pub(crate) b0: usize,
    pub(crate) nbat: usize,
}

/// Quantize one block of 32 activations the way the SIMD quantizers do, bit for bit:
/// d = amax / 127, q = round_ties_even(x * (127 / amax)) (what `vcvtps2dq` does). Returns d,
/// the sum of the quants and the sum of the first 16.
pub(crate) fn quantize_act_block(x: &[f32], q: &mut [i8]) -> (f32, i32, i32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let (mut sum, mut lo) = (0i32, 0i32);
    for (i, (o, &v)) in q.iter_mut().zip(x).enumerate() {
        let r = (v * id).round_ties_even().clamp(-128.0, 127.0) as i32;
        sum += r;
        if i < QK / 2 {
            lo += r;
        }
        *o = r as i8;
    }
    (d, sum, lo)
}

/// Scalar kernel: one tile, activation rows `b0 .. b0 + nbat`, writes `out[b * TILE + r]`.
/// Computes exactly the integers the SIMD kernels compute; only the float rounding of the
/// scale products and of the accumulation order may differ.
pub(crate) fn tile_scalar(call: &TileCall<'_>, out: &mut [f32; TILE * MAX_NB]) {
    let TileCall {
        kind,
        tile,
        geom,
        act,
        b0,
        nbat,
    } = *call;
    let nb = geom.nb;
    let qb = kind.qb();
    let off = kind.offset();
    out.fill(0.0);
    for k in 0..nb {
        let q = &tile[k * qb..(k + 1) * qb];
        for r in 0..TILE {
            let s = RowScales::read(kind, tile, geom, k, r);
            let mut u = [0u8; QK];
            for (w, v) in u.iter_mut().enumerate() {
                *v = quant_at(kind, q, r, w / 4, w % 4);
            }
            for b in 0..nbat {
                let e = (b0 + b) * nb + k;
                let xq = &act.q[e * QK..(e + 1) * QK];
                // Integer dots of the two 16-weight halves, offsets removed.
                let half = |h: usize, sum: i32| {
                    (16 * h..16 * h + 16)
                        .map(|i| i32::from(u[i]) * i32::from(xq[i]))
                        .sum::<i32>()
                        - off * sum
                };
                let (lo, hi) = (half(0, act.lo[e]), half(1, act.sum[e] - act.lo[e]));
                let dx = act.d[e];
                let o = &mut out[b * TILE + r];
                match kind {
                    PackKind::Q6_K => {
                        let (s0, s1) = (f32::from(s.sc[0] as i8), f32::from(s.sc[1] as i8));
                        *o += (lo as f32 * (s.d * s0) + hi as f32 * (s.d * s1)) * dx;
                    }
                    PackKind::Q4_K | PackKind::Q5_K => {
                        let (dw, mw) = (s.d * f32::from(s.sc[0]), s.m * f32::from(s.sc[1]));
                        *o += (lo + hi) as f32 * (dw * dx) - mw * act.sd[e];
                    }
                    _ => *o += (lo + hi) as f32 * (s.d * dx) + s.m * act.sd[e],
                }
            }
        }
    }
}
