//! Measuring the semantic cache on labelled question pairs: for each pair, one question is
//! in the cache and the other is asked. A hit on a duplicate pair is a good hit; a hit on a
//! non-duplicate pair serves a wrong answer (GPTCache's benchmark protocol).
//!
//! `pairs` reads and scores the pairs, `measure` says what a guard serves of them, `choose`
//! picks the guard's thresholds on the tuning halves and reports the held-out ones, `verified`
//! measures the paraphrase verifier and the error budget behind the guard, `cost` times a
//! lookup, and `quant` compares a quantized embedder with the exact one.

mod choose;
mod cost;
mod figures;
mod measure;
mod pairs;
mod quant;
mod verified;

pub use choose::{
    Chosen, GUARDED, KindRow, Limits, PLAIN, SWEEP, choose, curve, kind_rows, tuning_errors,
};
pub use cost::{OwnCost, Quantiles, guard_cost, own_cost};
pub use figures::Figures;
pub use measure::{
    KindRate, Point, best_thresholds, by_kind, hits, lowest_threshold, measure, sweep, veto_counts,
    with_totals,
};
pub use pairs::{
    EvalError, Half, Pair, Scored, Split, VERIFY_FROM, counts, is_calibration, is_held_out,
    pair_hash, read_pairs, sample, score_pairs,
};
pub use quant::{QuantKept, quant_kept, roc_auc};
pub use verified::{
    FLOORS, Replay, Verified, calibrate, choose_verified, kind_rates, replay, verified_cost,
};
