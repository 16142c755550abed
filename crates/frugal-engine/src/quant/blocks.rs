//! Scalar codecs for the GGML block formats, byte for byte as GGUF stores them.
//!
//! These are the reference: `dequantize_row` and the load-time repacking go through them, and
//! the tests check the fast kernels against them. Every function takes slices whose lengths the
//! caller has already validated (whole blocks in, matching element count out), so they iterate
//! with `chunks_exact` and never index past the end.

use half::f16;

/// Weights per block of the 32-weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
pub(crate) const QK: usize = 32;
/// Weights per super-block of the K formats.
pub(crate) const QK_K: usize = 256;

pub(crate) const Q4_0_BYTES: usize = 2 + QK / 2;
pub(crate) const Q4_1_BYTES: usize = 4 + QK / 2;
pub(crate) const Q8_0_BYTES: usize = 2 + QK;
pub(crate) const Q5_0_BYTES: usize = 2 + 4 + QK / 2;
pub(crate) const Q5_1_BYTES: usize = 2 + 2 + 4 + QK / 2;
pub(crate) const Q4_K_BYTES: usize = 2 + 2 + 12 + QK_K / 2;
pub(crate) const Q5_K_BYTES: usize = 2 + 2 + 12 + QK_K / 8 + QK_K / 2;
pub(crate) const Q6_K_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;

#[inline]
pub(crate) fn f16_bits_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

#[inline]
pub(crate) fn f32_to_f16_bits(v: f32) -> u16 {
    f16::from_f32(v).to_bits()
}

#[inline]
pub(crate) fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
fn read_f16(b: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(read_u16(b, at))
}

/// The 4-bit value of weight `i` (0..32) of a Q4 block's 16 nibble bytes: GGML puts weights
/// 0..16 in the low nibbles and 16..32 in the high nibbles of the same bytes.
#[inline]
pub(crate) fn nibble(qs: &[u8], i: usize) -> u8 {
    if i < QK / 2 {
        qs[i] & 0x0F
    } else {
        qs[i - QK / 2] >> 4
    }
}

pub(crate) fn dequant_f32(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

pub(crate) fn dequant_f16(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

pub(crate) fn dequant_q4_0(bytes: &[u8], out: &mut [f32]) {
    for (y, blk) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(Q4_0_BYTES)) {
        let d = read_f16(blk, 0);
        let qs = &blk[2..];
        for (i, o) in y.iter_mut().enumerate() {
            *o = (i32::from(nibble(qs, i)) - 8) as f32 * d;
        }
    }
}

pub(crate) fn dequant_q4_1(bytes: &[u8], out: &mut [f32]) {
    for (y, blk) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(Q4_1_BYTES)) {
        let d = read_f16(blk, 0);
        let m = read_f16(blk, 2);
        let qs = &blk[4..];
        for (i, o) in y.iter_mut().enumerate() {
            *o = f32::from(nibble(qs, i)) * d + m;
        }
    }
}

/// The 5-bit value of weight `i` (0..32) of a Q5 block: a Q4 nibble plus bit `i` of `qh`.
#[inline]
fn quint(qs: &[u8], qh: u32, i: usize) -> u8 {
    nibble(qs, i) | ((((qh >> i) & 1) as u8) << 4)
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn dequant_q5_0(bytes: &[u8], out: &mut [f32]) {
    for (y, blk) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(Q5_0_BYTES)) {
        let d = read_f16(blk, 0);
        let qh = read_u32(blk, 2);
        let qs = &blk[6..];
        for (i, o) in y.iter_mut().enumerate() {
            *o = (i32::from(quint(qs, qh, i)) - 16) as f32 * d;
        }
    }
}

pub(crate) fn dequant_q5_1(bytes: &[u8], out: &mut [f32]) {
    for (y, blk) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(Q5_1_BYTES)) {
        let d = read_f16(blk, 0);
        let m = read_f16(blk, 2);
        let qh = read_u32(blk, 4);
        let qs = &blk[8..];
        for (i, o) in y.iter_mut().enumerate() {
            *o = f32::from(quint(qs, qh, i)) * d + m;
        }
    }
}

/// Packs 32 5-bit values the way Q5 blocks store them: low nibbles as Q4, fifth bits in `qh`.
fn pack_q5(q: &[u8; QK], qs: &mut [u8]) -> u32 {
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0F) | ((q[j + QK / 2] & 0x0F) << 4);
        qh |= u32::from(q[j] >> 4) << j;
        qh |= u32::from(q[j + QK / 2] >> 4) << (j + QK / 2);
    }
    qh
}

/// ggml's `quantize_row_q5_0_ref`: the signed absmax maps to -16.
pub(crate) fn quant_q5_0(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q5_0_BYTES)) {
        let max = xb
            .iter()
            .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK];
        for (qi, &v) in q.iter_mut().zip(xb) {
            // As ggml: truncating cast of v/d + 16.5, capped at 31.
            *qi = ((v * id + 16.5) as i8).min(31) as u8;
        }
        blk[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        let qh = pack_q5(&q, &mut blk[6..]);
        blk[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

/// ggml's `quantize_row_q5_1_ref`: min and (max - min) / 31 per block.
pub(crate) fn quant_q5_1(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q5_1_BYTES)) {
        let min = xb.iter().copied().fold(f32::INFINITY, f32::min);
        let max = xb.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK];
        for (qi, &v) in q.iter_mut().zip(xb) {
            *qi = (((v - min) * id + 0.5) as u8).min(31);
        }
        blk[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        blk[2..4].copy_from_slice(&f32_to_f16_bits(min).to_le_bytes());
        let qh = pack_q5(&q, &mut blk[8..]);
        blk[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

pub(crate) fn dequant_q8_0(bytes: &[u8], out: &mut [f32]) {
    for (y, blk) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(Q8_0_BYTES)) {
        let d = read_f16(blk, 0);
        for (o, &q) in y.iter_mut().zip(&blk[2..]) {
            *o = f32::from(q as i8) * d;
        }
    }
}

/// Scale and min (6 bits each) of sub-block `j` (0..8) from Q4_K's 12 packed scale bytes, as
/// ggml's `get_scale_min_k4`: sub-blocks 0..4 sit in the low 6 bits of bytes 0..8, sub-blocks
/// 4..8 keep their low 4 bits in bytes 8..12 and their top 2 bits in the spare top bits of
/// bytes 0..8.
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

pub(crate) fn dequant_q4_k(bytes: &[u8], out: &mut [f32]) {
    for (y, blk) in out
        .chunks_exact_mut(QK_K)
        .zip(bytes.chunks_exact(Q4_K_BYTES))
    {
        let d = read_f16(blk, 0);
        let dmin = read_f16(blk, 2);
        let scales = &blk[4..16];
        let qs = &blk[16..];
        // Each 64-weight chunk uses 32 bytes: low nibbles are sub-block 2c, high 2c+1.
        for (c, (yc, q)) in y.chunks_exact_mut(64).zip(qs.chunks_exact(32)).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * c, scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
            let (d1, mm1) = (d * f32::from(sc1), dmin * f32::from(m1));
            let (d2, mm2) = (d * f32::from(sc2), dmin * f32::from(m2));
            let (lo, hi) = yc.split_at_mut(32);
            for l in 0..32 {
                lo[l] = d1 * f32::from(q[l] & 0x0F) - mm1;
                hi[l] = d2 * f32::from(q[l] >> 4) - mm2;
            }
        }
    }
}

/// As Q4_K, with the fifth bit of sub-block `j`'s weight `l` in bit `j` of `qh[l]`.
pub(crate) fn dequant_q5_k(bytes: &[u8], out: &mut [f32]) {
    for (y, blk) in out
        .chunks_exact_mut(QK_K)
        .zip(bytes.chunks_exact(Q5_K_BYTES))
    {
        let d = read_f16(blk, 0);
        let dmin = read_f16(blk, 2);
        let scales = &blk[4..16];
        let qh = &blk[16..48];
        let qs = &blk[48..];
        for (j, yj) in y.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(j, scales);
            let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
            for (l, o) in yj.iter_mut().enumerate() {
                let q =
                    ((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F) | (((qh[l] >> j) & 1) << 4);
                *o = d1 * f32::from(q) - m1;
            }
        }
    }
}

pub(crate) fn dequant_q6_k(bytes: &[u8], out: &mut [f32]) {
    for (y, blk) in out
        .chunks_exact_mut(QK_K)
        .zip(bytes.chunks_exact(Q6_K_BYTES))
    {
        let (ql_all, rest) = blk.split_at(QK_K / 2);
        let (qh_all, rest) = rest.split_at(QK_K / 4);
        let (sc_all, dbytes) = rest.split_at(QK_K / 16);
        let d = read_f16(dbytes, 0);
        // Two halves of 128 weights; each uses 64 bytes of low bits, 32 of high bits, 8 scales.
        for n in 0..2 {
            let ql = &ql_all[64 * n..64 * n + 64];
            let qh = &qh_all[32 * n..32 * n + 32];
            let sc = &sc_all[8 * n..8 * n + 8];
            let yh = &mut y[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = i32::from((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32;
                let q2 = i32::from((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                yh[l] = d * f32::from(sc[is] as i8) * q1 as f32;
                yh[l + 32] = d * f32::from(sc[is + 2] as i8) * q2 as f32;
                yh[l + 64] = d * f32::from(sc[is + 4] as i8) * q3 as f32;
                yh[l + 96] = d * f32::from(sc[is + 6] as i8) * q4 as f32;
            }
        }
    }
}

/// Lays a Q6_K block out as ggml stores it: the 6-bit values `l` (offset by 32) as low
/// nibbles and high pairs, then the 16 sub-block scales and the f16 super-scale.
pub(crate) fn pack_q6_k(l: &[u8; QK_K], sc: &[i8; QK_K / 16], d16: u16, blk: &mut [u8]) {
    let (ql, rest) = blk.split_at_mut(QK_K / 2);
    let (qh, rest) = rest.split_at_mut(QK_K / 4);
    let (scb, db) = rest.split_at_mut(QK_K / 16);
    for n in 0..2 {
        let lb = &l[128 * n..];
        for i in 0..32 {
            let (q1, q2, q3, q4) = (lb[i], lb[i + 32], lb[i + 64], lb[i + 96]);
            ql[64 * n + i] = (q1 & 15) | ((q3 & 15) << 4);
            ql[64 * n + i + 32] = (q2 & 15) | ((q4 & 15) << 4);
            qh[32 * n + i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    for (o, &s) in scb.iter_mut().zip(sc) {
        *o = s as u8;
    }
    db.copy_from_slice(&d16.to_le_bytes());
}

pub(crate) fn quant_f32(x: &[f32], out: &mut [u8]) {
    for (o, v) in out.chunks_exact_mut(4).zip(x) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

pub(crate) fn quant_f16(x: &[f32], out: &mut [u8]) {
    for (o, &v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&f32_to_f16_bits(v).to_le_bytes());
    }
}

/// ggml's `quantize_row_q8_0_ref`: d = amax / 127, q = round(x / d) (half away from zero).
pub(crate) fn quant_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        for (q, &v) in blk[2..].iter_mut().zip(xb) {
            *q = ((v * id).round() as i8) as u8;
        }
    }
}

/// ggml's `quantize_row_q4_0_ref`: the signed value of largest magnitude maps to -8, so
/// d = max / -8 and q = min(15, trunc(x / d + 8.5)).
pub(crate) fn quant_q4_0(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q4_0_BYTES)) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        for j in 0..QK / 2 {
            // `as i8` truncates toward zero like C's (int8_t) cast, then the value is >= 0.
            let q0 = ((xb[j] * id + 8.5) as i8).clamp(0, 15) as u8;
            let q1 = ((xb[j + QK / 2] * id + 8.5) as i8).clamp(0, 15) as u8;
            blk[2 + j] = q0 | (q1 << 4);
        }
    }
}

/// ggml's `quantize_row_q4_1_ref`: d = (max - min) / 15, m = min, q = min(15, trunc((x - min)
/// / d + 0.5)).
pub(crate) fn quant_q4_1(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q4_1_BYTES)) {
        let min = xb.iter().fold(f32::MAX, |a, &v| a.min(v));
        let max = xb.iter().fold(-f32::MAX, |a, &v| a.max(v));
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        blk[2..4].copy_from_slice(&f32_to_f16_bits(min).to_le_bytes());
        for j in 0..QK / 2 {
            let q0 = (((xb[j] - min) * id + 0.5) as i8).clamp(0, 15) as u8;
            let q1 = (((xb[j + QK / 2] - min) * id + 0.5) as i8).clamp(0, 15) as u8;
            blk[4 + j] = q0 | (q1 << 4);
        }
    }
}

/// Q4_K (`bits` 4) or Q5_K (`bits` 5) by plain rounding: per sub-block of 32 the scale
/// `(max - min) / levels` and the min, both quantized to 6 bits against the super-block's
/// largest. ggml's reference (`kquants`, what `quantize_row` uses) searches each sub-block's
/// scale and min and lands closer; this stays as the baseline its tests measure against.
#[cfg(test)]
pub(crate) fn quant_qn_k(x: &[f32], out: &mut [u8], bits: u32) {
    let levels = ((1u32 << bits) - 1) as f32;
    let bytes = if bits == 5 { Q5_K_BYTES } else { Q4_K_BYTES };
    for (xb, blk) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(bytes)) {
        let mut scale = [0.0f32; 8];
        let mut negmin = [0.0f32; 8];
        for (j, sb) in xb.chunks_exact(32).enumerate() {
            let mn = sb.iter().fold(0.0f32, |a, &v| a.min(v));
            let mx = sb.iter().fold(0.0f32, |a, &v| a.max(v));
            scale[j] = (mx - mn) / levels;
            negmin[j] = -mn;
        }
        let d = scale.iter().fold(0.0f32, |a, &v| a.max(v)) / 63.0;
        let dmin = negmin.iter().fold(0.0f32, |a, &v| a.max(v)) / 63.0;
        let d16 = f32_to_f16_bits(d);
        let dm16 = f32_to_f16_bits(dmin);
        let (df, dmf) = (f16_bits_to_f32(d16), f16_bits_to_f32(dm16));
        let six = |v: f32, unit: f32| {
            if unit > 0.0 {
                (v / unit).round().clamp(0.0, 63.0) as u8
            } else {
                0
            }
        };
        let sc: [u8; 8] = std::array::from_fn(|j| six(scale[j], df));
        let mq: [u8; 8] = std::array::from_fn(|j| six(negmin[j], dmf));
        blk[0..2].copy_from_slice(&d16.to_le_bytes());
        blk[2..4].copy_from_slice(&dm16.to_le_bytes());
        for j in 0..4 {
            blk[4 + j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
            blk[4 + j + 4] = (mq[j] & 63) | ((mq[j + 4] >> 4) << 6);
            blk[4 + j + 8] = (sc[j + 4] & 15) | ((mq[j + 4] & 15) << 4);
        }
        let mut l = [0u8; QK_K];
        for j in 0..8 {
            let dj = df * f32::from(sc[j]);
            let mj = dmf * f32::from(mq[j]);
            for i in 0..32 {
                let v = xb[32 * j + i];
                l[32 * j + i] = if dj > 0.0 {
                    ((v + mj) / dj).round().clamp(0.0, levels) as u8
                } else {
                    0
                };
            }
        }
        let qs_at = if bits == 5 { 48 } else { 16 };
        if bits == 5 {
            let qh = &mut blk[16..48];
            qh.fill(0);
            for j in 0..8 {
                for i in 0..32 {
                    qh[i] |= (l[32 * j + i] >> 4) << j;
                }
            }
        }
        let qs = &mut blk[qs_at..];
        for c in 0..4 {
            for i in 0..32 {
                qs[32 * c + i] = (l[64 * c + i] & 15) | ((l[64 * c + 32 + i] & 15) << 4);
            }
        }
    }
}

/// Q6_K by plain rounding: per 16 weights a signed 8-bit scale of the absmax / 31, 6-bit
/// quants (ggml's reference searches the scales; see [`quant_qn_k`]).
#[cfg(test)]
pub(crate) fn quant_q6_k(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q6_K_BYTES)) {
        let mut scales = [0.0f32; 16];
        for (s, sb) in scales.iter_mut().zip(xb.chunks_exact(16)) {
            *s = sb.iter().fold(0.0f32, |a, &v| a.max(v.abs())) / 31.0;
        }
        let d = scales.iter().fold(0.0f32, |a, &v| a.max(v)) / 127.0;
        let d16 = f32_to_f16_bits(d);
        let df = f16_bits_to_f32(d16);
        let mut sc = [0i8; 16];
        for (q, &s) in sc.iter_mut().zip(&scales) {
            *q = if df > 0.0 {
                (s / df).round().clamp(0.0, 127.0) as i8
            } else {
                0
            };
        }
        let mut l = [0u8; QK_K];
        for (j, &s) in sc.iter().enumerate() {
            let dj = df * f32::from(s);
            for i in 0..16 {
                let v = xb[16 * j + i];
                let q = if dj > 0.0 {
                    (v / dj).round().clamp(-32.0, 31.0) as i32
                } else {
                    0
                };
                l[16 * j + i] = (q + 32) as u8;
            }
        }
        pack_q6_k(&l, &sc, d16, blk);
    }
}
