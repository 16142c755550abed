//! Labelled question pairs: read from a file, split into tuning and held-out halves, and
//! scored as the guard sees them.

use std::io::Read;
use std::path::Path;

use rayon::prelude::*;
use serde::Deserialize;

use crate::embed::{EmbedError, Embedder, cosine};
use crate::guard::{self, Veto};
use crate::verify::Verifier;

/// One labelled pair.
#[derive(Debug, Clone, Deserialize)]
pub struct Pair {
    /// What the pair tests ("antonym", "frame"...), in sets that say.
    #[serde(default)]
    pub kind: Option<String>,
    pub text_a: String,
    pub text_b: String,
    #[serde(deserialize_with = "label")]
    pub label: bool,
}

fn label<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    match v
        .as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    {
        Some(0) => Ok(false),
        Some(1) => Ok(true),
        _ => Err(serde::de::Error::custom(format!(
            "label {v}, expected 0 or 1"
        ))),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("cannot read {path}: {why}")]
    Read { path: String, why: String },
    #[error("{path}: {why}")]
    Format { path: String, why: String },
    #[error(transparent)]
    Embed(#[from] EmbedError),
}

/// Read pairs from a JSON array, plain or inside a gzip-compressed tar (GPTCache ships them
/// that way) or plain gzip.
pub fn read_pairs(path: &Path) -> Result<Vec<Pair>, EvalError> {
    let shown = path.display().to_string();
    let read_err = |why: String| EvalError::Read {
        path: shown.clone(),
        why,
    };
    let raw = std::fs::read(path).map_err(|e| read_err(e.to_string()))?;
    let json = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut plain)
            .map_err(|e| read_err(format!("gzip: {e}")))?;
        // A tar has "ustar" at byte 257 of its first header.
        if plain.get(257..262) == Some(b"ustar") {
            json_member(&plain).map_err(|e| read_err(format!("tar: {e}")))?
        } else {
            plain
        }
    } else {
        raw
    };
    serde_json::from_slice(&json).map_err(|e| EvalError::Format {
        path: shown.clone(),
        why: format!("expected a JSON array of {{text_a, text_b, label}}: {e}"),
    })
}

fn json_member(tar_bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut archive = tar::Archive::new(tar_bytes);
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let is_json = entry
            .path()
            .map(|p| p.extension().is_some_and(|x| x == "json"))
            .unwrap_or(false);
        if is_json {
            let mut out = Vec::new();
            entry.read_to_end(&mut out).map_err(|e| e.to_string())?;
            return Ok(out);
        }
    }
    Err("no .json member".into())
}

/// Which split a pair belongs to: a hash of both texts, so the split does not depend on the
/// file's order and a pair never moves between runs. `held_out` of 0.5 puts about half out.
pub fn is_held_out(p: &Pair, held_out: f64) -> bool {
    (pair_hash(p) % 10_000) as f64 / 10_000.0 < held_out
}

/// Whether a tuning pair is in the calibration fifth: kept out of the verifier's training
/// (`scripts/train-verifier.py` splits alike), so its calibration and thresholds are chosen
/// on pairs it has not seen.
pub fn is_calibration(p: &Pair) -> bool {
    (pair_hash(p) / 10_000).is_multiple_of(5)
}

/// FNV-1a over `text_a`, a zero byte and `text_b`.
pub fn pair_hash(p: &Pair) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in p.text_a.bytes().chain([0]).chain(p.text_b.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A pair as the guard sees it: similarity, the veto that applies (if any), label.
#[derive(Debug, Clone)]
pub struct Scored {
    pub cosine: f32,
    pub veto: Option<Veto>,
    /// Every content word aligned (the guard's second threshold applies).
    pub aligned: bool,
    pub label: bool,
    /// The verifier's logit, for a pair it would be asked about (at or above
    /// [`VERIFY_FROM`], no hard veto) when a verifier scored the pairs.
    pub logit: Option<f32>,
    /// In the tuning half's calibration fifth ([`is_calibration`]).
    pub calibration: bool,
}

/// The least cosine at which pairs are given to the verifier when scored.
pub const VERIFY_FROM: f32 = 0.5;

/// Embed both sides of every pair on the current rayon pool and read what differs, as the
/// cache does when `text_b` is asked and `text_a` is cached; `tick` is called once per pair
/// done (for a progress bar).
pub fn score_pairs(
    e: &Embedder,
    verifier: Option<&Verifier>,
    pairs: &[Pair],
    tick: &(dyn Fn() + Sync),
) -> Result<Vec<Scored>, EvalError> {
    pairs
        .par_iter()
        .map(|p| {
            let c = cosine(&e.embed(&p.text_a)?, &e.embed(&p.text_b)?);
            let x = guard::explain(&p.text_b, &p.text_a, Some(e));
            let asked = c >= VERIFY_FROM && !x.veto.is_some_and(Veto::is_hard);
            let logit = match verifier {
                Some(v) if asked => Some(v.logit(&p.text_a, &p.text_b)?),
                _ => None,
            };
            tick();
            Ok(Scored {
                cosine: c,
                veto: x.veto,
                aligned: x.aligned(),
                label: p.label,
                logit,
                calibration: is_calibration(p),
            })
        })
        .collect()
}

/// Every `len / limit`-th pair, `limit` of them, when `limit` asks for fewer than there are:
/// a sample spread over the whole file.
pub fn sample(pairs: Vec<Pair>, limit: Option<usize>) -> Vec<Pair> {
    match limit.filter(|&l| l > 0 && l < pairs.len()) {
        Some(limit) => {
            let step = pairs.len() / limit;
            pairs.into_iter().step_by(step).take(limit).collect()
        }
        None => pairs,
    }
}

/// One half of a file's pairs with their scores, in the file's order.
#[derive(Debug, Default)]
pub struct Half<'a> {
    pub pairs: Vec<&'a Pair>,
    pub scored: Vec<Scored>,
}

/// One file's pairs, scored, split into tuning and held-out halves ([`is_held_out`]).
#[derive(Debug)]
pub struct Split<'a> {
    pub tune: Half<'a>,
    pub held: Half<'a>,
}

impl<'a> Split<'a> {
    pub fn new(pairs: &'a [Pair], scored: Vec<Scored>, held_out: f64) -> Split<'a> {
        let mut s = Split {
            tune: Half::default(),
            held: Half::default(),
        };
        for (p, sc) in pairs.iter().zip(scored) {
            let half = if is_held_out(p, held_out) {
                &mut s.held
            } else {
                &mut s.tune
            };
            half.pairs.push(p);
            half.scored.push(sc);
        }
        s
    }
}

/// Duplicate (or paraphrase) pairs and the others among `scored`.
pub fn counts(scored: &[Scored]) -> (usize, usize) {
    let dup = scored.iter().filter(|s| s.label).count();
    (dup, scored.len() - dup)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn reads_the_packaged_tar_gz() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../data/semantic-cache/similiar_qqp_full.json.gz");
        let pairs = read_pairs(&path).unwrap();
        assert_eq!(pairs.len(), 80_854);
        assert_eq!(pairs.iter().filter(|p| p.label).count(), 30_141);
        let held = pairs.iter().filter(|p| is_held_out(p, 0.5)).count();
        assert!((38_000..43_000).contains(&held), "{held}");
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        std::fs::write(&p, br#"[{"text_a": "a", "text_b": "b", "label": 7}]"#).unwrap();
        let err = read_pairs(&p).unwrap_err().to_string();
        assert!(err.contains("label 7"), "{err}");
        std::fs::write(&p, b"\x1f\x8b garbage").unwrap();
        assert!(read_pairs(&p).unwrap_err().to_string().contains("gzip"));
        let missing = read_pairs(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("cannot read"), "{missing}");
    }
}
