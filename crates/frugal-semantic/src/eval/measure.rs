//! What a guard serves of scored pairs: hit and wrong-hit rates at one threshold or a sweep,
//! the lowest or best thresholds within a limit, and hits per kind and per veto.

use super::pairs::{Pair, Scored};
use crate::guard::{Guard, Veto};

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
    by_kind_where(pairs, scored, |_, s| hits(guard, s))
}

/// Hits per kind as [`by_kind`] orders them, a pair hitting when `hit(its index, its score)`.
pub fn by_kind_where(
    pairs: &[&Pair],
    scored: &[Scored],
    hit: impl Fn(usize, &Scored) -> bool,
) -> Vec<KindRate> {
    let mut rates: Vec<KindRate> = Vec::new();
    for (i, (p, s)) in pairs.iter().zip(scored).enumerate() {
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
        rates[at].hits += usize::from(hit(i, s));
    }
    rates.sort_by(|a, b| (a.label, &a.kind).cmp(&(b.label, &b.kind)));
    rates
}

/// How many pairs at or above `threshold` each veto turned away, per label: (veto,
/// duplicates vetoed, non-duplicates vetoed).
pub fn veto_counts(scored: &[Scored], threshold: f32) -> Vec<(Veto, usize, usize)> {
    Veto::ALL
        .iter()
        .filter(|&&v| v != Veto::Verifier)
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
    use crate::eval::pairs::score_pairs;

    fn pair(a: &str, b: &str, label: bool) -> Pair {
        Pair {
            kind: None,
            text_a: a.into(),
            text_b: b.into(),
            label,
        }
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
        let scored = score_pairs(e, None, &pairs, &|| {}).unwrap();
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
