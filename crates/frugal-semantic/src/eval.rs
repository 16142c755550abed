//! Measuring the semantic cache on labelled question pairs: for each pair, one question is
//! in the cache and the other is asked. A hit on a duplicate pair is a good hit; a hit on a
//! non-duplicate pair serves a wrong answer (GPTCache's benchmark protocol).

use std::io::Read;
use std::path::Path;

use rayon::prelude::*;
use serde::Deserialize;

use crate::embed::{EmbedError, Embedder, cosine};
use crate::guard::{self, Guard, Veto};

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
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in p.text_a.bytes().chain([0]).chain(p.text_b.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (h % 10_000) as f64 / 10_000.0 < held_out
}

/// A pair as the guard sees it: similarity, the veto that applies (if any), label.
#[derive(Debug, Clone)]
pub struct Scored {
    pub cosine: f32,
    pub veto: Option<Veto>,
    /// Every content word aligned (the guard's second threshold applies).
    pub aligned: bool,
    pub label: bool,
}

/// Embed both sides of every pair on the current rayon pool and read what differs, as the
/// cache does when `text_b` is asked and `text_a` is cached; `tick` is called once per pair
/// done (for a progress bar).
pub fn score_pairs(
    e: &Embedder,
    pairs: &[Pair],
    tick: &(dyn Fn() + Sync),
) -> Result<Vec<Scored>, EvalError> {
    pairs
        .par_iter()
        .map(|p| {
            let c = cosine(&e.embed(&p.text_a)?, &e.embed(&p.text_b)?);
            let x = guard::explain(&p.text_b, &p.text_a, Some(e));
            tick();
            Ok(Scored {
                cosine: c,
                veto: x.veto,
                aligned: x.aligned(),
                label: p.label,
            })
        })
        .collect()
}

/// The area under the ROC curve of `scores` for `labels`: the chance that a random duplicate
/// pair scores above a random other pair (ties count half), by the rank-sum formula.
pub fn roc_auc(scores: &[f32], labels: &[bool]) -> f64 {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum, mut i) = (0.0f64, 0);
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        // Tied scores share the mean of their ranks (1-based).
        let mean_rank = (i + j) as f64 / 2.0 + 1.0;
        rank_sum += order[i..=j].iter().filter(|&&k| labels[k]).count() as f64 * mean_rank;
        i = j + 1;
    }
    let pos = labels.iter().filter(|&&l| l).count() as f64;
    let neg = labels.len() as f64 - pos;
    if pos == 0.0 || neg == 0.0 {
        return f64::NAN;
    }
    (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg)
}

/// What a quantized embedder keeps of the exact (F32) one.
#[derive(Debug, Clone)]
pub struct QuantKept {
    pub texts: usize,
    /// Cosine of each text's quantized embedding to its exact one: mean, 1st percentile, least.
    pub cosine_mean: f64,
    pub cosine_p1: f64,
    pub cosine_min: f64,
    /// ROC AUC of the pairs' cosine for their labels, with each embedder.
    pub auc_exact: f64,
    pub auc_quant: f64,
    /// Mean milliseconds per embedding, on one thread each.
    pub ms_exact: f64,
    pub ms_quant: f64,
}

/// Embeds both texts of every pair with both embedders (in parallel over pairs) and compares.
pub fn quant_kept(
    exact: &Embedder,
    quant: &Embedder,
    pairs: &[Pair],
    tick: &(dyn Fn() + Sync),
) -> Result<QuantKept, EvalError> {
    type Timed = (Vec<f32>, f64);
    let embed = |e: &Embedder, text: &str| -> Result<Timed, EvalError> {
        let t = std::time::Instant::now();
        let v = e.embed(text)?;
        Ok((v, t.elapsed().as_secs_f64() * 1e3))
    };
    // Per pair: (cosine of a and of b to exact, pair cosine exact, pair cosine quant, ms).
    let rows: Vec<([f32; 2], f32, f32, f64, f64)> = pairs
        .par_iter()
        .map(|p| {
            let (ea, ta) = embed(exact, &p.text_a)?;
            let (eb, tb) = embed(exact, &p.text_b)?;
            let (qa, ua) = embed(quant, &p.text_a)?;
            let (qb, ub) = embed(quant, &p.text_b)?;
            tick();
            Ok((
                [cosine(&qa, &ea), cosine(&qb, &eb)],
                cosine(&ea, &eb),
                cosine(&qa, &qb),
                ta + tb,
                ua + ub,
            ))
        })
        .collect::<Result<_, EvalError>>()?;
    let mut kept: Vec<f64> = rows.iter().flat_map(|r| r.0.map(f64::from)).collect();
    kept.sort_by(f64::total_cmp);
    let labels: Vec<bool> = pairs.iter().map(|p| p.label).collect();
    let n = kept.len().max(1) as f64;
    let exact_scores: Vec<f32> = rows.iter().map(|r| r.1).collect();
    let quant_scores: Vec<f32> = rows.iter().map(|r| r.2).collect();
    Ok(QuantKept {
        texts: kept.len(),
        cosine_mean: kept.iter().sum::<f64>() / n,
        cosine_p1: kept.get(kept.len() / 100).copied().unwrap_or(f64::NAN),
        cosine_min: kept.first().copied().unwrap_or(f64::NAN),
        auc_exact: roc_auc(&exact_scores, &labels),
        auc_quant: roc_auc(&quant_scores, &labels),
        ms_exact: rows.iter().map(|r| r.3).sum::<f64>() / n,
        ms_quant: rows.iter().map(|r| r.4).sum::<f64>() / n,
    })
}

/// Hit rates at one operating point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub threshold: f32,
    /// Share of duplicate pairs that hit.
    pub hit_rate: f64,
    /// Share of non-duplicate pairs that hit (each such hit serves a wrong answer).
    pub wrong_rate: f64,
}

/// Whether `guard` serves the cached answer for this pair.
pub fn hits(guard: &Guard, s: &Scored) -> bool {
    s.cosine >= guard.threshold_for(s.aligned) && !(guard.vetoes && s.veto.is_some())
}

pub fn measure(guard: &Guard, scored: &[Scored]) -> Point {
    let (mut dup, mut dup_hit, mut other, mut other_hit) = (0usize, 0usize, 0usize, 0usize);
    for s in scored {
        let hit = usize::from(hits(guard, s));
        if s.label {
            dup += 1;
            dup_hit += hit;
        } else {
            other += 1;
            other_hit += hit;
        }
    }
    Point {
        threshold: guard.threshold,
        hit_rate: dup_hit as f64 / dup.max(1) as f64,
        wrong_rate: other_hit as f64 / other.max(1) as f64,
    }
}

/// `guard` at each threshold (both of them).
pub fn sweep(guard: Guard, scored: &[Scored], thresholds: &[f32]) -> Vec<Point> {
    thresholds
        .iter()
        .map(|&threshold| {
            let g = Guard {
                threshold,
                aligned_threshold: threshold,
                ..guard
            };
            measure(&g, scored)
        })
        .collect()
}

/// The lowest threshold (both of them) on a 0.0025 grid from 0.5 at which `ok` holds
/// (1.0 if none).
pub fn lowest_threshold(guard: Guard, ok: impl Fn(&Guard) -> bool) -> f32 {
    grid()
        .map(|t| Guard {
            threshold: t,
            aligned_threshold: t,
            ..guard
        })
        .find(|g| ok(g))
        .map_or(1.0, |g| g.threshold)
}

fn grid() -> impl Iterator<Item = f32> + Clone {
    (0..=200).map(|i| 0.5 + i as f32 * 0.0025)
}

/// The two thresholds, chosen together on the grid: among the pairs at which `ok` holds,
/// the one that serves most duplicates of `scored` (of equals, the highest).
pub fn best_thresholds(guard: Guard, scored: &[Scored], ok: impl Fn(&Guard) -> bool) -> Guard {
    let mut best: Option<(f64, Guard)> = None;
    for t in grid().filter(|t| *t >= 0.8) {
        for a in grid().filter(|a| *a >= 0.8 && *a <= t) {
            let g = Guard {
                threshold: t,
                aligned_threshold: a,
                ..guard
            };
            let hit = measure(&g, scored).hit_rate;
            if best.is_none_or(|(h, _)| hit >= h) && ok(&g) {
                best = Some((hit, g));
            }
        }
    }
    best.map_or(
        Guard {
            threshold: 1.0,
            aligned_threshold: 1.0,
            ..guard
        },
        |(_, g)| g,
    )
}

/// Hits among the pairs of one kind and label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindRate {
    pub kind: String,
    /// Paraphrases (true) or near misses (false).
    pub label: bool,
    pub pairs: usize,
    pub hits: usize,
}

impl KindRate {
    pub fn rate(&self) -> f64 {
        self.hits as f64 / self.pairs.max(1) as f64
    }
}

/// `rates` (as [`by_kind`] orders them) with a total after each label's kinds: "all near
/// misses", then "all paraphrases".
pub fn with_totals(rates: Vec<KindRate>) -> Vec<KindRate> {
    let mut out = Vec::with_capacity(rates.len() + 2);
    for (label, name) in [(false, "all near misses"), (true, "all paraphrases")] {
        let of: Vec<KindRate> = rates.iter().filter(|r| r.label == label).cloned().collect();
        let total = KindRate {
            kind: name.into(),
            label,
            pairs: of.iter().map(|r| r.pairs).sum(),
            hits: of.iter().map(|r| r.hits).sum(),
        };
        out.extend(of);
        out.push(total);
    }
    out
}

/// `guard`'s hits per kind (pairs without one count as "other"): near misses first, then
/// paraphrases, each by kind name.
pub fn by_kind(guard: &Guard, pairs: &[&Pair], scored: &[Scored]) -> Vec<KindRate> {
    let mut rates: Vec<KindRate> = Vec::new();
    for (p, s) in pairs.iter().zip(scored) {
        let kind = p.kind.as_deref().unwrap_or("other");
        let at = match rates
            .iter()
            .position(|r| r.kind == kind && r.label == s.label)
        {
            Some(i) => i,
            None => {
                rates.push(KindRate {
                    kind: kind.to_string(),
                    label: s.label,
                    pairs: 0,
                    hits: 0,
                });
                rates.len() - 1
            }
        };
        rates[at].pairs += 1;
        rates[at].hits += usize::from(hits(guard, s));
    }
    rates.sort_by(|a, b| (a.label, &a.kind).cmp(&(b.label, &b.kind)));
    rates
}

/// How many pairs at or above `threshold` each veto turned away, per label: (veto,
/// duplicates vetoed, non-duplicates vetoed).
pub fn veto_counts(scored: &[Scored], threshold: f32) -> Vec<(Veto, usize, usize)> {
    Veto::ALL
        .iter()
        .map(|&v| {
            let near = scored
                .iter()
                .filter(|s| s.cosine >= threshold && s.veto == Some(v));
            let (dup, other): (Vec<&Scored>, Vec<&Scored>) = near.partition(|s| s.label);
            (v, dup.len(), other.len())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn pair(a: &str, b: &str, label: bool) -> Pair {
        Pair {
            kind: None,
            text_a: a.into(),
            text_b: b.into(),
            label,
        }
    }

    #[test]
    fn roc_auc_by_hand() {
        // Perfect, reversed, and with a tie across the classes (counted half).
        assert_eq!(
            roc_auc(&[0.1, 0.2, 0.8, 0.9], &[false, false, true, true]),
            1.0
        );
        assert_eq!(
            roc_auc(&[0.9, 0.8, 0.2, 0.1], &[false, false, true, true]),
            0.0
        );
        assert_eq!(roc_auc(&[0.5, 0.5], &[false, true]), 0.5);
        // 2 positives x 2 negatives: (0.3 > 0.2) (0.3 < 0.4) (0.9 > both) = 3 of 4.
        assert_eq!(
            roc_auc(&[0.2, 0.3, 0.4, 0.9], &[false, true, false, true]),
            0.75
        );
        assert!(roc_auc(&[0.1], &[true]).is_nan());
    }

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

    #[test]
    fn measure_counts_hits_per_label() {
        let e = crate::embed::tests::embedder();
        let pairs = vec![
            pair(
                "How do I learn French fast?",
                "How can I learn French quickly?",
                true,
            ),
            pair(
                "How do I learn French fast?",
                "How do I learn German fast?",
                false,
            ),
            pair("What is 2+2?", "What is 3+3?", false),
        ];
        let scored = score_pairs(e, &pairs, &|| {}).unwrap();
        // Capitalized names replaced: French is not German.
        assert_eq!(scored[1].veto, Some(Veto::Entity));
        assert_eq!(scored[2].veto, Some(Veto::Numbers));
        assert!(scored[0].veto.is_none() && !scored[0].aligned);
        let everything = Guard {
            threshold: -1.0,
            aligned_threshold: -1.0,
            vetoes: false,
        };
        let p = measure(&everything, &scored);
        assert_eq!((p.hit_rate, p.wrong_rate), (1.0, 1.0));
        let guarded = Guard {
            vetoes: true,
            ..everything
        };
        let p = measure(&guarded, &scored);
        assert_eq!(
            (p.hit_rate, p.wrong_rate),
            (1.0, 0.0),
            "vetoed pairs never hit"
        );
        let nothing = Guard {
            threshold: 1.01,
            aligned_threshold: 1.01,
            vetoes: false,
        };
        assert_eq!(measure(&nothing, &scored).hit_rate, 0.0);
        assert_eq!(veto_counts(&scored, -1.0)[0], (Veto::Numbers, 0, 1));
        // No wrong hits allowed: just above the closest non-duplicate.
        let t = lowest_threshold(everything, |g| measure(g, &scored).wrong_rate <= 0.0);
        let closest = scored[1].cosine.max(scored[2].cosine);
        assert!(t > closest && t - 0.0025 <= closest, "{t} {closest}");
    }
}
