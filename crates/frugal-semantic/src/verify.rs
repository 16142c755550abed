//! The paraphrase verifier: a small cross-encoder that reads a cached question and an asked
//! one together and gives the probability that one answer is right for both.
//!
//! Cosine similarity embeds each question alone, so it cannot weigh the one word that
//! changes an answer against the many that reword it: "Who wrote Dune?" / "Who is the author
//! of Dune?" sits below pairs that ask different things. The verifier attends across both
//! questions at once. It is the first layers of the cache's own embedder (all-MiniLM-L6-v2,
//! so no second base model is fetched) with a low-rank adapter merged into each linear layer
//! and one linear head on the mean of the last layer, trained for paraphrase identification
//! by `scripts/train-verifier.py`; the file holds only the adapter, the head and the
//! calibration (about a megabyte). It runs on the embedder's forward pass (`bert`), ~0.8 ms
//! a layer for a 28-token pair on one core.
//!
//! The logit becomes a probability by Platt scaling (`calibration` in the file's metadata,
//! fitted by `frugal eval-cache` on pairs the verifier was not trained on): the error budget
//! (`budget`) spends that probability, so it must mean what it says.

use std::path::Path;

use frugal_engine::quant::WeightType;
use safetensors::SafeTensors;

use crate::bert::{Adapter, Bert, EmbedError, HIDDEN, LAYERS, Weights};
use crate::embed;

/// The verifier frugal ships, relative to the repository root (compiled into the binary).
pub const DEFAULT_VERIFIER: &str = "data/semantic-cache/verifier.safetensors";

/// The least cosine at which a candidate is given to the verifier: chosen with the
/// verifier's calibration by `frugal eval-cache` on the tuning halves' calibration fifth.
pub const DEFAULT_FLOOR: f32 = 0.7;

/// A pair longer than this is cut, the longer question first (as it was trained).
const DEFAULT_MAX_TOKENS: usize = 96;

/// Platt scaling: `P(same) = 1 / (1 + exp(-(a * logit + b)))`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    pub a: f32,
    pub b: f32,
}

impl Calibration {
    /// Uncalibrated: the logit's own sigmoid.
    pub const IDENTITY: Calibration = Calibration { a: 1.0, b: 0.0 };

    pub fn probability(&self, logit: f32) -> f32 {
        1.0 / (1.0 + (-(self.a * logit + self.b)).exp())
    }

    /// The Platt fit of `(logit, same)` samples: logistic regression on one feature by
    /// Newton's method, with Platt's smoothed targets so that a separable sample still gives
    /// finite weights.
    /// Each sample is `(logit, same, weight)`.
    pub fn fit(samples: &[(f32, bool, f64)]) -> Calibration {
        let pos: f64 = samples.iter().filter(|s| s.1).map(|s| s.2).sum();
        let neg: f64 = samples.iter().filter(|s| !s.1).map(|s| s.2).sum();
        let hi = (pos + 1.0) / (pos + 2.0);
        let lo = 1.0 / (neg + 2.0);
        let (mut a, mut b) = (1.0f64, 0.0f64);
        for _ in 0..100 {
            let (mut ga, mut gb, mut haa, mut hab, mut hbb) = (0.0, 0.0, 1e-9, 0.0, 1e-9);
            for &(x, y, weight) in samples {
                let x = f64::from(x);
                let t = if y { hi } else { lo };
                let p = 1.0 / (1.0 + (-(a * x + b)).exp());
                let w = weight * (p * (1.0 - p)).max(1e-12);
                ga += weight * (p - t) * x;
                gb += weight * (p - t);
                haa += w * x * x;
                hab += w * x;
                hbb += w;
            }
            let det = haa * hbb - hab * hab;
            if det.abs() < 1e-18 {
                break;
            }
            let da = (hbb * ga - hab * gb) / det;
            let db = (haa * gb - hab * ga) / det;
            a -= da;
            b -= db;
            if da.abs() < 1e-9 && db.abs() < 1e-9 {
                break;
            }
        }
        Calibration {
            a: a as f32,
            b: b as f32,
        }
    }
}

/// The loaded verifier. Immutable: share it across threads; each call runs on the caller's.
#[derive(Debug)]
pub struct Verifier {
    tokenizer: tokenizers::Tokenizer,
    bert: Bert,
    head: Vec<f32>,
    bias: f32,
    pub calibration: Calibration,
}

impl Verifier {
    /// The verifier in `file` on the embedder in `base_dir` (`models/minilm`).
    pub fn load(base_dir: &Path, file: &Path) -> Result<Verifier, EmbedError> {
        let bytes = std::fs::read(file).map_err(|source| EmbedError::Read {
            path: file.to_path_buf(),
            source,
        })?;
        let format = |source| EmbedError::Format {
            path: file.to_path_buf(),
            source,
        };
        let st = SafeTensors::deserialize(&bytes).map_err(format)?;
        let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(format)?;
        let meta = meta.metadata().clone().unwrap_or_default();
        let bad = |name: &str, why: String| EmbedError::Tensor {
            path: file.to_path_buf(),
            name: name.to_string(),
            why,
        };
        let number = |key: &str| -> Result<Option<f32>, EmbedError> {
            meta.get(key)
                .map(|v| {
                    v.parse::<f32>()
                        .ok()
                        .filter(|x| x.is_finite())
                        .ok_or_else(|| bad(key, format!("metadata {v:?} is not a number")))
                })
                .transpose()
        };
        let layers = number("layers")?.map_or(LAYERS, |l| l as usize);
        if !(1..=LAYERS).contains(&layers) {
            return Err(bad("layers", format!("{layers} layers, expected 1 to {LAYERS}")));
        }
        let max_tokens = number("max_tokens")?.map_or(DEFAULT_MAX_TOKENS, |m| m as usize);
        let calibration = match (number("platt_a")?, number("platt_b")?) {
            (Some(a), Some(b)) => Calibration { a, b },
            _ => Calibration::IDENTITY,
        };
        let w = Weights { path: file, st };
        let mut adapter = Adapter::new();
        for name in w.st.names() {
            let Some(base) = name.strip_suffix(".lora_a") else {
                continue;
            };
            let a_shape = w.shape(name).unwrap_or_default();
            let b_name = format!("{base}.lora_b");
            let b_shape = w
                .shape(&b_name)
                .ok_or_else(|| bad(&b_name, "missing".into()))?;
            let [rank, cols] = a_shape[..] else {
                return Err(bad(name, format!("shape {a_shape:?}, expected [rank, in]")));
            };
            if b_shape.len() != 2 || b_shape[1] != rank {
                return Err(bad(&b_name, format!("shape {b_shape:?}, expected [out, {rank}]")));
            }
            let a = w.f32s(name, &a_shape)?;
            let b = w.f32s(&b_name, &b_shape)?;
            adapter.insert(base.to_string(), (a, b, rank, cols));
        }
        let head = w.f32s("head.weight", &[HIDDEN])?;
        let bias = w.f32s("head.bias", &[1])?[0];
        let bert = Bert::load(base_dir, WeightType::Q8_0, layers, &adapter)?;
        let tokenizer = embed::tokenizer(base_dir, max_tokens)?;
        Ok(Verifier {
            tokenizer,
            bert,
            head,
            bias,
            calibration,
        })
    }

    /// The head's raw score for serving `cached`'s answer to `asked` (higher: the same).
    pub fn logit(&self, cached: &str, asked: &str) -> Result<f32, EmbedError> {
        let enc = self
            .tokenizer
            .encode((cached, asked), true)
            .map_err(|e| EmbedError::Encode(e.to_string()))?;
        let x = self.bert.forward(enc.get_ids(), enc.get_type_ids())?;
        let n = (x.len() / HIDDEN).max(1) as f32;
        let mut mean = [0f32; HIDDEN];
        for row in x.chunks_exact(HIDDEN) {
            for (m, v) in mean.iter_mut().zip(row) {
                *m += v;
            }
        }
        Ok(mean.iter().zip(&self.head).map(|(m, w)| m / n * w).sum::<f32>() + self.bias)
    }

    /// The calibrated probability that `cached`'s answer is right for `asked`.
    pub fn probability(&self, cached: &str, asked: &str) -> Result<f32, EmbedError> {
        Ok(self.calibration.probability(self.logit(cached, asked)?))
    }
}

#[cfg(test)]
mod tests;
