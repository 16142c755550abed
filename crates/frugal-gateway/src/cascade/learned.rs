//! A learned router: the chance that the cheap tier answers a question right, from the
//! question's embedding and length, by L2-regularised logistic regression.
//!
//! The kNN skip rule ([`super::route::SkipRule`]) votes with the few nearest labelled
//! questions; a linear model weighs every labelled question at once, which is steadier when
//! the neighbours are few or mixed (RouteLLM's strongest routers are of this family: a
//! score from the prompt's embedding, a threshold on it). Fitted by full-batch gradient
//! descent: a few hundred passes over a few thousand 385-wide rows take milliseconds, so no
//! solver crate is worth its weight here.

use std::path::{Path, PathBuf};

use frugal_semantic::{EmbedError, Embedder};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Passes of gradient descent, and its step.
const PASSES: usize = 400;
const STEP: f32 = 0.5;

/// The model: weights over the embedding, one for the log of the question's length in
/// bytes, and a bias.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinearRouter {
    pub weights: Vec<f32>,
    pub length: f32,
    pub bias: f32,
}

/// The length feature: log bytes, centred near a short question's.
fn length_feature(bytes: usize) -> f32 {
    ((bytes.max(1) as f32).ln() - 4.0) / 2.0
}

fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

impl LinearRouter {
    /// Fits on `(embedding, question length in bytes, the cheap tier was right)`, with L2
    /// penalty `l2` on the weights (not the bias). Classes are weighted to balance, so a
    /// set the cheap tier mostly fails still learns where it succeeds.
    pub fn fit(examples: &[(&[f32], usize, bool)], l2: f32) -> LinearRouter {
        let dim = examples.first().map_or(0, |e| e.0.len());
        let mut r = LinearRouter {
            weights: vec![0.0; dim],
            length: 0.0,
            bias: 0.0,
        };
        let n = examples.len();
        if n == 0 {
            return r;
        }
        let right = examples.iter().filter(|e| e.2).count();
        let weight = |ok: bool| {
            let of = if ok { right } else { n - right };
            n as f32 / (2.0 * of.max(1) as f32)
        };
        let mut grad = vec![0.0f32; dim];
        for _ in 0..PASSES {
            grad.iter_mut().for_each(|g| *g = 0.0);
            let (mut g_len, mut g_bias) = (0.0f32, 0.0f32);
            for &(v, bytes, ok) in examples {
                let x_len = length_feature(bytes);
                let p = sigmoid(r.score(v, x_len));
                let e = (p - f32::from(u8::from(ok))) * weight(ok);
                for (g, x) in grad.iter_mut().zip(v) {
                    *g += e * x;
                }
                g_len += e * x_len;
                g_bias += e;
            }
            let scale = STEP / n as f32;
            for (w, g) in r.weights.iter_mut().zip(&grad) {
                *w -= scale * (g + l2 * n as f32 * *w);
            }
            r.length -= scale * (g_len + l2 * n as f32 * r.length);
            r.bias -= scale * g_bias;
        }
        r
    }

    fn score(&self, v: &[f32], x_len: f32) -> f32 {
        let dot: f32 = self.weights.iter().zip(v).map(|(w, x)| w * x).sum();
        dot + self.length * x_len + self.bias
    }

    /// The chance the cheap tier answers this question right (balanced classes: 0.5 is
    /// even odds against the base rate).
    pub fn probability(&self, embedding: &[f32], bytes: usize) -> f32 {
        sigmoid(self.score(embedding, length_feature(bytes)))
    }
}

/// What `frugal route train` writes and a route's `router` names: the model and what it
/// was trained on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterFile {
    /// "linear": [`LinearRouter`] (the only kind so far; named so that others can follow).
    pub kind: String,
    /// The embedding width it was trained on: the route's embedder must match.
    pub dim: usize,
    /// Examples it was trained on, and how many the cheap tier answered right.
    pub examples: usize,
    pub right: usize,
    pub router: LinearRouter,
}

/// The L2 penalty `frugal route train` fits with, as `frugal eval-route` does.
pub const L2: f32 = 1e-3;

#[derive(Debug, Error)]
pub enum RouterFileError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a router file (`frugal route train` writes them): {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: a router of kind `{kind}`; this build reads `linear`")]
    Kind { path: PathBuf, kind: String },
    #[error("{path}: {weights} weights for a {dim}-wide embedding")]
    Width {
        path: PathBuf,
        weights: usize,
        dim: usize,
    },
}

impl RouterFile {
    /// `router`, `dim` wide, trained on examples labelled `labels` (the cheap tier right).
    pub fn linear(router: LinearRouter, dim: usize, labels: impl Iterator<Item = bool>) -> Self {
        let (mut examples, mut right) = (0, 0);
        for ok in labels {
            examples += 1;
            right += usize::from(ok);
        }
        RouterFile {
            kind: "linear".into(),
            dim,
            examples,
            right,
            router,
        }
    }

    /// A linear router fitted on `examples` (a prompt, and whether the cheap tier answered
    /// it right), each embedded by `embedder`; and how many of them it labels right itself
    /// (in-sample: a sanity check, not a measure).
    pub fn train(
        embedder: &Embedder,
        examples: &[(&str, bool)],
    ) -> Result<(RouterFile, usize), EmbedError> {
        let vectors = examples
            .iter()
            .map(|(prompt, _)| embedder.embed(prompt))
            .collect::<Result<Vec<_>, _>>()?;
        let rows: Vec<(&[f32], usize, bool)> = vectors
            .iter()
            .zip(examples)
            .map(|(v, (prompt, ok))| (&v[..], prompt.len(), *ok))
            .collect();
        let router = LinearRouter::fit(&rows, L2);
        let agree = rows
            .iter()
            .filter(|&&(v, bytes, ok)| (router.probability(v, bytes) >= 0.5) == ok)
            .count();
        let labels = examples.iter().map(|e| e.1);
        Ok((RouterFile::linear(router, embedder.dim(), labels), agree))
    }

    pub fn read(path: &Path) -> Result<RouterFile, RouterFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| RouterFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        let file: RouterFile =
            serde_json::from_str(&text).map_err(|source| RouterFileError::Parse {
                path: path.to_owned(),
                source,
            })?;
        if file.kind != "linear" {
            return Err(RouterFileError::Kind {
                path: path.to_owned(),
                kind: file.kind,
            });
        }
        if file.router.weights.len() != file.dim {
            return Err(RouterFileError::Width {
                path: path.to_owned(),
                weights: file.router.weights.len(),
                dim: file.dim,
            });
        }
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_learns_which_side_the_cheap_tier_gets_right() {
        // The cheap tier is right where the first coordinate is positive, whatever the rest.
        let mut rng = 1u64;
        let mut next = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        let rows: Vec<(Vec<f32>, bool)> = (0..400)
            .map(|_| {
                let v: Vec<f32> = (0..8).map(|_| next()).collect();
                let ok = v[0] > 0.0;
                (v, ok)
            })
            .collect();
        let examples: Vec<(&[f32], usize, bool)> =
            rows.iter().map(|(v, ok)| (&v[..], 40, *ok)).collect();
        let r = LinearRouter::fit(&examples, 1e-3);
        let right = rows
            .iter()
            .filter(|(v, ok)| (r.probability(v, 40) > 0.5) == *ok)
            .count();
        assert!(right >= 380, "{right} of 400");
        assert!(r.weights[0] > 5.0 * r.weights[1].abs(), "{:?}", r.weights);
        // No examples: even odds.
        assert_eq!(LinearRouter::fit(&[], 1e-3).probability(&[], 10), 0.5);
    }

    #[test]
    fn router_files_are_read_strictly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("router.json");
        let file = RouterFile {
            kind: "linear".into(),
            dim: 2,
            examples: 4,
            right: 2,
            router: LinearRouter {
                weights: vec![1.0, -1.0],
                length: 0.0,
                bias: 0.0,
            },
        };
        let write = |f: &RouterFile| std::fs::write(&path, serde_json::to_string(f).unwrap());
        write(&file).unwrap();
        assert_eq!(RouterFile::read(&path).unwrap(), file);
        let err = |f: &RouterFile| {
            write(f).unwrap();
            RouterFile::read(&path).unwrap_err().to_string()
        };
        let knn = RouterFile {
            kind: "knn".into(),
            ..file.clone()
        };
        assert!(err(&knn).contains("a router of kind `knn`"));
        let wide = RouterFile {
            dim: 3,
            ..file.clone()
        };
        assert!(err(&wide).contains("2 weights for a 3-wide embedding"));
        std::fs::write(&path, "{").unwrap();
        let e = RouterFile::read(&path).unwrap_err().to_string();
        assert!(e.contains("not a router file"), "{e}");
    }
}
