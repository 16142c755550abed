//! A Bengio-style MLP character language model with a hand-written backward pass and Adam.
//!
//! `context` characters are embedded (`embed` floats each), concatenated, passed through one
//! tanh layer of `hidden` units and a softmax over the vocabulary. All parameters live in one
//! flat `Vec<f32>` (layout: embedding `[vocab × embed]`, W1 `[context·embed × hidden]`, b1
//! `[hidden]`, W2 `[hidden × vocab]`, b2 `[vocab]`, all row-major), so Adam, checkpoints and
//! gradient sums are plain loops over one slice.
//!
//! Determinism: a batch is cut into fixed chunks of [`CHUNK`] samples; each chunk's gradient is
//! computed on its own, whichever thread runs it, and the chunk gradients are summed in chunk
//! order. The floating-point operations are therefore the same for any thread count.

use crate::data::{Batch, SplitMix64};
use crate::hparams::HParams;

/// Samples per gradient chunk: the unit of work handed to threads.
pub const CHUNK: usize = 8;

const BETA1: f32 = 0.9;
const BETA2: f32 = 0.999;
const EPS: f32 = 1e-8;

/// The parameter blocks of the flat vector, as slices of `T` (`&[f32]` or `&mut [f32]`).
struct Parts<T> {
    emb: T,
    w1: T,
    b1: T,
    w2: T,
    b2: T,
}

/// Splits the flat vector `$p` into its [`Parts`] with `$split` (`split_at` or
/// `split_at_mut`): one layout for reading and writing.
macro_rules! split_parts {
    ($hp:expr, $p:expr, $split:ident) => {{
        let (emb, r) = $p.$split($hp.vocab * $hp.embed);
        let (w1, r) = r.$split($hp.input() * $hp.hidden);
        let (b1, r) = r.$split($hp.hidden);
        let (w2, b2) = r.$split($hp.hidden * $hp.vocab);
        Parts {
            emb,
            w1,
            b1,
            w2,
            b2,
        }
    }};
}

fn parts<'a>(hp: &HParams, p: &'a [f32]) -> Parts<&'a [f32]> {
    split_parts!(hp, p, split_at)
}

fn parts_mut<'a>(hp: &HParams, p: &'a mut [f32]) -> Parts<&'a mut [f32]> {
    split_parts!(hp, p, split_at_mut)
}

/// Initial parameters from `hp.seed`. Uniform draws scaled to the wanted standard deviation
/// (uniform on [-a, a] has std a/√3) keep init free of transcendental functions.
pub fn init(hp: &HParams) -> Vec<f32> {
    let mut rng = SplitMix64::stream(hp.seed, 0x1417);
    let mut p = vec![0.0; hp.n_params()];
    let mut fill = |xs: &mut [f32], std: f32| {
        let a = std * 3f32.sqrt();
        for x in xs {
            *x = (rng.next_f32() * 2.0 - 1.0) * a;
        }
    };
    let w = parts_mut(hp, &mut p);
    fill(w.emb, 1.0);
    // Kaiming for tanh (gain 5/3) keeps the hidden layer out of saturation at the start.
    fill(w.w1, 5.0 / 3.0 / (hp.input() as f32).sqrt());
    // A tiny output layer starts at near-uniform predictions: loss ≈ ln(vocab).
    fill(w.w2, 0.01);
    // Biases stay zero.
    p
}

/// Per-sample activations, reused across samples.
struct Scratch {
    e: Vec<f32>,
    h: Vec<f32>,
    p: Vec<f32>,
    dh: Vec<f32>,
}

impl Scratch {
    fn new(hp: &HParams) -> Self {
        Self {
            e: vec![0.0; hp.input()],
            h: vec![0.0; hp.hidden],
            p: vec![0.0; hp.vocab],
            dh: vec![0.0; hp.hidden],
        }
    }
}

/// `y += a·x`
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

fn dot(x: &[f32], y: &[f32]) -> f32 {
    x.iter().zip(y).fold(0.0, |s, (x, y)| s + x * y)
}

/// Cross-entropy loss of one sample; with `grad`, adds the sample's gradient to it.
fn sample(
    hp: &HParams,
    w: &Parts<&[f32]>,
    x: &[u8],
    y: usize,
    s: &mut Scratch,
    grad: Option<&mut Parts<&mut [f32]>>,
) -> f32 {
    let (e_dim, h_dim, v_dim) = (hp.embed, hp.hidden, hp.vocab);
    for (j, &c) in x.iter().enumerate() {
        let c = usize::from(c);
        s.e[j * e_dim..][..e_dim].copy_from_slice(&w.emb[c * e_dim..][..e_dim]);
    }
    s.h.copy_from_slice(w.b1);
    for (i, &ei) in s.e.iter().enumerate() {
        axpy(ei, &w.w1[i * h_dim..][..h_dim], &mut s.h);
    }
    for h in &mut s.h {
        *h = h.tanh();
    }
    s.p.copy_from_slice(w.b2);
    for (k, &hk) in s.h.iter().enumerate() {
        axpy(hk, &w.w2[k * v_dim..][..v_dim], &mut s.p);
    }
    // Softmax with the max subtracted, so exp never overflows.
    let max = s.p.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    let zy = s.p[y] - max;
    let mut sum = 0.0;
    for l in &mut s.p {
        *l = (*l - max).exp();
        sum += *l;
    }
    let loss = sum.ln() - zy;

    let Some(g) = grad else { return loss };
    // dL/dlogits = softmax - onehot(y)
    for p in &mut s.p {
        *p /= sum;
    }
    s.p[y] -= 1.0;
    axpy(1.0, &s.p, g.b2);
    for (k, &hk) in s.h.iter().enumerate() {
        let w2k = &w.w2[k * v_dim..][..v_dim];
        axpy(hk, &s.p, &mut g.w2[k * v_dim..][..v_dim]);
        s.dh[k] = dot(w2k, &s.p) * (1.0 - hk * hk);
    }
    axpy(1.0, &s.dh, g.b1);
    for (i, &ei) in s.e.iter().enumerate() {
        axpy(ei, &s.dh, &mut g.w1[i * h_dim..][..h_dim]);
        let de = dot(&w.w1[i * h_dim..][..h_dim], &s.dh);
        // += because a character may occur more than once in the context.
        g.emb[usize::from(x[i / e_dim]) * e_dim + i % e_dim] += de;
    }
    loss
}

/// Summed (not averaged) loss and gradient of samples `range` of `batch`, written to `grad`.
fn chunk_gradient(
    hp: &HParams,
    params: &[f32],
    batch: &Batch,
    range: std::ops::Range<usize>,
    grad: &mut [f32],
) -> f64 {
    grad.fill(0.0);
    let w = parts(hp, params);
    let mut g = parts_mut(hp, grad);
    let mut s = Scratch::new(hp);
    range
        .map(|i| {
            let (x, y) = batch.sample(i);
            f64::from(sample(hp, &w, x, y, &mut s, Some(&mut g)))
        })
        .sum()
}

/// Mean loss over `batch`, forward only (held-out evaluation).
pub fn mean_loss(hp: &HParams, params: &[f32], batch: &Batch) -> f64 {
    let w = parts(hp, params);
    let mut s = Scratch::new(hp);
    let total: f64 = (0..batch.len())
        .map(|i| {
            let (x, y) = batch.sample(i);
            f64::from(sample(hp, &w, x, y, &mut s, None))
        })
        .sum();
    total / batch.len().max(1) as f64
}

/// Buffers kept across steps so a step allocates nothing big.
#[derive(Default)]
pub struct Workspace {
    chunk_grads: Vec<Vec<f32>>,
    chunk_losses: Vec<f64>,
}

/// Mean loss of `batch`; each chunk's gradient is left in `ws.chunk_grads`.
fn batch_gradient(
    hp: &HParams,
    params: &[f32],
    batch: &Batch,
    threads: usize,
    ws: &mut Workspace,
) -> f64 {
    let n = batch.len();
    let n_chunks = n.div_ceil(CHUNK);
    ws.chunk_grads
        .resize_with(n_chunks, || vec![0.0; hp.n_params()]);
    ws.chunk_losses.resize(n_chunks, 0.0);
    let threads = threads.clamp(1, n_chunks.max(1));

    // Chunk i goes to thread i % threads; what a chunk computes does not depend on it.
    let mut jobs: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
    let chunks = ws.chunk_grads.iter_mut().zip(ws.chunk_losses.iter_mut());
    for (i, (g, l)) in chunks.enumerate() {
        jobs[i % threads].push((i, g, l));
    }
    let work = |jobs: Vec<(usize, &mut Vec<f32>, &mut f64)>| {
        for (i, g, l) in jobs {
            *l = chunk_gradient(hp, params, batch, i * CHUNK..((i + 1) * CHUNK).min(n), g);
        }
    };
    if threads == 1 {
        jobs.into_iter().for_each(work);
    } else {
        std::thread::scope(|s| {
            for j in jobs {
                s.spawn(move || work(j));
            }
        });
    }

    ws.chunk_losses.iter().sum::<f64>() / n as f64
}

/// Everything a checkpoint holds: steps done, parameters and Adam's moments.
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub step: u64,
    pub params: Vec<f32>,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

impl State {
    pub fn new(params: Vec<f32>) -> Self {
        let n = params.len();
        Self {
            step: 0,
            params,
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    /// One training step on `batch`: gradient, Adam update, `step += 1`. Returns the batch's
    /// mean loss before the update.
    pub fn train_step(
        &mut self,
        hp: &HParams,
        batch: &Batch,
        threads: usize,
        ws: &mut Workspace,
    ) -> f32 {
        let loss = batch_gradient(hp, &self.params, batch, threads, ws);
        self.step += 1;
        // Bias correction depends only on the step number, so it resumes exactly.
        let t = i32::try_from(self.step).unwrap_or(i32::MAX);
        let (bc1, bc2) = (1.0 - BETA1.powi(t), 1.0 - BETA2.powi(t));
        let scale = 1.0 / batch.len() as f32;
        let chunks = &ws.chunk_grads[..batch.len().div_ceil(CHUNK)];
        // Each thread sums its slice of the parameters over the chunks, in chunk order, and
        // applies Adam to it: per parameter, the same additions in the same order every time.
        let update = |from: usize, p: &mut [f32], m: &mut [f32], v: &mut [f32]| {
            for i in 0..p.len() {
                let mut g = 0.0;
                for c in chunks {
                    g += c[from + i];
                }
                let g = g * scale;
                m[i] = BETA1 * m[i] + (1.0 - BETA1) * g;
                v[i] = BETA2 * v[i] + (1.0 - BETA2) * g * g;
                p[i] -= hp.lr * (m[i] / bc1) / ((v[i] / bc2).sqrt() + EPS);
            }
        };
        // As many threads as chunks, as for the gradients: a batch under 8 runs on one.
        let threads = threads.clamp(1, chunks.len().max(1));
        let per = self.params.len().div_ceil(threads).max(1);
        let slices = self
            .params
            .chunks_mut(per)
            .zip(self.m.chunks_mut(per))
            .zip(self.v.chunks_mut(per))
            .enumerate();
        if threads <= 1 {
            slices.for_each(|(k, ((p, m), v))| update(k * per, p, m, v));
        } else {
            std::thread::scope(|s| {
                for (k, ((p, m), v)) in slices {
                    s.spawn(move || update(k * per, p, m, v));
                }
            });
        }
        loss as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Corpus, train_batch};

    fn tiny() -> HParams {
        HParams {
            vocab: 5,
            context: 3,
            embed: 2,
            hidden: 4,
            batch: 6,
            seed: 7,
            lr: 1e-2,
            data_hash: 0,
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let hp = tiny();
        // Larger weights than `init` gives, so every block has gradients well above f32 noise.
        let mut rng = SplitMix64::stream(3, 3);
        let mut params: Vec<f32> = (0..hp.n_params())
            .map(|_| rng.next_f32() * 2.0 - 1.0)
            .collect();
        let batch = Batch {
            context: 3,
            xs: vec![0, 1, 2, 3, 3, 4, 2, 0, 2, 1, 1, 1, 4, 0, 3, 2, 4, 1],
            ys: vec![4, 0, 1, 3, 2, 0],
        };
        let mut grad = vec![0.0; hp.n_params()];
        chunk_gradient(&hp, &params, &batch, 0..batch.len(), &mut grad);

        let loss = |p: &[f32]| mean_loss(&hp, p, &batch) * batch.len() as f64;
        let h = 1e-2;
        for i in 0..params.len() {
            let orig = params[i];
            params[i] = orig + h;
            let up = loss(&params);
            params[i] = orig - h;
            let down = loss(&params);
            params[i] = orig;
            let numeric = (up - down) / (2.0 * f64::from(h));
            let analytic = f64::from(grad[i]);
            let tol = 2e-3 + 2e-2 * numeric.abs();
            assert!(
                (numeric - analytic).abs() < tol,
                "param {i}: analytic {analytic}, numeric {numeric}"
            );
        }
    }

    /// The FLOPs formula against the weight matrices: every weight takes one multiply-add
    /// per sample forward and two backward.
    #[test]
    fn step_flops_follow_the_weight_shapes() {
        let hp = HParams {
            vocab: 65,
            context: 8,
            embed: 16,
            hidden: 128,
            batch: 64,
            ..tiny()
        };
        let params = init(&hp);
        let w = parts(&hp, &params);
        assert_eq!((w.w1.len(), w.w2.len()), (8 * 16 * 128, 128 * 65));
        let macs = hp.batch as u64 * (w.w1.len() + w.w2.len()) as u64;
        assert_eq!(hp.step_flops(), 2 * (1 + 2) * macs);
        assert_eq!(hp.step_flops(), 9_486_336);
        assert_eq!(hp.n_params(), 25_937);
        let one = HParams { batch: 1, ..hp };
        assert_eq!(
            hp.step_flops(),
            64 * one.step_flops(),
            "linear in the batch"
        );
    }

    #[test]
    fn initial_loss_is_near_uniform() {
        let text: Vec<u8> = b"to be or not to be, that is the question. ".repeat(40);
        let corpus = Corpus::from_bytes(&text, 4).unwrap();
        let hp = HParams {
            vocab: corpus.vocab.len(),
            context: 4,
            ..tiny()
        };
        let batch = train_batch(&corpus, &hp, 0);
        let loss = mean_loss(&hp, &init(&hp), &batch);
        assert!((loss - (hp.vocab as f64).ln()).abs() < 0.05, "{loss}");
    }

    /// The same steps give bit-identical parameters with 1 and 3 threads, also for a batch that
    /// is not a multiple of the chunk size.
    #[test]
    fn thread_count_does_not_change_bits() {
        let text: Vec<u8> =
            b"All the world's a stage, and all the men and women merely players. ".repeat(30);
        let corpus = Corpus::from_bytes(&text, 5).unwrap();
        let hp = HParams {
            vocab: corpus.vocab.len(),
            context: 5,
            embed: 6,
            hidden: 24,
            batch: 37,
            seed: 11,
            lr: 3e-3,
            data_hash: 0,
        };
        let run = |threads| {
            let mut state = State::new(init(&hp));
            let mut ws = Workspace::default();
            let losses: Vec<u32> = (0..5)
                .map(|_| {
                    let batch = train_batch(&corpus, &hp, state.step);
                    state.train_step(&hp, &batch, threads, &mut ws).to_bits()
                })
                .collect();
            (state, losses)
        };
        let (one, l1) = run(1);
        let (three, l3) = run(3);
        assert_eq!(l1, l3);
        let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&one.params), bits(&three.params));
        assert_eq!(bits(&one.m), bits(&three.m));
        assert_eq!(bits(&one.v), bits(&three.v));
        assert_ne!(
            bits(&one.params),
            bits(&init(&hp)),
            "training changed nothing"
        );
    }
}
