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
//! The logit becomes a probability by a logistic calibration over it, the pair's cosine and
//! the guard's reading (`calibration` in the file's metadata, fitted by `frugal eval-cache
//! --calibrate` on pairs the verifier was not trained on): the error budget (`budget`) spends
//! that probability, so it must mean what it says.

use std::collections::HashMap;
use std::path::Path;

use frugal_engine::quant::WeightType;
use safetensors::SafeTensors;

use crate::bert::{Adapter, Bert, EmbedError, HIDDEN, LAYERS, Weights};
use crate::embed;

/// The verifier frugal ships, relative to the repository root (compiled into the binary).
pub const DEFAULT_VERIFIER: &str = "data/semantic-cache/verifier.safetensors";

/// The least cosine at which a candidate is given to the verifier, for a file that does not
/// carry its own (`frugal eval-cache --calibrate` chooses it with the calibration).
pub const DEFAULT_FLOOR: f32 = 0.7;

/// A pair longer than this is cut, the longer question first (as it was trained).
const DEFAULT_MAX_TOKENS: usize = 96;

/// What is known of a candidate pair besides its text: the retrieval's cosine and the
/// guard's reading (every content word aligned; a soft veto, which the verifier overrides).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub cosine: f32,
    pub aligned: bool,
    pub soft_veto: bool,
}

/// The features the calibration weighs: the verifier's logit, the cosine, alignment, a soft
/// veto.
pub const FEATURES: usize = 4;

fn features(logit: f32, r: &Reading) -> [f64; FEATURES] {
    [
        f64::from(logit),
        f64::from(r.cosine),
        f64::from(u8::from(r.aligned)),
        f64::from(u8::from(r.soft_veto)),
    ]
}

/// Platt scaling widened to the pair's reading: `P(same) = 1 / (1 + exp(-(w . x + b)))` over
/// [`FEATURES`]. The verifier alone ranks pairs less well than with the cosine beside it
/// (the two err on different pairs), so both go into the probability the budget spends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    pub w: [f32; FEATURES],
    pub b: f32,
}

impl Calibration {
    /// Uncalibrated: the logit's own sigmoid.
    pub const IDENTITY: Calibration = Calibration {
        w: [1.0, 0.0, 0.0, 0.0],
        b: 0.0,
    };

    pub fn probability(&self, logit: f32, r: &Reading) -> f32 {
        let z: f64 = features(logit, r)
            .iter()
            .zip(self.w)
            .map(|(x, w)| x * f64::from(w))
            .sum::<f64>()
            + f64::from(self.b);
        (1.0 / (1.0 + (-z).exp())) as f32
    }

    /// Logistic regression of `(logit, reading, same, weight)` samples by Newton's method,
    /// with Platt's smoothed targets (a separable sample still gives finite weights) and a
    /// small ridge.
    pub fn fit(samples: &[(f32, Reading, bool, f64)]) -> Calibration {
        const N: usize = FEATURES + 1;
        let pos: f64 = samples.iter().filter(|s| s.2).map(|s| s.3).sum();
        let neg: f64 = samples.iter().filter(|s| !s.2).map(|s| s.3).sum();
        let (hi, lo) = ((pos + 1.0) / (pos + 2.0), 1.0 / (neg + 2.0));
        let mut theta = [0.0f64; N];
        theta[0] = 1.0;
        for _ in 0..50 {
            let mut g = [0.0f64; N];
            let mut h = [[0.0f64; N]; N];
            for (i, row) in h.iter_mut().enumerate() {
                row[i] = 1e-6;
            }
            for (logit, r, y, weight) in samples {
                let f = features(*logit, r);
                let x: [f64; N] = std::array::from_fn(|i| if i < FEATURES { f[i] } else { 1.0 });
                let z: f64 = x.iter().zip(&theta).map(|(a, b)| a * b).sum();
                let p = 1.0 / (1.0 + (-z).exp());
                let t = if *y { hi } else { lo };
                let w = weight * (p * (1.0 - p)).max(1e-12);
                for i in 0..N {
                    g[i] += weight * (p - t) * x[i];
                    for j in 0..N {
                        h[i][j] += w * x[i] * x[j];
                    }
                }
            }
            let Some(step) = solve(h, g) else { break };
            for (t, d) in theta.iter_mut().zip(&step) {
                *t -= d;
            }
            if step.iter().all(|d| d.abs() < 1e-9) {
                break;
            }
        }
        Calibration {
            w: std::array::from_fn(|i| theta[i] as f32),
            b: theta[FEATURES] as f32,
        }
    }

    /// The calibration as the file's metadata writes it: the weights, then the bias.
    pub fn to_metadata(&self) -> String {
        self.w
            .iter()
            .chain([&self.b])
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn from_metadata(text: &str) -> Option<Calibration> {
        let v: Vec<f32> = text
            .split_whitespace()
            .map(|t| t.parse().ok().filter(|x: &f32| x.is_finite()))
            .collect::<Option<_>>()?;
        (v.len() == FEATURES + 1).then(|| Calibration {
            w: std::array::from_fn(|i| v[i]),
            b: v[FEATURES],
        })
    }
}

/// `h x = g` by Gaussian elimination with partial pivoting; `None` when singular.
fn solve<const N: usize>(mut h: [[f64; N]; N], mut g: [f64; N]) -> Option<[f64; N]> {
    for col in 0..N {
        let pivot = (col..N).max_by(|&a, &b| h[a][col].abs().total_cmp(&h[b][col].abs()))?;
        if h[pivot][col].abs() < 1e-15 {
            return None;
        }
        h.swap(col, pivot);
        g.swap(col, pivot);
        for row in col + 1..N {
            let f = h[row][col] / h[col][col];
            let top = h[col];
            for (cell, &above) in h[row].iter_mut().zip(&top).skip(col) {
                *cell -= f * above;
            }
            g[row] -= f * g[col];
        }
    }
    let mut x = [0.0f64; N];
    for row in (0..N).rev() {
        let rest: f64 = (row + 1..N).map(|k| h[row][k] * x[k]).sum();
        x[row] = (g[row] - rest) / h[row][row];
    }
    Some(x)
}

fn read(file: &Path) -> Result<Vec<u8>, EmbedError> {
    std::fs::read(file).map_err(|source| EmbedError::Read {
        path: file.to_path_buf(),
        source,
    })
}

/// `bytes`' tensors and metadata, read from `file`.
fn parse<'a>(
    file: &Path,
    bytes: &'a [u8],
) -> Result<(SafeTensors<'a>, HashMap<String, String>), EmbedError> {
    let format = |source| EmbedError::Format {
        path: file.to_path_buf(),
        source,
    };
    let st = SafeTensors::deserialize(bytes).map_err(format)?;
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(format)?;
    Ok((st, meta.metadata().clone().unwrap_or_default()))
}

/// The loaded verifier. Immutable: share it across threads; each call runs on the caller's.
#[derive(Debug)]
pub struct Verifier {
    tokenizer: tokenizers::Tokenizer,
    bert: Bert,
    head: Vec<f32>,
    bias: f32,
    pub calibration: Calibration,
    /// The least cosine of a candidate, chosen with the calibration.
    pub floor: f32,
}

impl Verifier {
    /// The verifier in `file` on the embedder in `base_dir` (`models/minilm`).
    pub fn load(base_dir: &Path, file: &Path) -> Result<Verifier, EmbedError> {
        let bytes = read(file)?;
        let (st, meta) = parse(file, &bytes)?;
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
            return Err(bad(
                "layers",
                format!("{layers} layers, expected 1 to {LAYERS}"),
            ));
        }
        let max_tokens = number("max_tokens")?.map_or(DEFAULT_MAX_TOKENS, |m| m as usize);
        let floor = number("floor")?.unwrap_or(DEFAULT_FLOOR);
        let calibration = match meta.get("calibration") {
            Some(text) => Calibration::from_metadata(text).ok_or_else(|| {
                bad(
                    "calibration",
                    format!("metadata {text:?} is not {} numbers", FEATURES + 1),
                )
            })?,
            None => Calibration::IDENTITY,
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
                return Err(bad(
                    &b_name,
                    format!("shape {b_shape:?}, expected [out, {rank}]"),
                ));
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
            floor,
        })
    }

    /// Writes the calibration `c` and the cosine `floor` chosen with it into `file`'s
    /// metadata (in place, through a temporary file and a rename).
    pub fn write_choice(file: &Path, c: &Calibration, floor: f32) -> Result<(), EmbedError> {
        let bytes = read(file)?;
        let (st, mut meta) = parse(file, &bytes)?;
        meta.insert("calibration".into(), c.to_metadata());
        meta.insert("floor".into(), floor.to_string());
        let part = file.with_extension("part");
        safetensors::serialize_to_file(st.tensors(), Some(meta), &part).map_err(|source| {
            EmbedError::Format {
                path: part.clone(),
                source,
            }
        })?;
        std::fs::rename(&part, file).map_err(|source| EmbedError::Read {
            path: file.to_path_buf(),
            source,
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
        Ok(mean
            .iter()
            .zip(&self.head)
            .map(|(m, w)| m / n * w)
            .sum::<f32>()
            + self.bias)
    }

    /// The calibrated probability that `cached`'s answer is right for `asked`, given what
    /// the retrieval and the guard read of the pair.
    pub fn probability(&self, cached: &str, asked: &str, r: &Reading) -> Result<f32, EmbedError> {
        Ok(self.calibration.probability(self.logit(cached, asked)?, r))
    }
}

#[cfg(test)]
mod tests;
