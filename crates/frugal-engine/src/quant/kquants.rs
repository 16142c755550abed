//! ggml's reference quantizers for the K formats (`quantize_row_q4_K_ref`,
//! `quantize_row_q5_K_ref`, `quantize_row_q6_K_ref` in `ggml-quants.c`), ported step for step.
//!
//! Plain rounding (scale = range / levels) wastes levels on outliers; these search each
//! sub-block's scale (and min) for the least weighted squared error, which is what
//! `llama-quantize` writes when no importance matrix is given. The block layouts are the ones
//! `blocks` decodes, so every dequantizer and kernel reads them unchanged.

use super::blocks::{
    Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K, f16_bits_to_f32, f32_to_f16_bits, pack_q6_k,
};

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below this is all zeros.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even. Its float trick (adding 1.5 * 2^23 leaves the
/// rounded integer in the low mantissa bits) is exact for |v| < 2^22, where ggml asserts it
/// is; it costs an add where `round_ties_even` is a libm call on baseline x86-64.
#[inline]
fn nearest_int(v: f32) -> i32 {
    if v.abs() <= 4_194_303.0 {
        let bits = (v + 12_582_912.0).to_bits();
        (bits & 0x007f_ffff) as i32 - 0x0040_0000
    } else {
        v.round_ties_even() as i32
    }
}

/// ggml's `make_qkx2_quants`: quants `l` in `0..=nmax` with `x ~ scale * l - min`, searching
/// `nstep + 1` candidate scales around `nmax / (max - min)` for the least weighted error, each
/// refined by weighted least squares. Returns `(scale, min)` with `min >= 0` subtracted.
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        // Comparisons as ggml's, not f32::min/max, which may pick either of 0.0 and -0.0:
        // the sign of a zero min decides the sign bit of a stored zero dmin.
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        // w * (diff * diff), in ggml's order: the other rounds differently near ties.
        best_error += weights[i] * (diff * diff);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let (w, lf) = (weights[i], l as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(laux[i]) + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no importance weights: a signed scale for
/// quants in `-nmax..nmax`, the best of 19 candidates by `x^2`-weighted error. Its quants,
/// offset by `nmax`, go to `l_out` (ggml keeps them where the final scale rounds to zero).
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [u8]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = quant(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let mut fill = |iscale: f32| {
        for (o, &v) in l_out.iter_mut().zip(x) {
            *o = (quant(iscale, v) + nmax) as u8;
        }
    };
    let iscale = -(nmax as f32) / max;
    fill(iscale);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            fill(iscale);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// The shared part of Q4_K and Q5_K: per 32-weight sub-block a searched scale and min, both
/// stored in 6 bits against the super-block's largest; returns the block's `d`, `dmin` (as
/// stored) and the final quants.
fn qn_k_block(xb: &[f32], nmax: i32, rmin: f32, nstep: i32, blk: &mut [u8]) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut weights = [0.0f32; 32];
    for (j, sb) in xb.chunks_exact(32).enumerate() {
        let sum_x2: f32 = sb.iter().map(|v| v * v).sum();
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(sb) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(
            nmax,
            sb,
            &weights,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
        );
    }
    // As ggml: an all-zero sub-block's min is -0.0, which must not become the maximum.
    let greatest = |v: &[f32]| v.iter().fold(0.0f32, |a, &v| if v > a { v } else { a });
    let max_scale = greatest(&scales);
    let max_min = greatest(&mins);
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut blk[4..16];
    sc.fill(0);
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        // `as u8` wraps a negative like C's uint8_t cast, before the clamp to 63.
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls[j];
            sc[j + 4] = lm[j];
        } else {
            sc[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            sc[j - 4] |= (ls[j] >> 4) << 6;
            sc[j] |= (lm[j] >> 4) << 6;
        }
    }
    let d16 = f32_to_f16_bits(max_scale / 63.0);
    let dm16 = f32_to_f16_bits(max_min / 63.0);
    blk[0..2].copy_from_slice(&d16.to_le_bytes());
    blk[2..4].copy_from_slice(&dm16.to_le_bytes());
    let (d, dmin) = (f16_bits_to_f32(d16), f16_bits_to_f32(dm16));
    for j in 0..8 {
        let dj = d * f32::from(ls[j]);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * f32::from(lm[j]);
        for i in 0..32 {
            l[32 * j + i] = nearest_int((xb[32 * j + i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    l
}

/// ggml's `quantize_row_q4_K_ref`.
pub(crate) fn quant_q4_k(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q4_K_BYTES)) {
        let l = qn_k_block(xb, 15, -1.0, 20, blk);
        let qs = &mut blk[16..];
        for c in 0..4 {
            for i in 0..32 {
                qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
    }
}

/// ggml's `quantize_row_q5_K_ref`.
pub(crate) fn quant_q5_k(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q5_K_BYTES)) {
        let l = qn_k_block(xb, 31, -0.5, 15, blk);
        let (qh, qs) = blk[16..].split_at_mut(32);
        qh.fill(0);
        for c in 0..4 {
            for i in 0..32 {
                let (l1, l2) = (l[64 * c + i], l[64 * c + 32 + i]);
                qh[i] |= ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
                qs[32 * c + i] = (l1 & 15) | ((l2 & 15) << 4);
            }
        }
    }
}

/// ggml's `quantize_row_q6_K_ref`.
pub(crate) fn quant_q6_k(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q6_K_BYTES)) {
        let mut scales = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        let mut l = [0u8; QK_K];
        for ((s, sb), lb) in scales
            .iter_mut()
            .zip(xb.chunks_exact(16))
            .zip(l.chunks_exact_mut(16))
        {
            *s = make_qx_quants(32, sb, lb);
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = *s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            blk.fill(0);
            continue;
        }
        let iscale = -128.0 / max_scale;
        let d16 = f32_to_f16_bits(1.0 / iscale);
        let d = f16_bits_to_f32(d16);
        let mut sc = [0i8; QK_K / 16];
        for (q, &s) in sc.iter_mut().zip(&scales) {
            // Always in -128..=127: `iscale * max_scale` is -128 and the rest are smaller.
            *q = nearest_int(iscale * s).min(127) as i8;
        }
        for (j, &s) in sc.iter().enumerate() {
            let dj = d * f32::from(s);
            if dj == 0.0 {
                // ggml leaves these quants as make_qx_quants set them; any decodes to 0.
                continue;
            }
            for i in 0..16 {
                l[16 * j + i] = (nearest_int(xb[16 * j + i] / dj).clamp(-32, 31) + 32) as u8;
            }
        }
        pack_q6_k(&l, &sc, d16, blk);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{WeightType, blocks, dequantize_row};
    use super::*;
    use crate::gguf::testutil::large_test_model;

    /// RMS error of `x` through a quantizer and `t`'s dequantizer.
    fn rms(t: WeightType, x: &[f32], quantize: fn(&[f32], &mut [u8])) -> f64 {
        let mut bytes = vec![0u8; t.row_bytes(x.len()).unwrap()];
        quantize(x, &mut bytes);
        let mut y = vec![0f32; x.len()];
        dequantize_row(t, &bytes, &mut y).unwrap();
        let se: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum();
        (se / x.len() as f64).sqrt()
    }

    /// Real weights at near-f32 precision: Qwen2.5's output projection (stored as Q8_0, 256
    /// levels a block), its first 128 rows, dequantized. (SmolLM2's Q4_1 weights would not
    /// do: they already sit on a 16-level grid that plain rounding reproduces.)
    fn real_weights() -> Vec<f32> {
        let t = large_test_model().tensor("output.weight").unwrap();
        let wt = WeightType::from_ggml_id(t.dtype.id()).unwrap();
        let cols = t.dims[0] as usize;
        let rows = 128;
        let rb = wt.row_bytes(cols).unwrap();
        let mut x = vec![0f32; rows * cols];
        dequantize_row(wt, &t.data[..rows * rb], &mut x).unwrap();
        assert_eq!(x.len() % QK_K, 0);
        x
    }

    /// The searched scales beat plain rounding on real weights, for every K type, by a clear
    /// margin (the figures are in docs/quantize.md).
    #[test]
    fn searched_k_quants_beat_plain_rounding_on_real_weights() {
        let x = real_weights();
        let plain_q4 = |x: &[f32], o: &mut [u8]| blocks::quant_qn_k(x, o, 4);
        let plain_q5 = |x: &[f32], o: &mut [u8]| blocks::quant_qn_k(x, o, 5);
        type Quantizer = fn(&[f32], &mut [u8]);
        let cases: [(WeightType, Quantizer, Quantizer); 3] = [
            (WeightType::Q4_K, quant_q4_k, plain_q4),
            (WeightType::Q5_K, quant_q5_k, plain_q5),
            (WeightType::Q6_K, quant_q6_k, blocks::quant_q6_k),
        ];
        for (t, searched, plain) in cases {
            let (s, p) = (rms(t, &x, searched), rms(t, &x, plain));
            eprintln!(
                "{t}: searched rms {s:.4e}, plain {p:.4e}, ratio {:.3}",
                s / p
            );
            assert!(s < 0.97 * p, "{t}: searched {s:e} not below plain {p:e}");
        }
    }

    /// Byte for byte what ggml writes. `testdata/weights.f32` holds 4 rows of SmolLM2's
    /// `blk.0.ffn_down.weight` (dequantized by the `gguf` package), 2048 Gaussian weights
    /// with outliers, an all-zero and an all-positive super-block, and super-block 11872 of
    /// Qwen2.5's Q6_K `blk.6.ffn_down.weight` (dequantized by ggml), whose Q4_K scale search
    /// lands on a near tie that only ggml's order of operations breaks the same way;
    /// `testdata/ggml-q*_k.bin` are
    /// llama.cpp's `quantize_row_q{4,5,6}_K_ref` (ggml-quants.c as vendored by
    /// llama-cpp-python 0.3.36, built with `gcc -O2`) of it.
    #[test]
    fn bit_identical_to_ggml_reference() {
        let x: Vec<f32> = include_bytes!("testdata/weights.f32")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let cases: [(WeightType, &[u8]); 3] = [
            (WeightType::Q4_K, include_bytes!("testdata/ggml-q4_k.bin")),
            (WeightType::Q5_K, include_bytes!("testdata/ggml-q5_k.bin")),
            (WeightType::Q6_K, include_bytes!("testdata/ggml-q6_k.bin")),
        ];
        for (t, want) in cases {
            let mut got = vec![0u8; t.row_bytes(x.len()).unwrap()];
            super::super::quantize_row(t, &x, &mut got).unwrap();
            assert_eq!(got.len(), want.len(), "{t}");
            let first = got.iter().zip(want).position(|(a, b)| a != b);
            assert_eq!(first, None, "{t}: first difference at byte {first:?}");
        }
    }

    #[test]
    fn nearest_int_rounds_half_to_even_like_ggml() {
        assert_eq!(
            [0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6, 4_194_303.0, -5e6, 1e9].map(nearest_int),
            [0, 2, 2, 0, -2, 2, -3, 4_194_303, -5_000_000, 1_000_000_000]
        );
        for i in -100_000..100_000 {
            let v = i as f32 * 0.013_7;
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
        }
    }

    /// A constant block, an all-zero block and one with a single outlier decode sensibly.
    #[test]
    fn edge_blocks() {
        for t in [WeightType::Q4_K, WeightType::Q5_K, WeightType::Q6_K] {
            let mut outlier = vec![0.01f32; QK_K];
            outlier[7] = 5.0;
            for x in [vec![0.0f32; QK_K], vec![-0.25f32; QK_K], outlier] {
                let mut bytes = vec![0u8; t.block_bytes()];
                super::super::quantize_row(t, &x, &mut bytes).unwrap();
                let mut y = vec![0f32; QK_K];
                dequantize_row(t, &bytes, &mut y).unwrap();
                let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
                for (a, b) in x.iter().zip(&y) {
                    assert!((a - b).abs() <= amax / 8.0 + 1e-6, "{t}: {a} vs {b}");
                }
            }
        }
    }
}
