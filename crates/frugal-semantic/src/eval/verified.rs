//! The verifier's stage measured on the same pairs: a pair is a candidate at or above a
//! cosine floor when no hard veto stands; the verifier's calibrated probability then decides,
//! by one fixed threshold chosen on the tuning halves' calibration fifth (the pairs the
//! verifier was not trained on), or by the error budget replayed over the held-out halves,
//! whose own estimate of its wrong-hit rate is set beside the one the labels give.

use std::time::Instant;

use super::choose::Limits;
use super::cost::Quantiles;
use super::measure::{KindRate, by_kind_where};
use super::pairs::{EvalError, Half, Pair, Scored, Split, pair_hash};
use crate::budget::{Budget, Served};
use crate::embed::{Embedder, cosine};
use crate::guard;
use crate::verify::{Calibration, Reading, Verifier};

/// The cosine floors tried.
pub const FLOORS: [f32; 8] = [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85];

/// The verifier's rule with a fixed probability threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verified {
    pub floor: f32,
    pub min_probability: f32,
    pub calibration: Calibration,
}

impl Verified {
    /// The calibrated probability of a candidate; `None` for a pair the verifier is not asked
    /// about (below the floor, or a hard veto).
    pub fn probability(&self, s: &Scored) -> Option<f32> {
        if s.cosine < self.floor {
            return None;
        }
        s.logit
            .map(|l| self.calibration.probability(l, &reading(s)))
    }

    pub fn hits(&self, s: &Scored) -> bool {
        self.probability(s)
            .is_some_and(|p| p >= self.min_probability)
    }
}

/// What the retrieval and the guard read of a scored pair.
pub fn reading(s: &Scored) -> Reading {
    Reading {
        cosine: s.cosine,
        aligned: s.aligned,
        soft_veto: s.veto.is_some(),
    }
}

/// The calibration's fit on the calibration fifth's candidates at `floor`, each set weighing as much
/// as the others whatever its size (QQP's thousands beside a few hundred hand-written pairs).
pub fn calibrate(sets: &[&Half], floor: f32) -> Calibration {
    let of: Vec<Vec<(f32, Reading, bool)>> = sets
        .iter()
        .map(|half| {
            half.scored
                .iter()
                .filter(|s| s.calibration && s.cosine >= floor)
                .filter_map(|s| s.logit.map(|l| (l, reading(s), s.label)))
                .collect()
        })
        .collect();
    // Weights that sum to the number of samples (Platt's smoothing counts them), each set's
    // to the same share.
    let total: usize = of.iter().map(Vec::len).sum();
    let filled = of.iter().filter(|v| !v.is_empty()).count().max(1);
    let mut samples = Vec::with_capacity(total);
    for set in of {
        let w = total as f64 / (filled * set.len().max(1)) as f64;
        samples.extend(set.into_iter().map(|(l, r, y)| (l, r, y, w)));
    }
    Calibration::fit(&samples)
}

/// Hits and wrong hits of `hit` over the calibration fifth of `half` (duplicates served,
/// others served, as shares).
fn calib_rates(half: &Half, hit: impl Fn(&Scored) -> bool) -> (f64, f64) {
    let (mut dup, mut dup_hit, mut other, mut other_hit) = (0usize, 0usize, 0usize, 0usize);
    for s in half.scored.iter().filter(|s| s.calibration) {
        let h = usize::from(hit(s));
        if s.label {
            dup += 1;
            dup_hit += h;
        } else {
            other += 1;
            other_hit += h;
        }
    }
    (
        dup_hit as f64 / dup.max(1) as f64,
        other_hit as f64 / other.max(1) as f64,
    )
}

/// The floor and probability threshold that serve the most (paraphrases' share plus QQP
/// duplicates' share) on the calibration fifth within `limits` (QQP's wrong hits, the near
/// misses' overall and per kind); `None` when no scored pair has a logit.
pub fn choose_verified(qqp: &Split, near: &Split, limits: Limits) -> Option<Verified> {
    let mut best: Option<(f64, Verified)> = None;
    for floor in FLOORS {
        // Calibrated on the hand-written pairs alone: QQP's labels call many pairs that ask
        // the same thing different (BENCHMARKS.md), which would tell the budget that its
        // surest hits are a few percent wrong. QQP still bounds the choice below.
        let calibration = calibrate(&[&near.tune], floor);
        let mut ps: Vec<f32> = [&qqp.tune, &near.tune]
            .iter()
            .flat_map(|h| h.scored.iter())
            .filter(|s| s.calibration && s.cosine >= floor)
            .filter_map(|s| s.logit.map(|l| calibration.probability(l, &reading(s))))
            .filter(|p| *p >= 0.5)
            .collect();
        ps.sort_by(f32::total_cmp);
        ps.dedup();
        for min_probability in ps {
            let rule = Verified {
                floor,
                min_probability,
                calibration,
            };
            let (qqp_hit, qqp_wrong) = calib_rates(&qqp.tune, |s| rule.hits(s));
            let calib: Vec<usize> = (0..near.tune.scored.len())
                .filter(|&i| near.tune.scored[i].calibration)
                .collect();
            let pairs: Vec<&Pair> = calib.iter().map(|&i| near.tune.pairs[i]).collect();
            let scored: Vec<Scored> = calib.iter().map(|&i| near.tune.scored[i].clone()).collect();
            let rates = by_kind_where(&pairs, &scored, |_, s| rule.hits(s));
            let (para_hit, _) = calib_rates(&near.tune, |s| rule.hits(s));
            let score = para_hit + qqp_hit;
            if qqp_wrong <= limits.max_wrong
                && limits.near_misses_ok(&rates)
                && best.is_none_or(|(b, _)| score > b)
            {
                best = Some((score, rule));
            }
        }
    }
    best.map(|(_, r)| r)
}

/// What the error budget served when the held-out halves' candidates were replayed through
/// it in one stream (ordered by a hash of each pair, so the sets interleave).
#[derive(Debug, Clone)]
pub struct Replay {
    pub max_error: f64,
    /// Per set, whether each held-out pair was served.
    pub served: Vec<Vec<bool>>,
    /// The budget's own account: hits and the expected wrong among them.
    pub account: Served,
    /// Wrong hits among those served, by the labels.
    pub wrong: usize,
    /// The threshold at the end of the replay.
    pub threshold: f32,
}

impl Replay {
    /// The measured share of served hits that were wrong.
    pub fn actual_rate(&self) -> f64 {
        self.wrong as f64 / self.account.hits.max(1) as f64
    }
}

/// Replays the held-out candidates of `sets` (at `rule`'s floor, with its calibration)
/// through a [`Budget`] of `max_error`.
pub fn replay(rule: &Verified, sets: &[&Split], max_error: f64) -> Replay {
    let budget = Budget::new(max_error);
    let mut stream: Vec<(u64, usize, usize)> = Vec::new();
    for (k, split) in sets.iter().enumerate() {
        for (i, p) in split.held.pairs.iter().enumerate() {
            stream.push((pair_hash(p), k, i));
        }
    }
    stream.sort_unstable();
    let mut served: Vec<Vec<bool>> = sets
        .iter()
        .map(|s| vec![false; s.held.pairs.len()])
        .collect();
    let mut wrong = 0;
    for (_, k, i) in stream {
        let s = &sets[k].held.scored[i];
        if let Some(p) = rule.probability(s)
            && budget.consider(p)
        {
            served[k][i] = true;
            wrong += usize::from(!s.label);
        }
    }
    Replay {
        max_error,
        served,
        account: budget.served(),
        wrong,
        threshold: budget.threshold(),
    }
}

/// Per kind, the share of a held-out half's pairs served under each of several rules.
pub fn kind_rates(half: &Half, hit: impl Fn(usize, &Scored) -> bool) -> Vec<KindRate> {
    by_kind_where(&half.pairs, &half.scored, hit)
}

/// A whole lookup with the verifier, one question at a time on this thread: embed the asked
/// question, the guard on its cached pair, then (a candidate) the verifier: p50 and p99 over
/// the pairs at or above `floor` without a hard veto, and how many.
pub fn verified_cost(
    e: &Embedder,
    v: &Verifier,
    pairs: &[Pair],
    floor: f32,
) -> Result<(Quantiles, usize), EvalError> {
    let mut ms = Vec::new();
    for p in pairs.iter().take(2_000) {
        let cached = e.embed(&p.text_a)?;
        let start = Instant::now();
        let asked = e.embed(&p.text_b)?;
        let c = cosine(&cached, &asked);
        let x = guard::explain(&p.text_b, &p.text_a, Some(e));
        if c < floor || x.veto.is_some_and(|v| v.is_hard()) {
            continue;
        }
        let r = Reading {
            cosine: c,
            aligned: x.aligned(),
            soft_veto: x.veto.is_some(),
        };
        std::hint::black_box(v.probability(&p.text_a, &p.text_b, &r)?);
        ms.push(start.elapsed().as_secs_f64() * 1e3);
        if ms.len() == 300 {
            break;
        }
    }
    let n = ms.len();
    Ok((super::cost::quantiles(ms), n))
}
