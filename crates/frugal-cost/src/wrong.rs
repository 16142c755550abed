//! The semantic cache's wrong hits, estimated from what was served.
//!
//! A paraphrase verifier gives each semantic hit it lets through a calibrated probability
//! `p` that the cached answer is right for the question asked: the hit is wrong with
//! chance `1 - p`. Over `n` hits, independent Bernoulli outcomes, the expected number wrong
//! is Σ(1 - p) and its variance Σ p(1 - p); the wrong-hit rate is estimated as Σ(1 - p)/n,
//! with the 95% interval ± 1.96·sqrt(Σ p(1 - p))/n, clamped to [0, 1].
//!
//! The ledger keeps the sums in billionths ([`Chances`]): integers add exactly and in any
//! order, as the rollups add them in SQL, so a report reads the same on both backends
//! however its rows come.

use std::iter::Sum;
use std::ops::{Add, AddAssign};

use serde::Serialize;

/// The z-score of a two-sided 95% interval.
const Z95: f64 = 1.96;
const BILLION: f64 = 1e9;

/// A sum of chances (probabilities), in billionths.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Chances(i64);

impl Chances {
    pub const ZERO: Chances = Chances(0);

    /// `p` to the nearest billionth (saturating far outside [0, 1]).
    pub fn from_f64(p: f64) -> Chances {
        Chances((p * BILLION).round() as i64)
    }

    pub fn from_billionths(v: i64) -> Chances {
        Chances(v)
    }

    pub fn billionths(self) -> i64 {
        self.0
    }

    pub fn as_f64(self) -> f64 {
        self.0 as f64 / BILLION
    }
}

impl Add for Chances {
    type Output = Chances;
    fn add(self, o: Chances) -> Chances {
        Chances(self.0.saturating_add(o.0))
    }
}

impl AddAssign for Chances {
    fn add_assign(&mut self, o: Chances) {
        *self = *self + o;
    }
}

impl Sum for Chances {
    fn sum<I: Iterator<Item = Chances>>(iter: I) -> Chances {
        iter.fold(Chances::ZERO, Add::add)
    }
}

/// A hit's chance of being wrong as the ledger keeps it: in [0, 1]; none for a value that
/// is not a number.
pub fn chance(p: Option<f64>) -> Option<f64> {
    p.filter(|p| !p.is_nan()).map(|p| p.clamp(0.0, 1.0))
}

/// The estimated wrong-hit rate of served hits, with its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Estimate {
    pub hits: u64,
    pub rate: f64,
    pub low: f64,
    pub high: f64,
}

/// The estimate over `hits` hits whose chances of being wrong add up to `expected_wrong`,
/// with `variance` the sum of `p (1 - p)`; all zero for no hits.
pub fn estimate(hits: u64, expected_wrong: f64, variance: f64) -> Estimate {
    if hits == 0 {
        return Estimate {
            hits: 0,
            rate: 0.0,
            low: 0.0,
            high: 0.0,
        };
    }
    let n = hits as f64;
    let rate = (expected_wrong / n).clamp(0.0, 1.0);
    let half = Z95 * variance.max(0.0).sqrt() / n;
    Estimate {
        hits,
        rate,
        low: (rate - half).max(0.0),
        high: (rate + half).min(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn a_hundred_hits_at_two_percent_are_two_percent_wrong_give_or_take() {
        // Σ(1-p) = 2, Σ p(1-p) = 100 · 0.98 · 0.02 = 1.96: half-width 1.96 · 1.4 / 100.
        let e = estimate(100, 2.0, 1.96);
        assert_eq!(e.hits, 100);
        assert!(close(e.rate, 0.02), "{e:?}");
        assert!(close(e.high, 0.02 + 0.02744), "{e:?}");
        assert_eq!(e.low, 0.0, "clamped at zero: {e:?}");
        // Ten thousand such hits: the interval narrows a hundredfold in variance.
        let e = estimate(10_000, 200.0, 196.0);
        assert!(close(e.rate, 0.02), "{e:?}");
        assert!(close(e.low, 0.02 - 0.002744), "{e:?}");
        assert!(close(e.high, 0.02 + 0.002744), "{e:?}");
    }

    #[test]
    fn no_hits_estimate_nothing_and_bounds_stay_in_zero_to_one() {
        assert_eq!(estimate(0, 0.0, 0.0).rate, 0.0);
        let e = estimate(2, 1.9, 0.09);
        assert!(e.high <= 1.0 && e.low >= 0.0 && e.low < e.rate, "{e:?}");
    }

    #[test]
    fn chances_add_exactly_in_billionths() {
        let sum: Chances = (0..100).map(|_| Chances::from_f64(0.02)).sum();
        assert_eq!(sum.billionths(), 2_000_000_000);
        assert_eq!(sum.as_f64(), 2.0);
        assert_eq!(chance(Some(f64::NAN)), None);
        assert_eq!(chance(Some(1.5)), Some(1.0));
        assert_eq!(chance(Some(-0.1)), Some(0.0));
        assert_eq!(chance(Some(0.25)), Some(0.25));
    }
}
