//! Matmul kernel benchmark (harness = false): per-matrix throughput at SmolLM2-135M shapes, a
//! decode-step estimate from them, measured whole decode steps, and the per-call overhead.
//!
//! Per-matrix figures rerun one matrix, which then sits in L2/L3: they are the kernel's
//! ceiling. Whole-step figures run 30 layers x 7 distinct matrices + the 49152x576 output
//! (75-145 MB of weights) as a decode step does, so they show what memory allows. Everything
//! runs inside `pool.install`, as the engine's decode loop should (see "outside the pool").
//! Usage: `cargo bench -p frugal-engine --bench matmul [-- quick]`.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use frugal_engine::quant::{
    Kernel, QMatrix, Scratch, WeightType, matmul_input, matmul_input_with_kernel,
};

const HIDDEN: usize = 576;
const KV: usize = 192;
const FFN: usize = 1536;
const LAYERS: usize = 30;
const VOCAB: usize = 49152;

/// The seven layer matrices of SmolLM2-135M, as (rows, cols): q, k, v, o, gate, up, down.
const LAYER_SHAPES: [(usize, usize); 7] = [
    (HIDDEN, HIDDEN),
    (KV, HIDDEN),
    (KV, HIDDEN),
    (HIDDEN, HIDDEN),
    (FFN, HIDDEN),
    (FFN, HIDDEN),
    (HIDDEN, FFN),
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Random but valid GGUF bytes: random quants, small f16 scales (no quantizer run, so 140 MB
/// of weights are built in a moment).
fn random_matrix(t: WeightType, rows: usize, cols: usize, seed: u64) -> QMatrix {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let rb = t.row_bytes(cols).unwrap();
    let mut bytes = vec![0u8; rb * rows];
    for chunk in bytes.chunks_mut(8) {
        let v = rng.next().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    let scale_bytes = if t == WeightType::Q4_1 { 4 } else { 2 };
    for blk in bytes.chunks_exact_mut(t.block_bytes()) {
        // f16 0x2000 = 2^-7 for d (and m).
        for s in blk[..scale_bytes].chunks_exact_mut(2) {
            s.copy_from_slice(&0x2000u16.to_le_bytes());
        }
    }
    QMatrix::from_bytes(t, rows, cols, &bytes).unwrap()
}

fn random_x(batch: usize, cols: usize) -> Vec<f32> {
    let mut rng = Rng(0x1234_5678);
    (0..batch * cols)
        .map(|_| (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect()
}

/// Best time per call over `rounds` rounds of at least `round` each (best-of, because the
/// two cores are shared with other work).
fn time_per_call(round: Duration, rounds: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut best = Duration::MAX;
    for _ in 0..rounds {
        let start = Instant::now();
        let mut n = 0u32;
        while start.elapsed() < round || n < 2 {
            f();
            n += 1;
        }
        best = best.min(start.elapsed() / n);
    }
    best
}

/// One matmul per call: quantize the input (in parallel when large) and multiply.
fn call(
    w: &QMatrix,
    x: &[f32],
    batch: usize,
    out: &mut [f32],
    s: &mut Scratch,
    pool: &rayon::ThreadPool,
) {
    let input = s.quantize_par(x, batch, w.cols(), pool).unwrap();
    matmul_input(w, &input, &mut out[..batch * w.rows()], pool).unwrap();
}

struct Step {
    mats: Vec<QMatrix>,
    bytes: usize,
}

impl Step {
    fn new(layers: WeightType, output: WeightType) -> Step {
        let mut mats = Vec::new();
        for l in 0..LAYERS {
            for (i, &(r, c)) in LAYER_SHAPES.iter().enumerate() {
                mats.push(random_matrix(layers, r, c, (l * 7 + i) as u64 + 1));
            }
        }
        mats.push(random_matrix(output, VOCAB, HIDDEN, 999));
        let bytes = mats.iter().map(QMatrix::bytes).sum();
        Step { mats, bytes }
    }

    /// One decode step. q/k/v share one quantized input and gate/up another, as the engine
    /// can do; o, down and the output quantize their own.
    fn run(
        &self,
        batch: usize,
        xh: &[f32],
        xf: &[f32],
        out: &mut [f32],
        s: &mut Scratch,
        pool: &rayon::ThreadPool,
    ) {
        for layer in self.mats[..LAYERS * 7].chunks_exact(7) {
            let input = s.quantize_par(xh, batch, HIDDEN, pool).unwrap();
            for w in &layer[..3] {
                matmul_input(w, &input, &mut out[..batch * w.rows()], pool).unwrap();
            }
            call(&layer[3], xh, batch, out, s, pool);
            let input = s.quantize_par(xh, batch, HIDDEN, pool).unwrap();
            for w in &layer[4..6] {
                matmul_input(w, &input, &mut out[..batch * w.rows()], pool).unwrap();
            }
            call(&layer[6], xf, batch, out, s, pool);
        }
        call(&self.mats[LAYERS * 7], xh, batch, out, s, pool);
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let (round, rounds) = if quick {
        (Duration::from_millis(30), 3)
    } else {
        (Duration::from_millis(100), 5)
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    println!(
        "kernel {:?}, pool of {} threads",
        Kernel::best(),
        pool.current_num_threads()
    );

    let types = [WeightType::Q8_0, WeightType::Q4_0, WeightType::Q4_1];
    let batches = [1usize, 4, 16];
    // (rows, cols, uses per decode step)
    let shapes = [
        (FFN, HIDDEN, 2 * LAYERS),
        (HIDDEN, FFN, LAYERS),
        (VOCAB, HIDDEN, 1),
        (HIDDEN, HIDDEN, 2 * LAYERS),
        (KV, HIDDEN, 2 * LAYERS),
    ];

    println!("\n== per matrix, warm (one matrix rerun, so it sits in L2/L3) ==");
    println!(
        "{:<5} {:>10} {:>5} {:>9} {:>7} {:>7}",
        "type", "shape", "batch", "us/call", "GB/s", "GMAC/s"
    );
    let mut estimate = Vec::new();
    for t in types {
        for batch in batches {
            let mut step_s = 0f64;
            let mut step_bytes = 0usize;
            for &(rows, cols, uses) in &shapes {
                let w = random_matrix(t, rows, cols, 7);
                let x = random_x(batch, cols);
                let mut scratch = Scratch::new();
                let mut out = vec![0f32; batch * rows];
                let dt = pool.install(|| {
                    time_per_call(round, rounds, || {
                        call(&w, &x, batch, &mut out, &mut scratch, &pool);
                        black_box(&out);
                    })
                });
                let s = dt.as_secs_f64();
                step_s += s * uses as f64;
                step_bytes += w.bytes() * uses;
                println!(
                    "{:<5} {:>10} {:>5} {:>9.1} {:>7.1} {:>7.1}",
                    t.name(),
                    format!("{rows}x{cols}"),
                    batch,
                    s * 1e6,
                    w.bytes() as f64 / s / 1e9,
                    (rows * cols * batch) as f64 / s / 1e9
                );
            }
            estimate.push((t, batch, step_s, step_bytes));
        }
    }

    println!("\n== decode-step estimate: sum of the warm per-matrix times (kernel ceiling) ==");
    println!(
        "{:<5} {:>5} {:>8} {:>9} {:>7} {:>8}",
        "type", "batch", "MB", "ms/step", "GB/s", "tok/s"
    );
    for (t, batch, s, bytes) in estimate {
        println!(
            "{:<5} {:>5} {:>8.1} {:>9.3} {:>7.1} {:>8.0}",
            t.name(),
            batch,
            bytes as f64 / 1e6,
            s * 1e3,
            bytes as f64 / s / 1e9,
            batch as f64 / s
        );
    }

    println!("\n== measured decode steps: 211 distinct matrices streamed per step ==");
    println!(
        "{:<10} {:>5} {:>8} {:>9} {:>7} {:>8}",
        "layer/out", "batch", "MB", "ms/step", "GB/s", "tok/s"
    );
    let mut combos: Vec<(WeightType, WeightType)> = types.iter().map(|&t| (t, t)).collect();
    // SmolLM2-135M as shipped: Q4_1 layers, tied Q8_0 embedding as the output projection.
    combos.push((WeightType::Q4_1, WeightType::Q8_0));
    combos.push((WeightType::Q4_0, WeightType::Q8_0));
    for (lt, ot) in combos {
        let step = Step::new(lt, ot);
        for batch in batches {
            let xh = random_x(batch, HIDDEN);
            let xf = random_x(batch, FFN);
            let mut out = vec![0f32; batch * VOCAB];
            let mut scratch = Scratch::new();
            let dt = pool.install(|| {
                time_per_call(round * 3, rounds, || {
                    step.run(batch, &xh, &xf, &mut out, &mut scratch, &pool);
                    black_box(&out);
                })
            });
            let s = dt.as_secs_f64();
            println!(
                "{:<10} {:>5} {:>8.1} {:>9.3} {:>7.1} {:>8.0}",
                format!("{}/{}", lt.name(), ot.name()),
                batch,
                step.bytes as f64 / 1e6,
                s * 1e3,
                step.bytes as f64 / s / 1e9,
                batch as f64 / s
            );
        }
        if lt == WeightType::Q4_0 && ot == WeightType::Q4_0 {
            // The same step driven from a thread outside the pool: every call then hands work
            // to the pool's threads and sleeps until they finish.
            let (xh, xf) = (random_x(1, HIDDEN), random_x(1, FFN));
            let mut out = vec![0f32; VOCAB];
            let mut scratch = Scratch::new();
            let dt = time_per_call(round * 3, rounds, || {
                step.run(1, &xh, &xf, &mut out, &mut scratch, &pool);
                black_box(&out);
            });
            let s = dt.as_secs_f64();
            println!(
                "{:<10} {:>5} {:>8.1} {:>9.3} {:>7.1} {:>8.0}   <- called outside pool.install",
                "Q4_0/Q4_0",
                1,
                step.bytes as f64 / 1e6,
                s * 1e3,
                step.bytes as f64 / s / 1e9,
                1.0 / s
            );
        }
    }

    println!("\n== per-call cost, Q4_0 batch 1, warm, inside pool.install ==");
    let single = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for (rows, cols) in [(16, 32), (KV, HIDDEN), (HIDDEN, HIDDEN), (FFN, HIDDEN)] {
        let w = random_matrix(WeightType::Q4_0, rows, cols, 5);
        let x = random_x(1, cols);
        let mut scratch = Scratch::new();
        let mut out = vec![0f32; rows];
        let mut t = [0f64; 2];
        for (i, p) in [&single, &pool].into_iter().enumerate() {
            t[i] = p
                .install(|| {
                    time_per_call(round, rounds, || {
                        call(&w, &x, 1, &mut out, &mut scratch, p);
                        black_box(&out);
                    })
                })
                .as_secs_f64();
        }
        println!(
            "{rows:>5}x{cols:<4}: 1 thread {:>6.2} us, 2 threads {:>6.2} us",
            t[0] * 1e6,
            t[1] * 1e6
        );
    }

    println!("\n== kernels compared, Q4_0 1536x576, warm ==");
    let w = random_matrix(WeightType::Q4_0, FFN, HIDDEN, 3);
    for k in [Kernel::Avx512Vnni, Kernel::Avx2, Kernel::Scalar] {
        if !k.is_available() {
            continue;
        }
        for batch in [1usize, 16] {
            let x = random_x(batch, HIDDEN);
            let mut scratch = Scratch::new();
            let mut out = vec![0f32; batch * FFN];
            let dt = pool.install(|| {
                time_per_call(round, rounds, || {
                    let input = scratch.quantize(&x, batch, HIDDEN).unwrap();
                    matmul_input_with_kernel(&w, &input, &mut out, &pool, k).unwrap();
                    black_box(&out);
                })
            });
            println!("{k:?} batch {batch}: {:.1} us", dt.as_secs_f64() * 1e6);
        }
    }
}
