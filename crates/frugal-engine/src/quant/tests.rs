//! Tests of the quant module: hand-built blocks, the reference codecs, repacking, and every
//! matmul kernel against an f64 reference.
//!
//! Tolerance of `matmul` against the f64 reference: the integer dot of each block is exact, so
//! the only error is f32 rounding of the per-block scale products and of the accumulation.
//! We allow `1e-5 * S` where `S = sum_i (|w_i| + 2 |m_i|) |x_i|` (the sum of the absolute
//! terms, `m_i` the Q4_1 block min of weight i, else 0). The activations the reference uses
//! are the dequantized Q8 activations for the integer paths and the f32 inputs for the
//! F32/F16/K path.

use super::blocks::{self, QK, QK_K};
use super::packed::{self, ActRef, MAX_NB, PackKind, TILE, TileGeom};
use super::*;

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }

    /// Roughly normal (sum of four uniforms), unit-ish spread.
    fn normal(&mut self) -> f32 {
        (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * 0.87
    }
}

fn pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap()
}

fn random_values(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut v = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        // Per-row offset and spread so Q4_1's min and the scales vary.
        let bias = 0.3 * rng.uniform();
        let scale = 0.05 + 0.5 * (r % 7) as f32 / 7.0;
        for _ in 0..cols {
            v.push(bias + scale * rng.normal());
        }
    }
    v
}

/// A random matrix of type `t` and its GGUF bytes.
fn random_matrix(t: WeightType, rows: usize, cols: usize, seed: u64) -> (QMatrix, Vec<u8>) {
    let vals = random_values(rows, cols, seed);
    let rb = t.row_bytes(cols).unwrap();
    let mut bytes = vec![0u8; rb * rows];
    for (x, o) in vals.chunks_exact(cols).zip(bytes.chunks_exact_mut(rb)) {
        quantize_row(t, x, o).unwrap();
    }
    (QMatrix::from_bytes(t, rows, cols, &bytes).unwrap(), bytes)
}

fn random_input(batch: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed ^ 0xABCD);
    (0..batch * cols)
        .map(|i| rng.normal() * (1.0 + (i % 5) as f32 * 0.3))
        .collect()
}

/// The activations as the integer kernels see them: dequantized Q8 blocks.
fn dequantized_activations(x: &[f32]) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    let mut q = [0i8; QK];
    for xb in x.chunks_exact(QK) {
        let (d, _, _) = packed::quantize_act_block(xb, &mut q);
        out.extend(q.iter().map(|&v| f64::from(d) * f64::from(v)));
    }
    out
}

/// f64 reference and the error scale `S` of the module docs, per output.
fn reference(w: &QMatrix, gguf: &[u8], x: &[f32], batch: usize) -> (Vec<f64>, Vec<f64>) {
    let (rows, cols) = (w.rows(), w.cols());
    let t = w.weight_type();
    let xs: Vec<f64> = if t.pack_kind().is_some() {
        dequantized_activations(x)
    } else {
        x.iter().map(|&v| f64::from(v)).collect()
    };
    let rb = t.row_bytes(cols).unwrap();
    let mut refv = vec![0f64; batch * rows];
    let mut scale = vec![0f64; batch * rows];
    let mut wr = vec![0f32; cols];
    for r in 0..rows {
        w.dequantize_row(r, &mut wr).unwrap();
        let mins: Vec<f64> = (0..cols)
            .map(|i| {
                let blk = &gguf[r * rb + (i / t.block_size()) * t.block_bytes()..];
                let f16 = |at| f64::from(blocks::f16_bits_to_f32(blocks::read_u16(blk, at)));
                match t {
                    WeightType::Q4_1 | WeightType::Q5_1 => f16(2).abs(),
                    WeightType::Q4_K | WeightType::Q5_K => {
                        let (_, m) = blocks::scale_min_k4((i % QK_K) / QK, &blk[4..16]);
                        f16(2).abs() * f64::from(m)
                    }
                    _ => 0.0,
                }
            })
            .collect();
        for b in 0..batch {
            let xb = &xs[b * cols..(b + 1) * cols];
            let mut acc = 0f64;
            let mut s = 0f64;
            for i in 0..cols {
                acc += f64::from(wr[i]) * xb[i];
                s += (f64::from(wr[i]).abs() + 2.0 * mins[i]) * xb[i].abs();
            }
            refv[b * rows + r] = acc;
            scale[b * rows + r] = s;
        }
    }
    (refv, scale)
}

/// The types the integer kernels read.
/// Each of the first `rows` rows of `w` (512 wide) reads back exactly what its GGUF bytes do.
fn assert_rows_read_as_gguf(t: WeightType, w: &QMatrix, gguf: &[u8], rows: usize) {
    let rb = t.row_bytes(512).unwrap();
    let (mut got, mut want) = (vec![0f32; 512], vec![0f32; 512]);
    for r in 0..rows {
        w.dequantize_row(r, &mut got).unwrap();
        dequantize_row(t, &gguf[r * rb..(r + 1) * rb], &mut want).unwrap();
        assert_eq!(got, want, "{t} row {r}");
    }
}

fn packed_types() -> Vec<WeightType> {
    WeightType::ALL
        .into_iter()
        .filter(|t| t.has_fast_kernel())
        .collect()
}

fn available_kernels() -> Vec<Kernel> {
    [Kernel::Scalar, Kernel::Avx2, Kernel::Avx512Vnni]
        .into_iter()
        .filter(|k| k.is_available())
        .collect()
}

fn check_against_reference(t: WeightType, rows: usize, cols: usize, batches: &[usize]) {
    let pool = pool();
    let (w, gguf) = random_matrix(t, rows, cols, (rows * 31 + cols) as u64);
    for &batch in batches {
        let x = random_input(batch, cols, (batch * 7 + cols) as u64);
        let (refv, scale) = reference(&w, &gguf, &x, batch);
        let mut scratch = Scratch::new();
        let input = scratch.quantize(&x, batch, cols).unwrap();
        for kernel in available_kernels() {
            let mut out = vec![f32::NAN; batch * rows];
            matmul_input_with_kernel(&w, &input, &mut out, &pool, kernel).unwrap();
            for (i, (&o, (&r, &s))) in out.iter().zip(refv.iter().zip(&scale)).enumerate() {
                let err = (f64::from(o) - r).abs();
                assert!(
                    err <= 1e-5 * s + 1e-30,
                    "{t} {rows}x{cols} batch {batch} {kernel:?} out[{i}] = {o}, ref {r}, \
                     err {err:e}, scale {s:e}"
                );
            }
        }
        // The convenience entry point (thread-local scratch, best kernel) agrees.
        let mut out = vec![0f32; batch * rows];
        matmul(&w, &x, batch, &mut out, &pool).unwrap();
        for (&o, (&r, &s)) in out.iter().zip(refv.iter().zip(&scale)) {
            assert!((f64::from(o) - r).abs() <= 1e-5 * s + 1e-30);
        }
    }
}

#[test]
fn weight_type_ids_and_sizes() {
    for t in WeightType::ALL {
        assert_eq!(WeightType::from_ggml_id(t.ggml_id()).unwrap(), t);
    }
    let sizes: Vec<(usize, usize)> = WeightType::ALL
        .iter()
        .map(|t| (t.block_size(), t.block_bytes()))
        .collect();
    assert_eq!(
        sizes,
        [
            (1, 4),
            (1, 2),
            (32, 18),
            (32, 20),
            (32, 22),
            (32, 24),
            (32, 34),
            (256, 144),
            (256, 176),
            (256, 210)
        ]
    );
    assert_eq!(WeightType::Q4_1.row_bytes(576).unwrap(), 18 * 20);
    assert_eq!(
        WeightType::from_ggml_id(10),
        Err(QuantError::UnsupportedGgmlType(10))
    );
    assert_eq!(
        WeightType::from_ggml_id(99),
        Err(QuantError::UnsupportedGgmlType(99))
    );
}

#[test]
fn dequant_f32_f16_hand_values() {
    let mut bytes = Vec::new();
    for v in [1.0f32, -2.5, 0.0] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    let mut out = [0f32; 3];
    dequantize_row(WeightType::F32, &bytes, &mut out).unwrap();
    assert_eq!(out, [1.0, -2.5, 0.0]);
    // f16 1.0 = 0x3C00, -2.0 = 0xC000, 0.5 = 0x3800
    dequantize_row(
        WeightType::F16,
        &[0x00, 0x3C, 0x00, 0xC0, 0x00, 0x38],
        &mut out,
    )
    .unwrap();
    assert_eq!(out, [1.0, -2.0, 0.5]);
}

#[test]
fn dequant_q4_0_hand_block() {
    // d = 0.5; byte i = i (low nibble) | (15 - i) << 4 (high nibble).
    let mut blk = vec![0x00, 0x38];
    blk.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
    let mut out = [0f32; 32];
    dequantize_row(WeightType::Q4_0, &blk, &mut out).unwrap();
    assert_eq!(out[0], -4.0); // (0 - 8) * 0.5
    assert_eq!(out[9], 0.5); // (9 - 8) * 0.5
    assert_eq!(out[15], 3.5);
    assert_eq!(out[16], 3.5); // high nibble of byte 0 = 15
    assert_eq!(out[31], -4.0); // high nibble of byte 15 = 0
    for i in 0..16 {
        assert_eq!(out[i], (i as f32 - 8.0) * 0.5);
        assert_eq!(out[16 + i], (7.0 - i as f32) * 0.5);
    }
}

#[test]
fn dequant_q4_1_hand_block() {
    // d = 0.25, m = -1.0; every byte 0x5A: low nibble 10, high nibble 5.
    let mut blk = vec![0x00, 0x34, 0x00, 0xBC];
    blk.extend([0x5Au8; 16]);
    let mut out = [0f32; 32];
    dequantize_row(WeightType::Q4_1, &blk, &mut out).unwrap();
    assert!(out[..16].iter().all(|&v| v == 1.5)); // 10 * 0.25 - 1
    assert!(out[16..].iter().all(|&v| v == 0.25)); // 5 * 0.25 - 1
}

#[test]
fn dequant_q8_0_hand_block() {
    // d = 2.0, quants -16..16.
    let mut blk = vec![0x00, 0x40];
    blk.extend((-16i8..16).map(|q| q as u8));
    let mut out = [0f32; 32];
    dequantize_row(WeightType::Q8_0, &blk, &mut out).unwrap();
    assert_eq!(out[0], -32.0);
    assert_eq!(out[16], 0.0);
    assert_eq!(out[31], 30.0);
}

#[test]
fn dequant_q4_k_hand_block() {
    // d = 1.0, dmin = 0.5; sub-block scales 1..8, mins [0, 1, 2, 3, 16, 17, 18, 19] packed as
    // ggml's get_scale_min_k4 reads them; every quant byte 0x3A (low 10, high 3).
    let mut blk = vec![0x00, 0x3C, 0x00, 0x38];
    blk.extend([1, 2, 3, 4, 64, 65, 66, 67, 5, 22, 39, 56]);
    blk.extend([0x3Au8; 128]);
    let mut out = [0f32; 256];
    dequantize_row(WeightType::Q4_K, &blk, &mut out).unwrap();
    // Sub-block j covers weights 32j..32j+32; even j use low nibbles (10), odd j high (3).
    // value = sc * q - 0.5 * m
    let expect = [10.0, 5.5, 29.0, 10.5, 42.0, 9.5, 61.0, 14.5];
    for (i, &v) in out.iter().enumerate() {
        assert_eq!(v, expect[i / 32], "weight {i}");
    }
}

#[test]
fn dequant_q6_k_hand_block() {
    // ql bytes 0x21 (low 1, high 2), qh bytes 0xE4 (2-bit fields 0, 1, 2, 3), scales
    // 1, -1, 2, -2, ..., d = 0.5. In each 128 half, the four 32-weight groups get
    // q = 1|0<<4, 1|1<<4, 2|2<<4, 2|3<<4 minus 32 = -31, -15, 2, 18.
    let mut blk = vec![0x21u8; 128];
    blk.extend([0xE4u8; 64]);
    let scales: Vec<i8> = (0..16)
        .map(|i| if i % 2 == 0 { i / 2 + 1 } else { -(i / 2 + 1) })
        .collect();
    blk.extend(scales.iter().map(|&s| s as u8));
    blk.extend([0x00, 0x38]);
    let mut out = [0f32; 256];
    dequantize_row(WeightType::Q6_K, &blk, &mut out).unwrap();
    let q = [-31.0f32, -15.0, 2.0, 18.0];
    for (i, &v) in out.iter().enumerate() {
        let want = 0.5 * f32::from(scales[i / 16]) * q[(i % 128) / 32];
        assert_eq!(v, want, "weight {i}");
    }
    assert_eq!(out[0], -15.5); // 0.5 * 1 * -31
    assert_eq!(out[40], -15.0); // 0.5 * scales[2] (= 2) * -15
    assert_eq!(out[200], 7.0); // 0.5 * scales[12] (= 7) * 2 (group 2 of the second half)
}

#[test]
fn dequant_q5_hand_blocks() {
    // Nibbles 0x21: low 1 (weights 0..16), high 2 (weights 16..32); qh sets the fifth bit
    // of weights 0..16 only: q = 17 and 2.
    let (d, m) = (0x3800u16.to_le_bytes(), 0x3C00u16.to_le_bytes()); // 0.5, 1.0
    let qh = 0x0000_FFFFu32.to_le_bytes();
    let mut q5_0 = [d.as_slice(), &qh, &[0x21; 16]].concat();
    let mut out = [0f32; 32];
    dequantize_row(WeightType::Q5_0, &q5_0, &mut out).unwrap();
    assert_eq!(out[..16], [0.5; 16]); // (17 - 16) * 0.5
    assert_eq!(out[16..], [-7.0; 16]); // (2 - 16) * 0.5
    let q5_1 = [d.as_slice(), &m, &qh, &[0x21; 16]].concat();
    dequantize_row(WeightType::Q5_1, &q5_1, &mut out).unwrap();
    assert_eq!(out[..16], [9.5; 16]); // 17 * 0.5 + 1
    assert_eq!(out[16..], [2.0; 16]); // 2 * 0.5 + 1
    // The fifth bit of weight 31 is qh's top bit.
    q5_0[5] = 0x80;
    dequantize_row(WeightType::Q5_0, &q5_0, &mut out).unwrap();
    assert_eq!((out[30], out[31]), (-7.0, 1.0)); // (2 | 16) - 16 = 2 -> 1.0
}

/// The formats of 32-weight blocks.
const FORMATS_32: [WeightType; 5] = [
    WeightType::Q8_0,
    WeightType::Q4_0,
    WeightType::Q4_1,
    WeightType::Q5_0,
    WeightType::Q5_1,
];

#[test]
fn quantizers_round_trip_within_bounds() {
    let x = random_values(4, 256, 5);
    for t in FORMATS_32.into_iter().chain([WeightType::F16]) {
        let mut bytes = vec![0u8; t.row_bytes(x.len()).unwrap()];
        quantize_row(t, &x, &mut bytes).unwrap();
        let mut y = vec![0f32; x.len()];
        dequantize_row(t, &bytes, &mut y).unwrap();
        for (xb, yb) in x.chunks(QK).zip(y.chunks(QK)) {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let range = xb.iter().fold(f32::MIN, |a, &v| a.max(v))
                - xb.iter().fold(f32::MAX, |a, &v| a.min(v));
            // Half a step of each format, plus the f16 rounding of the scale (2^-11 relative,
            // times up to 127 steps for Q8_0); Q4_0 can clip the positive end by a whole step.
            let bound = match t {
                WeightType::Q8_0 => amax / 127.0 * 0.57,
                WeightType::Q4_0 => amax / 8.0 * 1.01,
                WeightType::Q4_1 => range / 15.0 * 0.51 + amax * 1e-3,
                WeightType::Q5_0 => amax / 16.0 * 1.01,
                WeightType::Q5_1 => range / 31.0 * 0.51 + amax * 1e-3,
                _ => amax * 1e-3,
            };
            for (a, b) in xb.iter().zip(yb) {
                assert!(
                    (a - b).abs() <= bound + 1e-7,
                    "{t}: {a} vs {b}, bound {bound}"
                );
            }
        }
    }
}

/// The plain K quantizers: within a step of the super-block's coarsest sub-block scale (a
/// loose bound: the 6-bit scales and mins round too), and exact on zeros.
#[test]
fn k_quantizers_round_trip_within_bounds() {
    let x = random_values(4, 512, 6);
    for (t, levels) in [
        (WeightType::Q4_K, 15.0),
        (WeightType::Q5_K, 31.0),
        (WeightType::Q6_K, 63.0),
    ] {
        let mut bytes = vec![0u8; t.row_bytes(x.len()).unwrap()];
        quantize_row(t, &x, &mut bytes).unwrap();
        let mut y = vec![0f32; x.len()];
        dequantize_row(t, &bytes, &mut y).unwrap();
        for (xb, yb) in x.chunks(QK_K).zip(y.chunks(QK_K)) {
            let range = xb.iter().fold(f32::MIN, |a, &v| a.max(v))
                - xb.iter().fold(f32::MAX, |a, &v| a.min(v)).min(0.0);
            let bound = range / levels * 1.2;
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= bound, "{t}: {a} vs {b}, bound {bound}");
            }
        }
        quantize_row(t, &[0.0; 256], &mut bytes[..t.block_bytes()]).unwrap();
        dequantize_row(t, &bytes[..t.block_bytes()], &mut y[..256]).unwrap();
        assert!(y[..256].iter().all(|&v| v == 0.0), "{t}");
    }
}

#[test]
fn packed_rows_dequantize_like_gguf() {
    for t in packed_types() {
        // 37 rows: the last tile is partly padding.
        let (w, gguf) = random_matrix(t, 37, 512, 11);
        assert_rows_read_as_gguf(t, &w, &gguf, 37);
        // Resident at the file's size: tile padding (3 of 48 rows) plus, for Q4_K / Q5_K,
        // the unpacked 6-bit scales.
        let per_row = w.bytes() as f64 / 48.0 / t.row_bytes(512).unwrap() as f64;
        assert!((1.0..1.04).contains(&per_row), "{t} {per_row}");
    }
}

#[test]
fn bad_lengths_are_errors() {
    let mut out = [0f32; 32];
    assert!(matches!(
        dequantize_row(WeightType::Q4_0, &[0u8; 17], &mut out),
        Err(QuantError::Length { .. })
    ));
    assert!(matches!(
        dequantize_row(WeightType::Q4_0, &[0u8; 18], &mut out[..31]),
        Err(QuantError::NotBlockMultiple { .. })
    ));
    assert!(matches!(
        QMatrix::from_bytes(WeightType::Q8_0, 2, 32, &[0u8; 67]),
        Err(QuantError::Length {
            expected: 68,
            got: 67,
            ..
        })
    ));
    assert!(matches!(
        QMatrix::from_bytes(WeightType::Q4_K, 1, 128, &[0u8; 72]),
        Err(QuantError::NotBlockMultiple { .. })
    ));
    assert_eq!(
        QMatrix::from_bytes(WeightType::F32, 1, 0, &[]).err(),
        Some(QuantError::NoColumns)
    );
    let w = QMatrix::from_bytes(WeightType::Q8_0, 2, 32, &[0u8; 68]).unwrap();
    assert!(matches!(
        w.dequantize_row(2, &mut out),
        Err(QuantError::RowOutOfRange { .. })
    ));
    assert!(matches!(
        w.dequantize_row(0, &mut out[..16]),
        Err(QuantError::Length { .. })
    ));
    let f = QMatrix::from_bytes(WeightType::F32, 2, 32, &[0u8; 256]).unwrap();
    assert_eq!(
        QMatrix::stack(vec![f]).err(),
        Some(QuantError::Stack("F32 and F16 parts do not stack"))
    );
    let (odd, _) = random_matrix(WeightType::Q4_0, 3, 32, 1);
    assert!(matches!(
        QMatrix::stack(vec![odd, w.clone()]),
        Err(QuantError::Stack(_))
    ));
    let pool = pool();
    let x = [0f32; 64];
    let mut o = [0f32; 4];
    assert!(matches!(
        matmul(&w, &x[..63], 2, &mut o, &pool),
        Err(QuantError::Length { .. })
    ));
    assert!(matches!(
        matmul(&w, &x, 2, &mut o[..3], &pool),
        Err(QuantError::Length { .. })
    ));
    let mut scratch = Scratch::new();
    let input = scratch.quantize(&x, 2, 32).unwrap();
    assert!(matches!(
        matmul_rows(&w, &input, 1..3, &mut o),
        Err(QuantError::RowRange { .. })
    ));
    let mut q = [0u8; 18];
    assert!(matches!(
        quantize_row(WeightType::Q4_K, &[0f32; 256], &mut q),
        Err(QuantError::Length { .. })
    ));
}

/// `t` against the reference at 1, 3 and 16 rows of activations: one whole tile, a ragged
/// last tile, and a model's shape.
fn check_at_model_shapes(t: WeightType) {
    check_against_reference(t, 64, 256, &[1, 3, 16]);
    check_against_reference(t, 40, 608, &[1, 3, 16]);
    check_against_reference(t, 576, 1536, &[1, 3, 16]);
}

#[test]
fn matmul_q8_0_matches_reference() {
    check_at_model_shapes(WeightType::Q8_0);
}

#[test]
fn matmul_q4_0_matches_reference() {
    check_at_model_shapes(WeightType::Q4_0);
}

#[test]
fn matmul_q4_1_matches_reference() {
    check_at_model_shapes(WeightType::Q4_1);
}

#[test]
fn matmul_q5_match_reference() {
    for t in [WeightType::Q5_0, WeightType::Q5_1] {
        check_against_reference(t, 64, 256, &[1, 3, 16]);
        check_against_reference(t, 40, 608, &[1, 3, 16]);
        check_against_reference(t, 200, 896, &[1, 9]);
    }
}

#[test]
fn matmul_k_quants_match_reference() {
    for t in [WeightType::Q4_K, WeightType::Q5_K, WeightType::Q6_K] {
        check_against_reference(t, 64, 256, &[1, 3, 16]);
        check_against_reference(t, 48, 1536, &[1, 3, 16]);
        check_against_reference(t, 37, 768, &[2, 9]);
    }
}

/// A fused matrix of mixed types computes each part with its own kernel.
#[test]
fn stacked_parts_match_separate_matmuls() {
    let pool = pool();
    let parts = [
        random_matrix(WeightType::Q5_0, 32, 256, 1).0,
        random_matrix(WeightType::Q6_K, 16, 256, 2).0,
        random_matrix(WeightType::Q8_0, 21, 256, 3).0,
    ];
    let w = QMatrix::stack(parts.to_vec()).unwrap();
    assert_eq!((w.rows(), w.cols()), (69, 256));
    assert_eq!(w.bytes(), parts.iter().map(QMatrix::bytes).sum::<usize>());
    let x = random_input(5, 256, 4);
    let mut scratch = Scratch::new();
    let input = scratch.quantize(&x, 5, 256).unwrap();
    for kernel in available_kernels() {
        let mut all = vec![0f32; 5 * 69];
        matmul_input_with_kernel(&w, &input, &mut all, &pool, kernel).unwrap();
        let mut at = 0;
        for p in &parts {
            let mut one = vec![0f32; 5 * p.rows()];
            matmul_input_with_kernel(p, &input, &mut one, &pool, kernel).unwrap();
            for b in 0..5 {
                assert_eq!(
                    &all[b * 69 + at..b * 69 + at + p.rows()],
                    &one[b * p.rows()..(b + 1) * p.rows()],
                    "{kernel:?}"
                );
            }
            at += p.rows();
        }
    }
    let (mut a, mut b) = (vec![0f32; 256], vec![0f32; 256]);
    for (r, part, pr) in [(5, 0, 5), (40, 1, 8), (50, 2, 2)] {
        w.dequantize_row(r, &mut a).unwrap();
        parts[part].dequantize_row(pr, &mut b).unwrap();
        assert_eq!(a, b, "row {r}");
    }
}

#[test]
fn matmul_f32_f16_match_reference() {
    check_against_reference(WeightType::F32, 64, 256, &[1, 3, 16]);
    check_against_reference(WeightType::F16, 64, 256, &[1, 3, 16]);
    // Columns that are no multiple of 32 or 256.
    check_against_reference(WeightType::F32, 19, 100, &[1, 3]);
    check_against_reference(WeightType::F16, 19, 300, &[1, 3]);
}

/// The SIMD tile kernels against the scalar one, tile by tile: identical integers, so the
/// outputs agree to float rounding of the scale products (1e-5 of the absolute-term sum).
#[test]
fn simd_tiles_match_scalar() {
    for t in packed_types() {
        let (w, _) = random_matrix(t, 32, 512, 9);
        let Repr::Packed(ps) = &w.repr else {
            panic!("not packed")
        };
        let p = &ps[0];
        let x = random_input(11, 512, 10);
        let mut scratch = Scratch::new();
        let input = scratch.quantize(&x, 11, 512).unwrap();
        let act = input.act.unwrap();
        let kernels = available_kernels().into_iter();
        for (kernel, pf) in kernels.flat_map(|k| Prefetch::ALL.map(|p| (k, p))) {
            let isa = kernel.isa().unwrap();
            for tile in 0..2 {
                for (b0, nbat) in [(0, 1), (1, 2), (0, 8), (3, 8), (5, 6)] {
                    let mut want = [0f32; TILE * MAX_NB];
                    let call = TileCall {
                        kind: p.kind,
                        tile: p.tile(tile),
                        geom: p.geom(),
                        act,
                        b0,
                        nbat,
                    };
                    packed::tile_scalar(&call, &mut want);
                    let mut got = [0f32; TILE * MAX_NB];
                    tile_packed(p, tile, &act, b0, nbat, (isa, pf), &mut got);
                    for i in 0..nbat * TILE {
                        let tol = 1e-5 * want[i].abs().max(1.0);
                        assert!((got[i] - want[i]).abs() <= tol, "{t} {kernel:?} {pf} {i}");
                    }
                }
            }
        }
    }
}

#[test]
fn simd_activation_quantization_is_bit_exact() {
    let x: Vec<f32> = random_input(3, 96, 21).iter().map(|v| v * 3.0).collect();
    let mut x = x;
    x[40..72].fill(0.0); // an all-zero block
    let mut scratch = Scratch::new();
    let input = scratch.quantize(&x, 3, 96).unwrap();
    let act = input.act.unwrap();
    let mut q = [0i8; QK];
    for (k, xb) in x.chunks_exact(QK).enumerate() {
        let (d, s, lo) = packed::quantize_act_block(xb, &mut q);
        assert_eq!(&act.q[k * QK..(k + 1) * QK], &q[..], "block {k}");
        assert_eq!(act.d[k].to_bits(), d.to_bits());
        assert_eq!(act.sum[k], s);
        assert_eq!(act.lo[k], lo);
        assert_eq!(act.sd[k].to_bits(), (d * s as f32).to_bits());
    }
}

#[test]
fn requantize_q4_1_to_q8_0_and_q4_0_within_bounds() {
    let (w41, _) = random_matrix(WeightType::Q4_1, 20, 256, 17);
    let w8 = w41.requantize(WeightType::Q8_0).unwrap();
    let w40 = w41.requantize(WeightType::Q4_0).unwrap();
    assert_eq!(w8.weight_type(), WeightType::Q8_0);
    assert_eq!((w8.rows(), w8.cols()), (20, 256));
    let (mut a, mut b, mut c) = (vec![0f32; 256], vec![0f32; 256], vec![0f32; 256]);
    for r in 0..20 {
        w41.dequantize_row(r, &mut a).unwrap();
        w8.dequantize_row(r, &mut b).unwrap();
        w40.dequantize_row(r, &mut c).unwrap();
        for k in 0..256 / QK {
            let blk = &a[k * QK..(k + 1) * QK];
            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            for i in k * QK..(k + 1) * QK {
                // Q8_0: half a step of amax / 127, plus f16 rounding of the scale (2^-11 rel).
                assert!(
                    (a[i] - b[i]).abs() <= amax / 127.0 * 0.5 + amax * 6e-4,
                    "q8 {r} {i}"
                );
                // Q4_0: a step of amax / 8 at most (the clipped end), plus scale rounding.
                assert!((a[i] - c[i]).abs() <= amax / 8.0 * 1.001, "q4_0 {r} {i}");
            }
        }
    }
    // K formats requantize too (so Q4_K_M models can use the integer kernels).
    let (wk, _) = random_matrix(WeightType::Q4_K, 4, 256, 2);
    let wk8 = wk.requantize(WeightType::Q8_0).unwrap();
    wk.dequantize_row(1, &mut a).unwrap();
    wk8.dequantize_row(1, &mut b).unwrap();
    let amax = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= amax / 127.0));
}

#[test]
fn matmul_rows_and_shared_input() {
    let pool = pool();
    let (wq, _) = random_matrix(WeightType::Q4_0, 50, 128, 1);
    let (wk, _) = random_matrix(WeightType::Q8_0, 24, 128, 2);
    let x = random_input(5, 128, 3);
    let mut scratch = Scratch::new();
    let input = scratch.quantize(&x, 5, 128).unwrap();
    let mut full = vec![0f32; 5 * 50];
    matmul_input(&wq, &input, &mut full, &pool).unwrap();
    let mut part = vec![0f32; 5 * 27];
    matmul_rows(&wq, &input, 7..34, &mut part).unwrap();
    for b in 0..5 {
        assert_eq!(&part[b * 27..(b + 1) * 27], &full[b * 50 + 7..b * 50 + 34]);
    }
    // The same quantized input feeds a second matrix; equal to a fresh matmul.
    let mut k1 = vec![0f32; 5 * 24];
    matmul_input(&wk, &input, &mut k1, &pool).unwrap();
    let mut k2 = vec![0f32; 5 * 24];
    matmul(&wk, &x, 5, &mut k2, &pool).unwrap();
    assert_eq!(k1, k2);
    // batch 0 is a no-op.
    matmul(&wk, &[], 0, &mut [], &pool).unwrap();
}

#[test]
fn geometry_is_consistent() {
    let g = TileGeom::new(PackKind::Q4_1, 18);
    assert_eq!(g.d_off, 18 * 256);
    assert_eq!(g.m_off, 18 * 256 + 18 * 32);
    assert_eq!(g.used, 18 * 320);
    // Q6_K: quants, one f16 per super-block, two signed scales per block: its file size.
    let g = TileGeom::new(PackKind::Q6_K, 16);
    assert_eq!((g.d_off, g.sc_off), (16 * 384, 16 * 384 + 2 * 32));
    assert_eq!(g.used, 2 * TILE * blocks::Q6_K_BYTES);
    for kind in PackKind::ALL {
        let g = TileGeom::new(kind, 24);
        assert!(g.d_off <= g.m_off && g.m_off <= g.sc_off && g.sc_off <= g.used);
        assert!(g.block_scales(kind, 23) + 32 <= g.used);
    }
    let a = ActRef {
        q: &[],
        d: &[],
        sum: &[],
        lo: &[],
        sd: &[],
        neg8: &[],
        neg128: &[],
        nb: 1,
        batch: 1,
    };
    assert!(!a.is_consistent());
    let _ = QK_K;
}

/// With unit scales (weights d = 1, m = 1; activations integers with a 127 in every block, so
/// their scale is exactly 1) every output is an exact integer well below 2^24: each kernel
/// must reproduce the i64 reference bit for bit, which pins down the integer part of all
/// paths, offsets included.
#[test]
fn simd_integer_dots_are_exact() {
    let pool = pool();
    let (rows, cols, batch) = (35, 608, 11);
    let mut rng = Rng::new(77);
    let x: Vec<f32> = (0..batch * cols)
        .map(|i| {
            if i % 32 == 5 {
                127.0
            } else {
                (rng.next_u64() % 255) as f32 - 127.0
            }
        })
        .collect();
    for t in FORMATS_32 {
        let rb = t.row_bytes(cols).unwrap();
        let mut bytes: Vec<u8> = (0..rows * rb).map(|_| rng.next_u64() as u8).collect();
        for blk in bytes.chunks_exact_mut(t.block_bytes()) {
            blk[..2].copy_from_slice(&[0x00, 0x3C]); // d = 1.0
            if matches!(t, WeightType::Q4_1 | WeightType::Q5_1) {
                blk[2..4].copy_from_slice(&[0x00, 0x3C]); // m = 1.0
            }
        }
        let w = QMatrix::from_bytes(t, rows, cols, &bytes).unwrap();
        let mut want = vec![0f32; batch * rows];
        let mut wr = vec![0f32; cols];
        for r in 0..rows {
            w.dequantize_row(r, &mut wr).unwrap();
            for b in 0..batch {
                let dot: i64 = (0..cols)
                    .map(|i| wr[i] as i64 * x[b * cols + i] as i64)
                    .sum();
                want[b * rows + r] = dot as f32;
            }
        }
        let mut scratch = Scratch::new();
        let input = scratch.quantize(&x, batch, cols).unwrap();
        for kernel in available_kernels() {
            let mut got = vec![0f32; batch * rows];
            matmul_input_with_kernel(&w, &input, &mut got, &pool, kernel).unwrap();
            assert_eq!(got, want, "{t} {kernel:?}");
        }
    }
}

/// `FRUGAL_ISA` names, and selecting a kernel: the one already active is accepted again, a
/// different one is refused once matmuls ran, and one the CPU lacks is refused outright.
#[test]
fn kernel_names_and_selection() {
    for k in [Kernel::Avx512Vnni, Kernel::Avx2, Kernel::Scalar] {
        assert_eq!(Kernel::from_name(k.name()), Ok(k));
    }
    assert_eq!(
        Kernel::from_name("neon"),
        Err(QuantError::UnknownKernel("neon".into()))
    );
    let active = Kernel::active();
    assert_eq!(active.select(), Ok(()));
    for k in [Kernel::Avx512Vnni, Kernel::Avx2, Kernel::Scalar] {
        let got = k.select();
        if !k.is_available() {
            assert_eq!(got, Err(QuantError::KernelUnavailable(k)));
        } else if k != active {
            assert_eq!(got, Err(QuantError::KernelInUse { wanted: k, active }));
        }
    }
}

/// A packed matrix reads back the exact values of its GGUF bytes, and re-quantizing a type's
/// own values to a finer type of the same family keeps them within half the finer step.
#[test]
fn packed_rows_read_back_their_gguf_values() {
    for t in packed_types() {
        let (w, gguf) = random_matrix(t, 8, 512, 7);
        assert_rows_read_as_gguf(t, &w, &gguf, 8);
    }
}
