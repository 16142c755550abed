//! Every figure of one evaluation, as `frugal eval-cache --json` writes them.

use serde_json::{Value, json};

use super::choose::{Chosen, KindRow};
use super::cost::OwnCost;
use super::measure::Point;

/// What one run of the evaluation measured.
pub struct Figures<'a> {
    /// QQP pairs read.
    pub pairs: usize,
    /// Held-out duplicates and others.
    pub held_out: (usize, usize),
    /// The held-out sweep, plain cosine and guarded.
    pub plain: &'a [Point],
    pub guarded: &'a [Point],
    pub chosen: &'a [Chosen],
    /// Hits per kind of near miss and paraphrase at the guarded threshold.
    pub kinds: &'a [KindRow],
    pub cost: &'a OwnCost,
}

impl Figures<'_> {
    pub fn to_json(&self) -> Value {
        let points = |pts: &[Point]| -> Vec<Value> {
            pts.iter()
                .map(
                    |p| json!({"threshold": p.threshold, "hit": p.hit_rate, "wrong": p.wrong_rate}),
                )
                .collect()
        };
        let chosen: Vec<Value> = self
            .chosen
            .iter()
            .map(|c| {
                json!({"rule": c.rule, "threshold": c.guard.threshold,
                    "aligned_threshold": c.guard.aligned_threshold, "held_hit": c.held.hit_rate,
                    "held_wrong": c.held.wrong_rate})
            })
            .collect();
        let kinds: Vec<Value> = self
            .kinds
            .iter()
            .map(|k| {
                json!({
                    "kind": k.kind, "paraphrase": k.paraphrase,
                    "tuning_pairs": k.tuning_pairs, "tuning_hit": k.tuning_hit,
                    "held_pairs": k.held_pairs, "held_hit": k.held_hit,
                    "held_plain_hit": k.held_plain_hit,
                })
            })
            .collect();
        let cost = self.cost;
        json!({
            "pairs": self.pairs,
            "held_out": {"duplicates": self.held_out.0, "others": self.held_out.1},
            "plain": points(self.plain),
            "guarded": points(self.guarded),
            "chosen": chosen,
            "kinds": kinds,
            "embed_p50_ms": cost.embed.0,
            "embed_p99_ms": cost.embed.1,
            "search_ms": cost.search_only_ms,
            "search_entries": cost.entries,
            "lookup_p50_ms": cost.lookup.0,
            "lookup_p99_ms": cost.lookup.1,
            "lookup_without_guard_p50_ms": cost.search.0,
            "lookup_without_guard_p99_ms": cost.search.1,
        })
    }
}
