//! What a lookup costs on this thread, timed in its parts as the cache runs them: embedding
//! the question, searching a flat index, and the guard on the nearest candidates.

use std::time::Instant;

use super::pairs::{EvalError, Pair};
use crate::embed::Embedder;
use crate::flat::FlatIndex;
use crate::guard::{self, Guard, Verdict};

/// Quantiles (p50, p99) in milliseconds.
pub type Quantiles = (f64, f64);

pub(super) fn quantiles(mut ms: Vec<f64>) -> Quantiles {
    ms.sort_by(f64::total_cmp);
    let q = |q: f64| {
        ms.get(((ms.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    (q(0.5), q(0.99))
}

/// The guard's reading of each pair of `pairs` (as when it is similar enough to judge):
/// p50 and p99, and how many pairs; nothing without pairs.
pub fn guard_cost(e: &Embedder, pairs: &[Pair]) -> Option<(Quantiles, usize)> {
    let times: Vec<f64> = pairs
        .iter()
        .map(|p| {
            let start = Instant::now();
            std::hint::black_box(guard::explain(&p.text_b, &p.text_a, Some(e)));
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    let n = times.len();
    (n > 0).then(|| (quantiles(times), n))
}

/// A lookup's parts, timed over single questions.
#[derive(Debug, Clone)]
pub struct OwnCost {
    pub embed: Quantiles,
    /// Embed + flat search.
    pub search: Quantiles,
    /// Embed + search + the guard on the nearest candidates (what the cache does).
    pub lookup: Quantiles,
    pub guard: Quantiles,
    /// The search alone, mean milliseconds.
    pub search_only_ms: f64,
    pub samples: usize,
    pub entries: usize,
    pub bytes_per_entry: usize,
}

/// A whole lookup of single questions on this thread, as the cache runs it: embed, search
/// a flat index of 10,000 entries (the other side of each pair, repeated), and the guard on
/// the 4 nearest; timed in parts.
pub fn own_cost(e: &Embedder, pairs: &[Pair], guard: &Guard) -> Result<OwnCost, EvalError> {
    let sample: Vec<&Pair> = pairs.iter().take(300).collect();
    let mut cached = FlatIndex::new(e.dim());
    let texts: Vec<&str> = sample.iter().map(|p| p.text_a.as_str()).collect();
    let vectors = texts
        .iter()
        .map(|t| e.embed(t))
        .collect::<Result<Vec<_>, _>>()?;
    let entries = 10_000;
    for i in 0..entries {
        if let Some(v) = vectors.get(i % vectors.len().max(1)) {
            cached.add(i as u64, v);
        }
    }
    let (mut embed, mut search, mut lookup, mut judged) = (vec![], vec![], vec![], vec![]);
    let mut search_total = 0.0;
    for p in &sample {
        let start = Instant::now();
        let v = e.embed(&p.text_b)?;
        let embedded = start.elapsed().as_secs_f64() * 1e3;
        let near = cached.search(&v, 4);
        let searched = start.elapsed().as_secs_f64() * 1e3;
        let g = Instant::now();
        for n in &near {
            let text = texts[n.id as usize % texts.len()];
            if guard.judge(&p.text_b, text, n.score, Some(e)) == Verdict::Same {
                break;
            }
        }
        let guard_ms = g.elapsed().as_secs_f64() * 1e3;
        embed.push(embedded);
        search.push(searched);
        search_total += searched - embedded;
        judged.push(guard_ms);
        lookup.push(searched + guard_ms);
    }
    Ok(OwnCost {
        embed: quantiles(embed),
        search: quantiles(search),
        lookup: quantiles(lookup),
        guard: quantiles(judged),
        search_only_ms: search_total / sample.len().max(1) as f64,
        samples: sample.len(),
        entries: cached.len(),
        bytes_per_entry: cached.bytes_per_entry(),
    })
}
