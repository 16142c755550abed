//! x86-64 SIMD kernels: AVX-512 VNNI (`vpdpbusd` on 16 rows per register) and an AVX2 fallback
//! (`vpmaddubsw` + `vpmaddwd` on 8 rows per register), plus the activation quantizers. One
//! kernel body per ISA serves every packed type: the type is a const parameter, so each
//! instance keeps only its own unpacking and scale arithmetic.
//!
//! Soundness rests on two things. The `#[target_feature]` functions are reached only through
//! the token types [`Avx512Vnni`] and [`Avx2`], which can only be made by runtime detection.
//! And the safe wrappers check every slice length the raw-pointer loops rely on before they
//! enter them, returning `false` instead of computing when a precondition fails.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::blocks::QK;
use super::packed::{MAX_NB, PackKind, Sums, TILE, TileCall, TileGeom};
use super::prefetch::Prefetch;
use super::wide::Wide;

/// Software prefetch distance into L1 ([`Prefetch::L1`]), in blocks of the tile being
/// streamed. A decode step streams each weight once, and on an Intel Xeon VM the hardware
/// prefetchers alone got the kernel to 7-11 GB/s on cold weights; prefetching 32 blocks (8 KiB
/// of Q4, 16 KiB of Q8) ahead reached ~30 GB/s (distances of 1-16 KiB and 16-64 blocks were
/// tried; 32 blocks was at or near the best for both Q4 and Q8).
const PREFETCH_BLOCKS: usize = 32;

/// Software prefetch distance into L2 ([`Prefetch::L2`]), in bytes. On AMD EPYC (Zen 4)
/// `prefetcht0` 8-16 KiB ahead held single-stream decode at 15-18 GB/s, while `prefetcht1`
/// 16 KiB ahead reached 26 GB/s of the ~29 GB/s two cores stream (8 KiB was 20% slower,
/// 32 KiB the same within noise; SmolLM2 Q4_0, Q8_0 and Qwen2.5 Q4_K_M files).
const PREFETCH_L2_BYTES: usize = 16 << 10;

const K_Q8_0: u8 = 0;
const K_Q4_0: u8 = 1;
const K_Q4_1: u8 = 2;
const K_Q5_0: u8 = 3;
const K_Q5_1: u8 = 4;
const K_Q4_K: u8 = 5;
const K_Q5_K: u8 = 6;
const K_Q6_K: u8 = 7;

const fn kind_id(kind: PackKind) -> u8 {
    match kind {
        PackKind::Q8_0 => K_Q8_0,
        PackKind::Q4_0 => K_Q4_0,
        PackKind::Q4_1 => K_Q4_1,
        PackKind::Q5_0 => K_Q5_0,
        PackKind::Q5_1 => K_Q5_1,
        PackKind::Q4_K => K_Q4_K,
        PackKind::Q5_K => K_Q5_K,
        PackKind::Q6_K => K_Q6_K,
    }
}

/// The kind behind a const id (the inverse of `kind_id`).
const fn kind_of(id: u8) -> PackKind {
    match id {
        K_Q8_0 => PackKind::Q8_0,
        K_Q4_0 => PackKind::Q4_0,
        K_Q4_1 => PackKind::Q4_1,
        K_Q5_0 => PackKind::Q5_0,
        K_Q5_1 => PackKind::Q5_1,
        K_Q4_K => PackKind::Q4_K,
        K_Q5_K => PackKind::Q5_K,
        _ => PackKind::Q6_K,
    }
}

/// Types whose quants have a fifth bit vector.
const fn has_q5(id: u8) -> bool {
    matches!(id, K_Q5_0 | K_Q5_1 | K_Q5_K)
}

/// Types with a per-row min term (`m`, or `-dmin * m` for the K types).
const fn has_min(id: u8) -> bool {
    matches!(id, K_Q4_1 | K_Q5_1 | K_Q4_K | K_Q5_K)
}

/// The preconditions of the raw loops: the geometry is the one `kind` and `nb` define (the
/// wrappers rebuild it rather than trust the caller's offsets), the tile holds `geom.used`
/// bytes, the activation arrays hold `act.batch * nb` blocks, and rows `b0 .. b0 + nbat` exist.
fn check(a: &TileCall<'_>) -> bool {
    let g = a.geom;
    let want = TileGeom::new(a.kind, g.nb);
    (g.d_off, g.m_off, g.sc_off, g.used) == (want.d_off, want.m_off, want.sc_off, want.used)
        && a.tile.len() >= g.used
        && a.act.nb == g.nb
        && a.act.is_consistent()
        && (1..=MAX_NB).contains(&a.nbat)
        && a.b0 + a.nbat <= a.act.batch
}

/// `a` with the geometry its kind and `nb` define, when [`check`] holds for it.
fn checked<'a>(a: &TileCall<'a>) -> Option<TileCall<'a>> {
    let a = TileCall {
        geom: TileGeom::new(a.kind, a.geom.nb),
        ..*a
    };
    check(&a).then_some(a)
}

/// The activations' arrays of a call from its row `b0` on, as a tile kernel reads them.
struct Reads {
    q: *const i8,
    d: *const f32,
    sum: *const i32,
    lo: *const i32,
    neg8: *const i32,
    neg128: *const i32,
    sd: *const f32,
}

/// Pointers to `a`'s tile and to its activations from row `b0` on.
///
/// # Safety
/// [`check`] must hold for `a`.
#[inline(always)]
unsafe fn reads(a: &TileCall<'_>) -> (*const u8, Reads) {
    let at = a.b0 * a.geom.nb;
    // SAFETY: `check` established that the activation arrays hold row `b0`'s blocks.
    let x = unsafe {
        Reads {
            q: a.act.q.as_ptr().add(at * QK),
            d: a.act.d.as_ptr().add(at),
            sum: a.act.sum.as_ptr().add(at),
            lo: a.act.lo.as_ptr().add(at),
            neg8: a.act.neg8.as_ptr().add(at),
            neg128: a.act.neg128.as_ptr().add(at),
            sd: a.act.sd.as_ptr().add(at),
        }
    };
    (a.tile.as_ptr(), x)
}

/// The blocks of `x` (whole rows of activations, a multiple of 32 long) when `q` holds as
/// many values and `d`, `s.sum`, `s.lo`, `s.sd` one per block: what `quantize` may write.
#[inline(always)]
fn act_blocks(x: &[f32], q: &[i8], d: &[f32], s: &Sums<'_>) -> Option<usize> {
    let n = x.len() / QK;
    let fits = x.len().is_multiple_of(QK)
        && q.len() == x.len()
        && [d.len(), s.sum.len(), s.lo.len(), s.sd.len()] == [n; 4];
    fits.then_some(n)
}

/// Calls `$kernel::<NB, KIND>($a, $out)`, one monomorphized kernel for each packing and
/// batch of 1 to 8 rows; returns false from the caller for any other pair.
macro_rules! dispatch {
    ($kernel:ident, $kind:expr, $nbat:expr, $a:expr, $out:expr, $pf:expr) => {
        dispatch!(@ $kernel, $kind, $nbat, $a, $out, $pf; 1 2 3 4 5 6 7 8)
    };
    (@ $kernel:ident, $kind:expr, $nbat:expr, $a:expr, $out:expr, $pf:expr; $($n:literal)*) => {
        match (kind_id($kind), $nbat) {
            $(
                (K_Q8_0, $n) => $kernel::<$n, K_Q8_0>($a, $out, $pf),
                (K_Q4_0, $n) => $kernel::<$n, K_Q4_0>($a, $out, $pf),
                (K_Q4_1, $n) => $kernel::<$n, K_Q4_1>($a, $out, $pf),
                (K_Q5_0, $n) => $kernel::<$n, K_Q5_0>($a, $out, $pf),
                (K_Q5_1, $n) => $kernel::<$n, K_Q5_1>($a, $out, $pf),
                (K_Q4_K, $n) => $kernel::<$n, K_Q4_K>($a, $out, $pf),
                (K_Q5_K, $n) => $kernel::<$n, K_Q5_K>($a, $out, $pf),
                (K_Q6_K, $n) => $kernel::<$n, K_Q6_K>($a, $out, $pf),
            )*
            _ => return false,
        }
    };
}

/// Activation rows per AVX2 kernel call.
const AVX2_NB: usize = 8;

/// Proof that the CPU runs AVX-512 F/BW/VL/VNNI; only [`Avx512Vnni::detect`] makes one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512Vnni(());

/// Proof that the CPU runs AVX2, FMA and F16C; only [`Avx2::detect`] makes one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2(());

impl Avx512Vnni {
    /// Runs `work` inside a function compiled for AVX-512, so its plain loops (f32 dots and
    /// sums, inlined there) vectorize 16 lanes wide instead of baseline x86-64's 4.
    #[inline]
    pub(crate) fn vectorized(self, work: impl Wide) {
        // SAFETY: `self` proves the CPU has the features `with_avx512` is compiled for.
        unsafe { with_avx512(work) }
    }

    pub(crate) fn detect() -> Option<Avx512Vnni> {
        (is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni"))
        .then_some(Avx512Vnni(()))
    }

    /// One tile against activation rows `b0 .. b0 + nbat`; `out[b * TILE + r]`; weights
    /// ahead prefetched as `pf` says.
    pub(crate) fn tile(
        self,
        a: &TileCall<'_>,
        out: &mut [f32; TILE * MAX_NB],
        pf: Prefetch,
    ) -> bool {
        let Some(a) = checked(a) else {
            return false;
        };
        // SAFETY: `self` proves the CPU has the features `vnni_tile` is compiled for, and
        // `check` established the lengths its pointer arithmetic relies on.
        unsafe {
            dispatch!(vnni_tile, a.kind, a.nbat, &a, out, pf);
        }
        true
    }

    /// Quantize whole rows of activations (`x.len()` a multiple of 32) into `q`, `d` and
    /// `s`'s sums. Returns false, writing nothing, if the lengths disagree.
    pub(crate) fn quantize(self, x: &[f32], q: &mut [i8], d: &mut [f32], s: Sums<'_>) -> bool {
        let Some(n) = act_blocks(x, q, d, &s) else {
            return false;
        };
        // SAFETY: features proven by `self`; all six slices hold exactly `n` blocks.
        unsafe { quantize_avx512(x.as_ptr(), n, q.as_mut_ptr(), d, s) };
        true
    }
}

impl Avx2 {
    /// As [`Avx512Vnni::vectorized`], 8 lanes wide.
    #[inline]
    pub(crate) fn vectorized(self, work: impl Wide) {
        // SAFETY: `self` proves the CPU has the features `with_avx2` is compiled for.
        unsafe { with_avx2(work) }
    }

    pub(crate) fn detect() -> Option<Avx2> {
        (is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        .then_some(Avx2(()))
    }

    pub(crate) fn tile(
        self,
        a: &TileCall<'_>,
        out: &mut [f32; TILE * MAX_NB],
        pf: Prefetch,
    ) -> bool {
        let Some(a) = checked(a) else {
            return false;
        };
        // 16 ymm registers hold at most 8 accumulators: do wider batches 8 rows at a time.
        let mut done = 0;
        while done < a.nbat {
            let n = AVX2_NB.min(a.nbat - done);
            let rows = TileCall {
                b0: a.b0 + done,
                nbat: n,
                ..a
            };
            let o = &mut out[done * TILE..];
            // SAFETY: `self` proves AVX2/FMA/F16C; `check` established the tile and activation
            // lengths for rows b0 .. b0 + nbat, and `o` holds (nbat - done) * TILE >= n * TILE
            // floats.
            unsafe {
                dispatch!(avx2_tile, a.kind, n, &rows, o, pf);
            }
            done += n;
        }
        true
    }

    pub(crate) fn quantize(self, x: &[f32], q: &mut [i8], d: &mut [f32], s: Sums<'_>) -> bool {
        let Some(n) = act_blocks(x, q, d, &s) else {
            return false;
        };
        // SAFETY: features proven by `self`; all six slices hold exactly `n` blocks.
        unsafe { quantize_avx2(x.as_ptr(), n, q.as_mut_ptr(), d, s) };
        true
    }
}

/// AVX-512 tile kernel. Per block: eight weight vectors (loaded, or unpacked from four nibble
/// vectors and the high-bit vectors), the per-row scales, then per activation row eight
/// `vpdpbusd` against 4-byte broadcasts, one convert and one FMA with the per-row scales. The
/// integer offset of Q8_0 (+128), Q4_0 (+8), Q5_0 (+16) and Q6_K (+32) is removed by starting
/// the accumulator at `-offset * sum(x)`, so the integer dot is exact.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI must be available and `check(a)` must hold, `a.nbat` being `NB`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vnni_tile<const NB: usize, const KIND: u8>(
    a: &TileCall<'_>,
    out: &mut [f32; TILE * MAX_NB],
    pf: Prefetch,
) {
    let kind = kind_of(KIND);
    let nb = a.geom.nb;
    let qb = kind.qb();
    // SAFETY (whole body): `check` guarantees tile has `geom.used` bytes, i.e. `nb * qb` quant
    // bytes then the scale arrays `TileGeom` lays out, and the activation arrays hold blocks
    // `b0 * nb .. (b0 + NB) * nb`; every offset below stays inside those ranges.
    unsafe {
        let (tile, act) = reads(a);
        let mask = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); NB];
        for k in 0..nb {
            let wq = tile.add(k * qb);
            prefetch_block(tile, a.geom, kind, k, pf);
            // Macros, not closures: a closure would not be compiled with this function's
            // target features and the intrinsics inside it would stop inlining.
            macro_rules! ld {
                ($i:expr) => {
                    _mm512_loadu_si512(wq.add(64 * $i).cast())
                };
            }
            macro_rules! hi {
                ($v:expr) => {
                    _mm512_and_si512(_mm512_srli_epi16::<4>($v), mask)
                };
            }
            // w | (h & m): one vpternlogd.
            macro_rules! or_masked {
                ($w:expr, $h:expr, $m:expr) => {
                    _mm512_ternarylogic_epi32::<0xF8>($w, $h, $m)
                };
            }
            let mut w: [__m512i; 8] = if KIND == K_Q8_0 {
                [
                    ld!(0),
                    ld!(1),
                    ld!(2),
                    ld!(3),
                    ld!(4),
                    ld!(5),
                    ld!(6),
                    ld!(7),
                ]
            } else {
                let (v0, v1, v2, v3) = (ld!(0), ld!(1), ld!(2), ld!(3));
                [
                    _mm512_and_si512(v0, mask),
                    _mm512_and_si512(v1, mask),
                    _mm512_and_si512(v2, mask),
                    _mm512_and_si512(v3, mask),
                    hi!(v0),
                    hi!(v1),
                    hi!(v2),
                    hi!(v3),
                ]
            };
            if has_q5(KIND) {
                // Bit i of each byte is weight vector i's fifth bit: move it to bit 4. The
                // 16-bit shifts carry no bit across a byte's bit 4 for these distances.
                let h = ld!(4);
                let b4 = _mm512_set1_epi8(0x10);
                let hs = [
                    _mm512_slli_epi16::<4>(h),
                    _mm512_slli_epi16::<3>(h),
                    _mm512_slli_epi16::<2>(h),
                    _mm512_slli_epi16::<1>(h),
                    h,
                    _mm512_srli_epi16::<1>(h),
                    _mm512_srli_epi16::<2>(h),
                    _mm512_srli_epi16::<3>(h),
                ];
                for (wi, hi) in w.iter_mut().zip(hs) {
                    *wi = or_masked!(*wi, hi, b4);
                }
            } else if KIND == K_Q6_K {
                // Bits 2j, 2j + 1 are the top bits of weight vector j (of each half): to 4, 5.
                let b45 = _mm512_set1_epi8(0x30);
                for (half, h) in [ld!(4), ld!(5)].into_iter().enumerate() {
                    let hs = [
                        _mm512_slli_epi16::<4>(h),
                        _mm512_slli_epi16::<2>(h),
                        h,
                        _mm512_srli_epi16::<2>(h),
                    ];
                    for (j, hj) in hs.into_iter().enumerate() {
                        w[4 * half + j] = or_masked!(w[4 * half + j], hj, b45);
                    }
                }
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(a.geom.d_at(kind, k)).cast()));
            let sc = tile.add(a.geom.sc_off + k * 2 * TILE);
            macro_rules! bytes_ps {
                ($cvt:ident, $p:expr) => {
                    _mm512_cvtepi32_ps($cvt(_mm_loadu_si128($p.cast())))
                };
            }
            // Per-row float scales: `dw` of the integer dot (of the first half, for Q6_K),
            // `mw` of the activation sum (Q6_K: the second half's `dw`).
            let (dw, mw) = match KIND {
                K_Q4_K | K_Q5_K => {
                    let dmin =
                        _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(a.geom.m_at(kind, k)).cast()));
                    (
                        _mm512_mul_ps(d, bytes_ps!(_mm512_cvtepu8_epi32, sc)),
                        _mm512_sub_ps(
                            _mm512_setzero_ps(),
                            _mm512_mul_ps(dmin, bytes_ps!(_mm512_cvtepu8_epi32, sc.add(TILE))),
                        ),
                    )
                }
                K_Q6_K => (
                    _mm512_mul_ps(d, bytes_ps!(_mm512_cvtepi8_epi32, sc)),
                    _mm512_mul_ps(d, bytes_ps!(_mm512_cvtepi8_epi32, sc.add(TILE))),
                ),
                K_Q4_1 | K_Q5_1 => (
                    d,
                    _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(a.geom.m_at(kind, k)).cast())),
                ),
                _ => (d, _mm512_setzero_ps()),
            };
            for (b, accb) in acc.iter_mut().enumerate() {
                let e = b * nb + k;
                let xp = act.q.add(e * QK).cast::<i32>();
                macro_rules! x {
                    ($i:expr) => {
                        _mm512_set1_epi32(xp.add($i).read_unaligned())
                    };
                }
                let dx = _mm512_set1_ps(*act.d.add(e));
                if KIND == K_Q6_K {
                    let lo = *act.lo.add(e);
                    let mut p = _mm512_set1_epi32(-32 * lo);
                    let mut q = _mm512_set1_epi32(-32 * (*act.sum.add(e) - lo));
                    p = _mm512_dpbusd_epi32(p, w[0], x!(0));
                    q = _mm512_dpbusd_epi32(q, w[4], x!(4));
                    p = _mm512_dpbusd_epi32(p, w[1], x!(1));
                    q = _mm512_dpbusd_epi32(q, w[5], x!(5));
                    p = _mm512_dpbusd_epi32(p, w[2], x!(2));
                    q = _mm512_dpbusd_epi32(q, w[6], x!(6));
                    p = _mm512_dpbusd_epi32(p, w[3], x!(3));
                    q = _mm512_dpbusd_epi32(q, w[7], x!(7));
                    let t = _mm512_mul_ps(_mm512_cvtepi32_ps(p), dw);
                    let t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), mw, t);
                    *accb = _mm512_fmadd_ps(t, dx, *accb);
                    continue;
                }
                let init = match KIND {
                    K_Q8_0 => _mm512_set1_epi32(*act.neg128.add(e)),
                    K_Q4_0 => _mm512_set1_epi32(*act.neg8.add(e)),
                    K_Q5_0 => _mm512_set1_epi32(-16 * *act.sum.add(e)),
                    _ => _mm512_setzero_si512(),
                };
                let dot = if NB <= 2 {
                    // Few rows leave few independent chains; split this one in two so the
                    // 5-cycle vpdpbusd latency does not serialize the block.
                    let mut p = init;
                    let mut q = _mm512_setzero_si512();
                    p = _mm512_dpbusd_epi32(p, w[0], x!(0));
                    q = _mm512_dpbusd_epi32(q, w[1], x!(1));
                    p = _mm512_dpbusd_epi32(p, w[2], x!(2));
                    q = _mm512_dpbusd_epi32(q, w[3], x!(3));
                    p = _mm512_dpbusd_epi32(p, w[4], x!(4));
                    q = _mm512_dpbusd_epi32(q, w[5], x!(5));
                    p = _mm512_dpbusd_epi32(p, w[6], x!(6));
                    q = _mm512_dpbusd_epi32(q, w[7], x!(7));
                    _mm512_add_epi32(p, q)
                } else {
                    let mut p = init;
                    for (i, wi) in w.iter().enumerate() {
                        p = _mm512_dpbusd_epi32(p, *wi, x!(i));
                    }
                    p
                };
                let s = _mm512_mul_ps(dw, dx);
                *accb = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, *accb);
                if has_min(KIND) {
                    *accb = _mm512_fmadd_ps(mw, _mm512_set1_ps(*act.sd.add(e)), *accb);
                }
            }
        }
        for (b, accb) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add(b * TILE), *accb);
        }
    }
}

/// AVX2 tile kernel: the tile as two halves of 8 rows (one ymm each). `vpmaddubsw` saturates
/// its i16 pair sums, which the formats never reach: the unsigned quants give at most
/// 2 * 63 * 128, and Q8_0 uses the sign trick (|w| times x with w's sign) for at most
/// 2 * 128 * 127 < 32767. So the integers equal those of the VNNI and scalar kernels.
///
/// # Safety
/// AVX2, FMA and F16C must be available and `check(a)` must hold, `a.nbat` being `NB`.
/// `out` must hold at least `NB * TILE` floats.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_tile<const NB: usize, const KIND: u8>(
    a: &TileCall<'_>,
    out: &mut [f32],
    pf: Prefetch,
) {
    let kind = kind_of(KIND);
    let nb = a.geom.nb;
    let qb = kind.qb();
    // SAFETY (whole body): as in `vnni_tile`; the half offset `32 * h` stays within each
    // 64-byte vector, `16 * h` within each 32-byte f16 group and `8 * h` within each 16-byte
    // integer scale group.
    unsafe {
        let (tile, act) = reads(a);
        let mask = _mm256_set1_epi8(0x0F);
        let flip = _mm256_set1_epi8(-128);
        let ones = _mm256_set1_epi16(1);
        for h in 0..2 {
            let mut acc = [_mm256_setzero_ps(); NB];
            for k in 0..nb {
                let wq = tile.add(k * qb + 32 * h);
                if h == 0 {
                    prefetch_block(tile, a.geom, kind, k, pf);
                }
                macro_rules! ld {
                    ($i:expr) => {
                        _mm256_loadu_si256(wq.add(64 * $i).cast())
                    };
                }
                let mut w = [_mm256_setzero_si256(); 8];
                if KIND == K_Q8_0 {
                    for (i, wi) in w.iter_mut().enumerate() {
                        *wi = _mm256_xor_si256(ld!(i), flip);
                    }
                } else {
                    for j in 0..4 {
                        let raw = ld!(j);
                        w[j] = _mm256_and_si256(raw, mask);
                        w[4 + j] = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), mask);
                    }
                }
                if has_q5(KIND) {
                    let hv = ld!(4);
                    let b4 = _mm256_set1_epi8(0x10);
                    let hs = [
                        _mm256_slli_epi16::<4>(hv),
                        _mm256_slli_epi16::<3>(hv),
                        _mm256_slli_epi16::<2>(hv),
                        _mm256_slli_epi16::<1>(hv),
                        hv,
                        _mm256_srli_epi16::<1>(hv),
                        _mm256_srli_epi16::<2>(hv),
                        _mm256_srli_epi16::<3>(hv),
                    ];
                    for (wi, hi) in w.iter_mut().zip(hs) {
                        *wi = _mm256_or_si256(*wi, _mm256_and_si256(hi, b4));
                    }
                } else if KIND == K_Q6_K {
                    let b45 = _mm256_set1_epi8(0x30);
                    for half in 0..2 {
                        let hv = ld!(4 + half);
                        let hs = [
                            _mm256_slli_epi16::<4>(hv),
                            _mm256_slli_epi16::<2>(hv),
                            hv,
                            _mm256_srli_epi16::<2>(hv),
                        ];
                        for (j, hj) in hs.into_iter().enumerate() {
                            let wi = &mut w[4 * half + j];
                            *wi = _mm256_or_si256(*wi, _mm256_and_si256(hj, b45));
                        }
                    }
                }
                macro_rules! f16s {
                    ($at:expr) => {
                        _mm256_cvtph_ps(_mm_loadu_si128(tile.add($at).cast()))
                    };
                }
                let d = f16s!(a.geom.d_at(kind, k) + 16 * h);
                let sc = tile.add(a.geom.sc_off + k * 2 * TILE + 8 * h);
                macro_rules! bytes_ps {
                    ($cvt:ident, $p:expr) => {
                        _mm256_cvtepi32_ps($cvt(_mm_loadl_epi64($p.cast())))
                    };
                }
                let (dw, mw) = match KIND {
                    K_Q4_K | K_Q5_K => (
                        _mm256_mul_ps(d, bytes_ps!(_mm256_cvtepu8_epi32, sc)),
                        _mm256_sub_ps(
                            _mm256_setzero_ps(),
                            _mm256_mul_ps(
                                f16s!(a.geom.m_at(kind, k) + 16 * h),
                                bytes_ps!(_mm256_cvtepu8_epi32, sc.add(TILE)),
                            ),
                        ),
                    ),
                    K_Q6_K => (
                        _mm256_mul_ps(d, bytes_ps!(_mm256_cvtepi8_epi32, sc)),
                        _mm256_mul_ps(d, bytes_ps!(_mm256_cvtepi8_epi32, sc.add(TILE))),
                    ),
                    K_Q4_1 | K_Q5_1 => (d, f16s!(a.geom.m_at(kind, k) + 16 * h)),
                    _ => (d, _mm256_setzero_ps()),
                };
                for (b, accb) in acc.iter_mut().enumerate() {
                    let e = b * nb + k;
                    let xp = act.q.add(e * QK).cast::<i32>();
                    let dx = _mm256_set1_ps(*act.d.add(e));
                    // Weight vector `$w` against activation bytes `4 * $i .. 4 * $i + 4`.
                    macro_rules! prod {
                        ($w:expr, $i:expr) => {{
                            let (wv, xb) = ($w, _mm256_set1_epi32(xp.add($i).read_unaligned()));
                            let p = if KIND == K_Q8_0 {
                                _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xb, wv))
                            } else {
                                _mm256_maddubs_epi16(wv, xb)
                            };
                            _mm256_madd_epi16(p, ones)
                        }};
                    }
                    if KIND == K_Q6_K {
                        let lo = *act.lo.add(e);
                        let mut p = _mm256_set1_epi32(-32 * lo);
                        let mut q = _mm256_set1_epi32(-32 * (*act.sum.add(e) - lo));
                        for i in 0..4 {
                            p = _mm256_add_epi32(p, prod!(w[i], i));
                            q = _mm256_add_epi32(q, prod!(w[4 + i], 4 + i));
                        }
                        let t = _mm256_mul_ps(_mm256_cvtepi32_ps(p), dw);
                        let t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), mw, t);
                        *accb = _mm256_fmadd_ps(t, dx, *accb);
                        continue;
                    }
                    let mut dot = match KIND {
                        K_Q4_0 => _mm256_set1_epi32(*act.neg8.add(e)),
                        K_Q5_0 => _mm256_set1_epi32(-16 * *act.sum.add(e)),
                        _ => _mm256_setzero_si256(),
                    };
                    for (i, wi) in w.iter().enumerate() {
                        dot = _mm256_add_epi32(dot, prod!(*wi, i));
                    }
                    let s = _mm256_mul_ps(dw, dx);
                    *accb = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, *accb);
                    if has_min(KIND) {
                        *accb = _mm256_fmadd_ps(mw, _mm256_set1_ps(*act.sd.add(e)), *accb);
                    }
                }
            }
            for (b, accb) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(b * TILE + 8 * h), *accb);
            }
        }
    }
}

/// Prefetch the quants `PREFETCH_BLOCKS` blocks after block `k`, and the matching scales.
/// Past the tile's quants this touches its scales and then the next tile, which are the next
/// bytes streamed anyway; `wrapping_add` because the address may lie past the allocation
/// (prefetches never fault, but `add` out of bounds would be UB).
#[inline(always)]
fn prefetch_block(tile: *const u8, geom: TileGeom, kind: PackKind, k: usize, pf: Prefetch) {
    let qb = kind.qb();
    let ahead = match pf {
        Prefetch::L1 => PREFETCH_BLOCKS,
        Prefetch::L2 => PREFETCH_L2_BYTES / qb,
    };
    let at = tile.wrapping_add((k + ahead) * qb);
    let scales = tile.wrapping_add(geom.block_scales(kind, k + ahead));
    // SAFETY: `prefetcht0` / `prefetcht1` need only SSE, part of the x86-64 baseline, and are
    // hints that never fault and read no memory architecturally, whatever the address.
    let fetch = |p: *const u8| unsafe {
        match pf {
            Prefetch::L1 => _mm_prefetch::<_MM_HINT_T0>(p.cast()),
            Prefetch::L2 => _mm_prefetch::<_MM_HINT_T1>(p.cast()),
        }
    };
    for l in (0..qb).step_by(64) {
        fetch(at.wrapping_add(l));
    }
    fetch(scales);
}

/// # Safety
/// AVX-512 F/BW/VL must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn with_avx512(work: impl Wide) {
    work.run();
}

/// # Safety
/// AVX2 and FMA must be available.
#[target_feature(enable = "avx2,fma")]
unsafe fn with_avx2(work: impl Wide) {
    work.run();
}

/// Block scale from the block's absolute maximum, as `packed::quantize_act_block` computes it.
#[inline(always)]
fn act_scales(amax: f32) -> (f32, f32) {
    (amax / 127.0, if amax != 0.0 { 127.0 / amax } else { 0.0 })
}

/// # Safety
/// AVX-512 F/BW/VL must be available; `x` and `q` hold `n * 32` elements, the slices `n`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn quantize_avx512(x: *const f32, n: usize, q: *mut i8, d: &mut [f32], sums: Sums<'_>) {
    let Sums { sum, lo, sd } = sums;
    for k in 0..n.min(d.len()).min(sum.len()).min(lo.len()).min(sd.len()) {
        // SAFETY: k < n, so the 32 floats at x + 32k and the 32 bytes at q + 32k are in range.
        unsafe {
            let v0 = _mm512_loadu_ps(x.add(k * QK));
            let v1 = _mm512_loadu_ps(x.add(k * QK + 16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            let (dd, id) = act_scales(amax);
            let vid = _mm512_set1_ps(id);
            let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
            let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
            _mm_storeu_si128(q.add(k * QK).cast(), _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128(q.add(k * QK + 16).cast(), _mm512_cvtsepi32_epi8(q1));
            let l = _mm512_reduce_add_epi32(q0);
            let s = l + _mm512_reduce_add_epi32(q1);
            d[k] = dd;
            lo[k] = l;
            sum[k] = s;
            sd[k] = dd * s as f32;
        }
    }
}

/// The sum of the eight lanes.
///
/// # Safety
/// AVX2 must be available.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum_avx2(s: __m256i) -> i32 {
    let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2));
    _mm_cvtsi128_si32(s1)
}

/// # Safety
/// AVX2 must be available; `x` and `q` hold `n * 32` elements, the slices `n`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_avx2(x: *const f32, n: usize, q: *mut i8, d: &mut [f32], sums: Sums<'_>) {
    let Sums { sum, lo, sd } = sums;
    let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    for k in 0..n.min(d.len()).min(sum.len()).min(lo.len()).min(sd.len()) {
        // SAFETY: k < n, so the 32 floats at x + 32k and the 32 bytes at q + 32k are in range.
        unsafe {
            let p = x.add(k * QK);
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let m = _mm256_max_ps(
                _mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask)),
                _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask)),
            );
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let m1 = _mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2));
            let (dd, id) = act_scales(_mm_cvtss_f32(m1));
            let vid = _mm256_set1_ps(id);
            let i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], vid));
            let i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], vid));
            let i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], vid));
            let i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], vid));
            // packs work within 128-bit lanes: (i0,i1) -> [i0.lo i1.lo i0.hi i1.hi] as i16,
            // then to i8 the lanes interleave again; a final dword permute restores order.
            let w01 = _mm256_packs_epi32(i0, i1);
            let w23 = _mm256_packs_epi32(i2, i3);
            let b = _mm256_packs_epi16(w01, w23);
            let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.add(k * QK).cast(), b);
            let l = hsum_avx2(_mm256_add_epi32(i0, i1));
            let st = l + hsum_avx2(_mm256_add_epi32(i2, i3));
            d[k] = dd;
            lo[k] = l;
            sum[k] = st;
            sd[k] = dd * st as f32;
        }
    }
}
