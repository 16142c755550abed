//! What a quantization costs in quality, per token of held-out text, measured the way
//! llama.cpp's `llama-perplexity` does (its chunks of `ctx` tokens, its scored second half of
//! each, its KL-divergence and Δp statistics), so the figures compare with its.
//!
//! The reference's distribution can be saved once as its top-k log-probabilities per scored
//! token ([`SavedReference`]): llama.cpp saves every logit, tens of GiB for a large
//! vocabulary; k of them is a few MB, and the KL divergence read from them is a lower bound of
//! the full one (the tail outside the top k is one bucket), whose gap [`PplReport`] states
//! whenever both are at hand.
//!
//! A run's figures pass or fail a gate of bounds (`gate`), and `quality` records what each
//! model file and quantization was last measured to keep.

mod gate;
pub mod quality;
mod saved;

use std::cmp::Ordering;

use sha2::{Digest, Sha256};

use crate::model::{Chunk, KvCache, Model, ModelError};
use crate::tokenizer::{Tokenizer, TokenizerError};

pub use gate::{Gate, GateFailed, Keep};
pub use saved::{Made, SavedReference, SavedWriter, is_saved_reference};

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(
        "the text is {tokens} tokens, shorter than one context of {ctx}: pass a longer text or a smaller --ctx"
    )]
    TooShort { tokens: usize, ctx: usize },
    #[error("a context of {0} tokens scores nothing: use at least 4")]
    ContextTooSmall(usize),
    #[error(
        "the reference has another vocabulary ({reference} tokens, {reference_hash}) than the model ({model} tokens, {model_hash}): KL divergence across vocabularies means nothing"
    )]
    Vocabulary {
        model: usize,
        model_hash: String,
        reference: usize,
        reference_hash: String,
    },
    #[error("the saved reference was made {what}")]
    Mismatch { what: String },
    #[error("saved reference {path}: {why}")]
    Corrupt { path: String, why: String },
    #[error("saved reference {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("cannot tokenize the text: {0}")]
    Tokenize(#[from] TokenizerError),
}

/// A vocabulary's identity: the SHA-256 of its tokens in id order, so two models compare
/// token for token (a KL divergence needs the same ids to mean the same strings).
pub fn vocabulary_hash(tokenizer: &Tokenizer) -> [u8; 32] {
    let mut h = Sha256::new();
    for id in 0..tokenizer.vocab_size() {
        let t = tokenizer.token(id as u32).unwrap_or("");
        h.update((t.len() as u32).to_le_bytes());
        h.update(t.as_bytes());
    }
    h.finalize().into()
}

/// Refuses a reference whose vocabulary differs from the model's; the shared vocabulary's hash.
pub fn same_vocabulary(model: &Tokenizer, reference: &Tokenizer) -> Result<[u8; 32], EvalError> {
    let (m, r) = (vocabulary_hash(model), vocabulary_hash(reference));
    if m != r {
        return Err(EvalError::Vocabulary {
            model: model.vocab_size(),
            model_hash: short_hex(&m),
            reference: reference.vocab_size(),
            reference_hash: short_hex(&r),
        });
    }
    Ok(m)
}

/// The first 12 hex digits of a hash, for messages.
pub fn short_hex(hash: &[u8; 32]) -> String {
    hash[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The text's tokens cut as `llama-perplexity` cuts them: the whole text tokenized once (a
/// BOS first when the model adds one), then whole chunks of `ctx` tokens, each starting with
/// BOS in place of its first token when the model adds one; at most `limit` chunks.
pub fn chunks(
    tokenizer: &Tokenizer,
    text: &str,
    ctx: usize,
    limit: Option<usize>,
) -> Result<Vec<Vec<u32>>, EvalError> {
    if ctx < 4 {
        return Err(EvalError::ContextTooSmall(ctx));
    }
    let bos = tokenizer.bos().filter(|_| tokenizer.add_bos_token());
    let mut tokens: Vec<u32> = bos.into_iter().collect();
    tokens.extend(tokenizer.encode_ordinary(text)?);
    if tokens.len() < ctx {
        return Err(EvalError::TooShort {
            tokens: tokens.len(),
            ctx,
        });
    }
    let mut out: Vec<Vec<u32>> = tokens.chunks_exact(ctx).map(<[u32]>::to_vec).collect();
    if let Some(n) = limit {
        out.truncate(n.max(1));
    }
    if let Some(b) = bos {
        out.iter_mut().for_each(|c| c[0] = b);
    }
    Ok(out)
}

/// The first position of a chunk whose logits are scored: each scored token has at least half
/// a context before it.
pub fn first_scored(ctx: usize) -> usize {
    ctx / 2
}

/// Tokens scored per chunk: positions `first..ctx-1` predict tokens `first+1..ctx`.
pub fn scored_per_chunk(ctx: usize) -> usize {
    ctx - 1 - first_scored(ctx)
}

/// The logits of a chunk's scored positions.
fn scored_logits(model: &Model, chunk: &[u32]) -> Result<Vec<Vec<f32>>, EvalError> {
    let mut cache = KvCache::with_capacity(&model.config, chunk.len());
    let mut logits = model.forward(&mut [Chunk {
        tokens: chunk,
        cache: &mut cache,
        logits: chunk.len() - first_scored(chunk.len()),
    }])?;
    logits.pop(); // the last position predicts past the chunk
    Ok(logits)
}

/// `logits` turned into log-probabilities in place (the normalizer summed in f64).
fn log_softmax(logits: &mut [f32]) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let norm = max + sum.ln() as f32;
    logits.iter_mut().for_each(|l| *l -= norm);
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The `k` most likely ids and their log-probabilities, most likely first.
pub fn top_k(logprobs: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut ids: Vec<u32> = (0..logprobs.len() as u32).collect();
    let k = k.min(ids.len());
    let by = |a: &u32, b: &u32| {
        logprobs[*b as usize]
            .partial_cmp(&logprobs[*a as usize])
            .unwrap_or(Ordering::Equal)
    };
    if k < ids.len() {
        ids.select_nth_unstable_by(k, by);
        ids.truncate(k);
    }
    ids.sort_by(by);
    ids.into_iter().map(|i| (i, logprobs[i as usize])).collect()
}

/// KL(P_ref ‖ Q) over the whole vocabulary.
fn kld_full(reference: &[f32], q: &[f32]) -> f64 {
    reference
        .iter()
        .zip(q)
        .map(|(&r, &q)| f64::from(r).exp() * f64::from(r - q))
        .sum::<f64>()
        .max(0.0)
}

/// KL(P_ref ‖ Q) with everything outside the reference's top k merged into one outcome: a
/// lower bound of the full divergence (merging outcomes never raises it).
fn kld_top_k(top: &[(u32, f32)], q: &[f32]) -> f64 {
    let (mut kl, mut p_in, mut q_in) = (0.0f64, 0.0f64, 0.0f64);
    for &(id, lr) in top {
        let lq = q[id as usize];
        let p = f64::from(lr).exp();
        kl += p * f64::from(lr - lq);
        p_in += p;
        q_in += f64::from(lq).exp();
    }
    // A tail below f32's rounding of the sum is no mass (dropping a term keeps the bound).
    let (p_tail, q_tail) = ((1.0 - p_in).max(0.0), (1.0 - q_in).max(1e-12));
    if p_tail > 1e-6 {
        kl += p_tail * (p_tail / q_tail).ln();
    }
    kl.max(0.0)
}

/// How the reference's distribution is had: by running it, or from a saved file.
pub enum Reference<'a> {
    None,
    Live(&'a Model),
    Saved(SavedReference),
}

/// Per-token figures gathered over the whole text.
#[derive(Debug, Default)]
struct Tally {
    nll: Vec<f64>,
    ref_nll: Vec<f64>,
    kld: Vec<f64>,
    kld_top_k: Vec<f64>,
    same_top: usize,
    dp: Vec<f64>,
}

/// Perplexity of a model, and with a reference, how far its next-token distributions are
/// from the reference's.
#[derive(Debug, Clone)]
pub struct PplReport {
    pub chunks: usize,
    pub ctx: usize,
    pub tokens_scored: usize,
    pub ppl: f64,
    /// One standard error of the perplexity (from the per-token NLL's spread).
    pub ppl_err: f64,
    pub reference: Option<Comparison>,
}

/// The model against its reference.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub ppl: f64,
    pub ppl_ratio: f64,
    /// KL divergence of the model from the reference per token: from the full vocabulary
    /// when the reference ran here, else from its saved top k.
    pub kld: Stats,
    /// Whether `kld` is the top-k lower bound (read from a saved reference).
    pub kld_is_top_k: bool,
    pub top_k: usize,
    /// When the reference ran here and top-k figures were wanted too: the top-k mean and its
    /// gap to the full mean, relative (how much a saved reference under-reads).
    pub top_k_mean: Option<f64>,
    /// Share of tokens whose most likely next token is the reference's.
    pub top1: f64,
    /// p(model) − p(reference) of the text's actual next token.
    pub dp: Stats,
    pub dp_rms: f64,
}

/// A distribution's summary: mean and percentiles.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub mean: f64,
    pub min: f64,
    pub p1: f64,
    pub p5: f64,
    pub median: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Stats {
    fn of(values: &[f64]) -> Stats {
        let mut v = values.to_vec();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
        let at = |q: f64| -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            // Linear interpolation between closest ranks, as numpy's default.
            let pos = q * (v.len() - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
        };
        Stats {
            mean: mean(&v),
            min: at(0.0),
            p1: at(0.01),
            p5: at(0.05),
            median: at(0.5),
            p95: at(0.95),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The bounds of a perplexity run's gate, all against the reference.
#[derive(Debug, Clone, Copy, Default)]
pub struct PplBounds {
    /// `--max-kld`: the mean KL divergence from the reference.
    pub max_kld: Option<f64>,
    /// `--min-top1`: the share of tokens whose top token is the reference's.
    pub min_top1: Option<f64>,
    /// `--max-ppl-ratio`: the perplexity over the reference's.
    pub max_ppl_ratio: Option<f64>,
}

impl PplBounds {
    /// Whether any bound is set (each needs a reference).
    pub fn any(&self) -> bool {
        self.max_kld
            .or(self.min_top1)
            .or(self.max_ppl_ratio)
            .is_some()
    }

    /// `report` against the bounds; without a comparison with a reference, nothing crosses.
    pub fn check(&self, report: &PplReport) -> Gate {
        let mut gate = Gate::new(self.any());
        if let Some(c) = &report.reference {
            gate.check("--max-kld", Keep::AtMost, self.max_kld, c.kld.mean, || {
                format!("mean KL divergence {:.5}", c.kld.mean)
            });
            gate.check("--min-top1", Keep::AtLeast, self.min_top1, c.top1, || {
                format!("same top token {:.4}", c.top1)
            });
            gate.check(
                "--max-ppl-ratio",
                Keep::AtMost,
                self.max_ppl_ratio,
                c.ppl_ratio,
                || format!("perplexity ratio {:.5}", c.ppl_ratio),
            );
        }
        gate
    }
}

/// Options of a perplexity run.
pub struct PplOptions {
    /// The log-probabilities kept per token when saving the reference (and read back).
    pub top_k: usize,
}

/// Scores `model` on `chunks` (from [`chunks`]), against `reference`; with `save`, writes the
/// reference's top k per scored token as it goes. `done(i)` after each chunk.
pub fn perplexity(
    model: &Model,
    chunks: &[Vec<u32>],
    mut reference: Reference<'_>,
    mut save: Option<&mut SavedWriter>,
    options: &PplOptions,
    mut done: impl FnMut(usize),
) -> Result<PplReport, EvalError> {
    let ctx = chunks.first().map_or(0, Vec::len);
    let mut t = Tally::default();
    for (i, chunk) in chunks.iter().enumerate() {
        let ours = scored_logits(model, chunk)?;
        let theirs = match &reference {
            Reference::Live(r) => Some(scored_logits(r, chunk)?),
            _ => None,
        };
        let first = first_scored(ctx);
        for (j, mut q) in ours.into_iter().enumerate() {
            let next = chunk[first + j + 1] as usize;
            log_softmax(&mut q);
            t.nll.push(-f64::from(q[next]));
            let (ref_nll, top, full) = match (&mut reference, &theirs) {
                (Reference::Live(_), Some(all)) => {
                    let mut r = all[j].clone();
                    log_softmax(&mut r);
                    let top = top_k(&r, options.top_k);
                    if let Some(w) = save.as_deref_mut() {
                        w.push(-r[next], &top)?;
                    }
                    (-f64::from(r[next]), top, Some(kld_full(&r, &q)))
                }
                (Reference::Saved(s), _) => {
                    let (nll, top) = s.next_token()?;
                    (f64::from(nll), top, None)
                }
                _ => continue,
            };
            let k = kld_top_k(&top, &q);
            t.kld_top_k.push(k);
            t.kld.push(full.unwrap_or(k));
            t.ref_nll.push(ref_nll);
            if top.first().map(|p| p.0) == Some(argmax(&q)) {
                t.same_top += 1;
            }
            t.dp.push(f64::from(q[next]).exp() - (-ref_nll).exp());
        }
        done(i + 1);
    }
    if let Reference::Saved(s) = &reference {
        s.finish()?;
    }
    if let Some(w) = save {
        w.finish()?;
    }
    let n = t.nll.len();
    let mean_nll = mean(&t.nll);
    let var = t.nll.iter().map(|x| (x - mean_nll).powi(2)).sum::<f64>() / (n.max(2) - 1) as f64;
    let ppl = mean_nll.exp();
    let live = matches!(reference, Reference::Live(_));
    let comparison = (!t.ref_nll.is_empty()).then(|| {
        let ref_ppl = mean(&t.ref_nll).exp();
        Comparison {
            ppl: ref_ppl,
            ppl_ratio: ppl / ref_ppl,
            kld: Stats::of(&t.kld),
            kld_is_top_k: !live,
            top_k: options.top_k,
            top_k_mean: live.then(|| mean(&t.kld_top_k)),
            top1: t.same_top as f64 / n as f64,
            dp_rms: (t.dp.iter().map(|d| d * d).sum::<f64>() / n as f64).sqrt(),
            dp: Stats::of(&t.dp),
        }
    });
    Ok(PplReport {
        chunks: chunks.len(),
        ctx,
        tokens_scored: n,
        ppl,
        ppl_err: ppl * (var / n as f64).sqrt(),
        reference: comparison,
    })
}

/// Identity of an evaluation's input, kept in a saved reference so that it is only read
/// against the same vocabulary, text and cut.
pub fn tokens_hash(chunks: &[Vec<u32>]) -> [u8; 32] {
    let mut h = Sha256::new();
    for c in chunks {
        for t in c {
            h.update(t.to_le_bytes());
        }
    }
    h.finalize().into()
}

impl PplReport {
    /// Every figure, for `--json` and the quality record; `reference` says what was compared.
    pub fn figures(&self, reference: &str) -> serde_json::Value {
        let mut v = serde_json::json!({
            "ppl": self.ppl, "ppl_err": self.ppl_err, "ctx": self.ctx, "chunks": self.chunks,
            "tokens_scored": self.tokens_scored,
        });
        if let Some(c) = &self.reference {
            v["reference"] = serde_json::json!({
                "what": reference,
                "ppl": c.ppl,
                "ppl_ratio": c.ppl_ratio,
                "kld": c.kld.figures(),
                "kld_from_top_k": c.kld_is_top_k,
                "top_k": c.top_k,
                "kld_top_k_mean": c.top_k_mean,
                "top1": c.top1,
                "dp": c.dp.figures(),
                "dp_rms": c.dp_rms,
            });
        }
        v
    }

    /// The figures a person reads, in one line.
    pub fn summary(&self) -> String {
        match &self.reference {
            Some(c) => format!(
                "PPL {:.3} ({:+.2}% of the reference's {:.3}), mean KLD {:.4}, p99 {:.4}, same top token {:.1}%",
                self.ppl,
                (c.ppl_ratio - 1.0) * 100.0,
                c.ppl,
                c.kld.mean,
                c.kld.p99,
                c.top1 * 100.0
            ),
            None => format!("PPL {:.3} ± {:.3}", self.ppl, self.ppl_err),
        }
    }
}

impl Stats {
    fn figures(&self) -> serde_json::Value {
        serde_json::json!({"mean": self.mean, "min": self.min, "p1": self.p1, "p5": self.p5,
            "median": self.median, "p95": self.p95, "p99": self.p99, "max": self.max})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsm(v: &[f32]) -> Vec<f32> {
        let mut v = v.to_vec();
        log_softmax(&mut v);
        v
    }

    #[test]
    fn top_k_kld_is_a_lower_bound_that_reaches_the_full_one() {
        let r = lsm(&[2.0, 1.0, 0.5, -1.0, -3.0, 0.0]);
        let q = lsm(&[1.5, 1.2, 0.1, -0.5, -2.0, 0.3]);
        let full = kld_full(&r, &q);
        let mut last = 0.0;
        for k in 1..=r.len() {
            let part = kld_top_k(&top_k(&r, k), &q);
            assert!(part <= full + 1e-9, "k={k}: {part} > {full}");
            assert!(part + 1e-12 >= last, "k={k}: not monotone");
            last = part;
        }
        assert!((last - full).abs() < 1e-9);
        assert!(kld_full(&r, &r).abs() < 1e-9);
        assert!(full > 0.01);
    }

    #[test]
    fn top_k_is_sorted_and_exact() {
        let v = [0.1, 3.0, -2.0, 2.5, 3.0, 0.0];
        let t = top_k(&v, 3);
        assert_eq!(t.len(), 3);
        assert_eq!(t[2], (3, 2.5));
        assert!(t[0].1 >= t[1].1 && t[1].1 >= t[2].1);
        assert_eq!(top_k(&v, 99).len(), 6);
    }

    #[test]
    fn stats_interpolate_like_numpy() {
        let s = Stats::of(&[4.0, 1.0, 3.0, 2.0, 5.0]);
        assert_eq!((s.min, s.median, s.max, s.mean), (1.0, 3.0, 5.0, 3.0));
        assert!((s.p99 - 4.96).abs() < 1e-12);
        assert!((s.p5 - 1.2).abs() < 1e-12);
    }

    #[test]
    fn scored_positions_are_llama_perplexity_s() {
        assert_eq!((first_scored(512), scored_per_chunk(512)), (256, 255));
        assert_eq!((first_scored(5), scored_per_chunk(5)), (2, 2));
    }
}
