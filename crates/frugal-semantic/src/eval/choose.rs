//! The guard's thresholds chosen on the tuning halves within wrong-hit limits, and what the
//! held-out halves keep of them: the figures and curves `frugal eval-cache` reports.

use super::measure::{
    KindRate, Point, best_thresholds, by_kind, hits, lowest_threshold, measure, sweep, with_totals,
};
use super::pairs::{Half, Pair, Scored, Split};
use crate::guard::Guard;

/// Plain cosine: no vetoes (its thresholds set by a sweep or a choice).
pub const PLAIN: Guard = Guard {
    threshold: 0.0,
    aligned_threshold: 0.0,
    vetoes: false,
};

/// The guard, vetoes on.
pub const GUARDED: Guard = Guard {
    vetoes: true,
    ..PLAIN
};

/// The cosine thresholds of the held-out table.
pub const SWEEP: [f32; 10] = [0.80, 0.85, 0.88, 0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98];

/// The wrong hits a choice may serve on the tuning halves, as shares: of QQP's other pairs and
/// of all near misses, and of the near misses of any one kind.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_wrong: f64,
    pub max_kind_wrong: f64,
}

impl Limits {
    /// Whether the near misses of `rates` are within the limits: overall and per kind.
    pub(super) fn near_misses_ok(&self, rates: &[KindRate]) -> bool {
        let near: Vec<&KindRate> = rates.iter().filter(|r| !r.label).collect();
        let (pairs, hits) = near
            .iter()
            .fold((0, 0), |(p, h), r| (p + r.pairs, h + r.hits));
        hits as f64 <= self.max_wrong * pairs as f64
            && near.iter().all(|r| r.rate() <= self.max_kind_wrong)
    }
}

/// One rule's thresholds, chosen on the tuning halves, and what they serve of QQP's halves.
#[derive(Debug, Clone, Copy)]
pub struct Chosen {
    /// "plain cosine" or "guarded".
    pub rule: &'static str,
    pub guard: Guard,
    pub tuning: Point,
    pub held: Point,
}

/// Plain cosine's lowest threshold within the limits on QQP's tuning half, then the guard's
/// two thresholds, chosen together to serve the most tuning duplicates within the limits on
/// QQP's tuning half and on the near misses' tuning half, overall and per kind.
pub fn choose(qqp: &Split, near: &Split, limits: Limits) -> Vec<Chosen> {
    let tune = &qqp.tune.scored;
    let within = |g: &Guard| {
        measure(g, tune).wrong_rate <= limits.max_wrong
            && (!g.vetoes
                || limits.near_misses_ok(&by_kind(g, &near.tune.pairs, &near.tune.scored)))
    };
    [("plain cosine", PLAIN), ("guarded", GUARDED)]
        .into_iter()
        .map(|(rule, g)| {
            let guard = if g.vetoes {
                best_thresholds(g, tune, within)
            } else {
                let threshold = lowest_threshold(g, within);
                Guard {
                    threshold,
                    aligned_threshold: threshold,
                    ..g
                }
            };
            Chosen {
                rule,
                guard,
                tuning: measure(&guard, tune),
                held: measure(&guard, &qqp.held.scored),
            }
        })
        .collect()
}

/// Hits among the near misses or paraphrases of one kind (or a total) at a threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct KindRow {
    pub kind: String,
    pub paraphrase: bool,
    pub tuning_pairs: usize,
    pub tuning_hit: f64,
    pub held_pairs: usize,
    pub held_hit: f64,
    /// Plain cosine's hits on the held-out half at the same threshold.
    pub held_plain_hit: f64,
}

/// The near-miss set's hits per kind, with a total per label, at `at`: on each half, and on
/// the held-out half for plain cosine; in the held-out half's kinds and order.
pub fn kind_rows(at: &Guard, near: &Split) -> Vec<KindRow> {
    let plain_at = Guard {
        vetoes: false,
        ..*at
    };
    let rates = |g: &Guard, half: &Half| with_totals(by_kind(g, &half.pairs, &half.scored));
    let (tune_rates, held_rates) = (rates(at, &near.tune), rates(at, &near.held));
    let plain_rates = rates(&plain_at, &near.held);
    // The same kind and label in another list (absent: no pairs).
    let find = |v: &[KindRate], h: &KindRate| {
        v.iter()
            .find(|r| r.kind == h.kind && r.label == h.label)
            .map_or((0, 0.0), |r| (r.pairs, r.rate()))
    };
    held_rates
        .iter()
        .map(|h| {
            let ((tuning_pairs, tuning_hit), (_, held_plain_hit)) =
                (find(&tune_rates, h), find(&plain_rates, h));
            KindRow {
                kind: h.kind.clone(),
                paraphrase: h.label,
                tuning_pairs,
                tuning_hit,
                held_pairs: h.pairs,
                held_hit: h.rate(),
                held_plain_hit,
            }
        })
        .collect()
}

/// The tuning pairs to look at: the near misses and paraphrases the vetoes alone (whatever
/// the similarity) let through or refuse, then QQP's pairs `at` serves though labelled
/// different.
pub fn tuning_errors<'a, 'b>(
    qqp: &'b Split<'a>,
    near: &'b Split<'a>,
    at: &Guard,
) -> Vec<(&'a Pair, &'b Scored)> {
    let tuning = |s: &'b Split<'a>| s.tune.pairs.iter().copied().zip(&s.tune.scored);
    let near_errors = tuning(near).filter(|(_, s)| s.veto.is_none() != s.label);
    let qqp_errors = tuning(qqp).filter(|(_, s)| !s.label && hits(at, s));
    near_errors.chain(qqp_errors).collect()
}

/// `guard` over `scored` at cosine thresholds 0.70 to 1.00 in steps of 0.005: a curve of the
/// share of wrong pairs served against the share of right ones.
pub fn curve(guard: Guard, scored: &[Scored]) -> Vec<Point> {
    let fine: Vec<f32> = (0..=60).map(|i| 0.70 + i as f32 * 0.005).collect();
    sweep(guard, scored, &fine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::Veto;

    fn pair(kind: &str, label: bool) -> Pair {
        Pair {
            kind: Some(kind.into()),
            text_a: "a".into(),
            text_b: "b".into(),
            label,
        }
    }

    fn scored(cosine: f32, veto: Option<Veto>, label: bool) -> Scored {
        Scored {
            cosine,
            veto,
            aligned: false,
            label,
            logit: None,
            calibration: false,
        }
    }

    #[test]
    fn choices_keep_the_limits_on_tuning_and_report_held_out() {
        let (dup, other) = (pair("qqp", true), pair("qqp", false));
        // Tuning: duplicates at 0.95 and 0.91, another pair at 0.92 that a veto turns away.
        let qqp = Split {
            tune: Half {
                pairs: vec![&dup, &dup, &other],
                scored: vec![
                    scored(0.95, None, true),
                    scored(0.91, None, true),
                    scored(0.92, Some(Veto::Numbers), false),
                ],
            },
            held: Half {
                pairs: vec![&dup, &other],
                scored: vec![
                    scored(0.93, None, true),
                    scored(0.94, Some(Veto::Negation), false),
                ],
            },
        };
        let (miss, para) = (pair("antonym", false), pair("synonym", true));
        let near = Split {
            tune: Half {
                pairs: vec![&miss],
                scored: vec![scored(0.97, Some(Veto::Antonym), false)],
            },
            held: Half {
                pairs: vec![&miss, &para],
                scored: vec![
                    scored(0.96, Some(Veto::Antonym), false),
                    scored(0.95, None, true),
                ],
            },
        };
        let limits = Limits {
            max_wrong: 0.0,
            max_kind_wrong: 0.0,
        };
        let chosen = choose(&qqp, &near, limits);
        let (plain, guarded) = (chosen[0], chosen[1]);
        // Plain cosine stays above the other pair's 0.92: one duplicate of two.
        assert_eq!(plain.rule, "plain cosine");
        assert!(plain.guard.threshold > 0.92 && plain.guard.threshold <= 0.925);
        assert_eq!((plain.tuning.hit_rate, plain.tuning.wrong_rate), (0.5, 0.0));
        assert_eq!((plain.held.hit_rate, plain.held.wrong_rate), (1.0, 1.0));
        // The guard's veto lets it go down to the lower duplicate.
        assert_eq!(guarded.rule, "guarded");
        assert_eq!(
            (guarded.tuning.hit_rate, guarded.tuning.wrong_rate),
            (1.0, 0.0)
        );
        assert_eq!((guarded.held.hit_rate, guarded.held.wrong_rate), (1.0, 0.0));
        assert_eq!(
            tuning_errors(&qqp, &near, &guarded.guard).len(),
            0,
            "the near miss is vetoed, QQP's other pair too"
        );

        let rows = kind_rows(&guarded.guard, &near);
        let got: Vec<(&str, usize, usize, f64, f64)> = rows
            .iter()
            .map(|r| {
                let k = r.kind.as_str();
                (
                    k,
                    r.tuning_pairs,
                    r.held_pairs,
                    r.held_hit,
                    r.held_plain_hit,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("antonym", 1, 1, 0.0, 1.0),
                ("all near misses", 1, 1, 0.0, 1.0),
                ("synonym", 0, 1, 1.0, 1.0),
                ("all paraphrases", 0, 1, 1.0, 1.0),
            ]
        );
        let points = curve(GUARDED, &qqp.held.scored);
        assert_eq!(points.len(), 61);
        assert!(points.iter().all(|p| p.wrong_rate == 0.0));
    }
}
