//! The semantic cache's error budget: serve as many near hits as the user's bound on wrong
//! ones allows, instead of one similarity threshold fixed in advance.
//!
//! The user states `max_error`: the share of served semantic hits that may be wrong (vCache,
//! ICLR 2026, calls it δ). Each candidate comes with the verifier's calibrated probability
//! `p` that its cached answer is right; serving it costs `1 - p` of expected error. Served
//! in order of `p`, the expected error of everything above a threshold `t` is the mean of
//! `1 - p` over it, so the budget serves down to the lowest `t` whose mean stays within
//! `max_error`: confident hits pay for a few doubtful ones, which a fixed threshold cannot
//! do. `t` is learned online from the last [`WINDOW`] candidates (the traffic the cache
//! actually sees); with none yet it is `1 - max_error`, where each hit alone is within the
//! bound. It never goes below [`FLOOR`]: a pair the verifier thinks more likely different
//! than the same is never served, whatever the budget.
//!
//! The estimate of the wrong-hit rate is the mean `1 - p` of what was served, with a 95%
//! interval from the variance of a sum of independent Bernoulli outcomes (Σ p(1-p)).

use std::collections::VecDeque;
use std::sync::Mutex;

use frugal_cost::wrong;
pub use frugal_cost::wrong::Estimate;

/// Candidates the threshold is learned from.
pub const WINDOW: usize = 4096;
/// The least probability ever served.
pub const FLOOR: f32 = 0.5;
/// The default bound: 2% of served semantic hits wrong, vCache's default. On the
/// hand-written held-out pairs it serves 70% of paraphrases and 1% of near misses; 1% serves
/// 38% of paraphrases (`frugal eval-cache`, BENCHMARKS.md).
pub const DEFAULT_MAX_ERROR: f64 = 0.02;
/// Candidates between recomputations of the threshold (a sort of the window).
const REFRESH: usize = 32;

/// One error budget. Cheap to share: a mutex over a few counters and the window.
#[derive(Debug)]
pub struct Budget {
    max_error: f64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    window: VecDeque<f32>,
    threshold: f32,
    since_refresh: usize,
    served: Served,
}

/// What a budget has served so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Served {
    /// Candidates seen (above the retrieval floor, through the vetoes).
    pub candidates: u64,
    /// Semantic hits served.
    pub hits: u64,
    /// Expected wrong hits among them: Σ (1 - p).
    pub expected_wrong: f64,
    /// The variance of the number of wrong hits: Σ p (1 - p).
    pub variance: f64,
}

impl Served {
    /// The estimated wrong-hit rate of what was served, with its 95% interval (the ledger's
    /// rows give the report the same estimate).
    pub fn estimate(&self) -> Estimate {
        wrong::estimate(self.hits, self.expected_wrong, self.variance)
    }
}

impl Budget {
    pub fn new(max_error: f64) -> Budget {
        let max_error = max_error.clamp(0.0, 1.0);
        Budget {
            max_error,
            state: Mutex::new(State {
                window: VecDeque::with_capacity(WINDOW),
                threshold: cold_threshold(max_error),
                since_refresh: 0,
                served: Served::default(),
            }),
        }
    }

    pub fn max_error(&self) -> f64 {
        self.max_error
    }

    /// The least probability served now.
    pub fn threshold(&self) -> f32 {
        self.lock().threshold
    }

    /// Records a candidate of probability `p` and says whether to serve it; a served one is
    /// charged to the estimate.
    pub fn consider(&self, p: f32) -> bool {
        let p = if p.is_finite() {
            p.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let mut s = self.lock();
        if s.window.len() == WINDOW {
            s.window.pop_front();
        }
        s.window.push_back(p);
        s.since_refresh += 1;
        if s.since_refresh >= REFRESH || s.window.len() <= REFRESH {
            s.since_refresh = 0;
            s.threshold = learned_threshold(&s.window, self.max_error);
        }
        s.served.candidates += 1;
        let serve = p >= s.threshold;
        if serve {
            let p = f64::from(p);
            s.served.hits += 1;
            s.served.expected_wrong += 1.0 - p;
            s.served.variance += p * (1.0 - p);
        }
        serve
    }

    pub fn served(&self) -> Served {
        self.lock().served
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The threshold with no evidence: each hit alone within the bound.
fn cold_threshold(max_error: f64) -> f32 {
    ((1.0 - max_error) as f32).max(FLOOR)
}

/// The lowest probability in `window` such that the candidates at or above it have a mean
/// `1 - p` within `max_error`; the cold threshold when none qualifies.
pub fn learned_threshold(window: &VecDeque<f32>, max_error: f64) -> f32 {
    let mut ps: Vec<f32> = window.iter().copied().collect();
    ps.sort_unstable_by(|a, b| b.total_cmp(a));
    let mut wrong = 0.0f64;
    let mut best = cold_threshold(max_error);
    for (k, &p) in ps.iter().enumerate() {
        if p < FLOOR {
            break;
        }
        wrong += 1.0 - f64::from(p);
        // Only where the next candidate differs: ties are served or refused together.
        let next_differs = ps.get(k + 1).is_none_or(|&q| q < p);
        if next_differs && wrong <= max_error * (k + 1) as f64 {
            best = best.min(p);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_no_evidence_each_hit_alone_is_within_the_bound() {
        let b = Budget::new(0.01);
        assert!((b.threshold() - 0.99).abs() < 1e-6);
        assert!(!b.consider(0.98));
        assert!(b.consider(0.995));
    }

    #[test]
    fn confident_hits_pay_for_doubtful_ones_and_the_mean_stays_within_the_bound() {
        let b = Budget::new(0.01);
        // 95 candidates at 0.999 and 5 at 0.85: the mean error of all is 0.0085.
        for i in 0..400 {
            let p = if i % 20 == 0 { 0.85 } else { 0.999 };
            b.consider(p);
        }
        assert!(b.threshold() <= 0.85, "{}", b.threshold());
        assert!(b.consider(0.85));
        let e = b.served().estimate();
        assert!(e.rate <= 0.01 + 1e-9, "{e:?}");
    }

    #[test]
    fn doubtful_traffic_is_refused_and_nothing_below_the_floor_is_served() {
        let b = Budget::new(0.5);
        for _ in 0..100 {
            b.consider(0.4);
        }
        assert!(!b.consider(0.45));
        assert_eq!(b.threshold(), FLOOR);
        let tight = Budget::new(0.01);
        for _ in 0..100 {
            tight.consider(0.9);
        }
        assert!(!tight.consider(0.9), "0.9 alone is 10% wrong");
        assert_eq!(tight.served().hits, 0);
    }

    #[test]
    fn the_interval_holds_the_rate_and_narrows_with_hits() {
        let mut s = Served::default();
        for _ in 0..100 {
            s.hits += 1;
            s.expected_wrong += 0.02;
            s.variance += 0.98 * 0.02;
        }
        let e = s.estimate();
        assert!(
            (e.rate - 0.02).abs() < 1e-9 && e.low < 0.02 && e.high > 0.02,
            "{e:?}"
        );
        let wide = e.high - e.low;
        for _ in 0..900 {
            s.hits += 1;
            s.expected_wrong += 0.02;
            s.variance += 0.98 * 0.02;
        }
        assert!(s.estimate().high - s.estimate().low < wide);
        assert_eq!(Served::default().estimate().rate, 0.0);
    }
}
