//! What a unit of inference costs: the sums of one (workload, model), their line of unit
//! costs (per thousand requests, per million tokens) and what the levers saved on them.

use serde::Serialize;

use crate::money::Money;
use crate::rollup::Sums;
use crate::wrong::{self, Chances};

/// Unit costs of inference for one (workload, model) or one model.
#[derive(Debug, Clone, Serialize)]
pub struct InferenceLine {
    pub workload: Option<String>,
    pub model: Option<String>,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Cost of the requests themselves.
    pub cost: Money,
    /// Idle capacity of the same workload (and model), paid for these requests.
    pub idle_cost: Money,
    /// Waste inside busy capacity (utilization below 1).
    pub waste: Money,
    /// (cost + idle) per 1,000 requests.
    pub per_1k: Option<Money>,
    pub per_m_input: Option<Money>,
    pub per_m_output: Option<Money>,
    /// Cost per million tokens, input and output together, where the price does not split.
    pub per_m_tokens: Option<Money>,
    /// Busy share of paid capacity; `None` for pay-per-token models.
    pub utilization: Option<f64>,
    /// What the levers saved on these requests, beside what they cost.
    pub saved: Savings,
    /// The semantic cache's hits a verifier judged, and how many of them were likely
    /// wrong; `None` where there were none.
    pub semantic: Option<WrongHits>,
}

/// Semantic hits served on a paraphrase verifier's word, with the estimated share of them
/// that answered a different question (see `crate::wrong`), beside the bound they were
/// served under where the report was told it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WrongHits {
    pub verified_hits: u64,
    /// The expected number of wrong hits among them: Σ (1 - p).
    pub expected_wrong: f64,
    /// The estimated wrong-hit rate, and its 95% interval.
    pub wrong_rate: f64,
    pub wrong_low: f64,
    pub wrong_high: f64,
    /// `semantic_max_error`: the share of semantic hits that may be wrong, where known.
    pub max_error: Option<f64>,
}

impl WrongHits {
    /// Over `hits` hits whose chances of being wrong sum to `expected`, with `variance`;
    /// `None` for no hits.
    pub(super) fn of(hits: u64, expected: Chances, variance: Chances) -> Option<WrongHits> {
        let e = wrong::estimate(hits, expected.as_f64(), variance.as_f64());
        (hits > 0).then_some(WrongHits {
            verified_hits: hits,
            expected_wrong: expected.as_f64(),
            wrong_rate: e.rate,
            wrong_low: e.low,
            wrong_high: e.high,
            max_error: None,
        })
    }
}

/// Money saved by each lever: the calls the caches answered and routing kept from the
/// dearest tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Savings {
    pub cache: Money,
    pub semantic_cache: Money,
    pub routing: Money,
    pub batching: Money,
    pub prefix_cache: Money,
}

impl Savings {
    pub fn total(&self) -> Money {
        self.cache + self.semantic_cache + self.routing + self.batching + self.prefix_cache
    }

    pub(super) fn add(&mut self, s: &Sums) {
        self.cache += s.saved_cache;
        self.semantic_cache += s.saved_semantic;
        self.routing += s.saved_routing;
        self.batching += s.saved_batching;
        self.prefix_cache += s.saved_prefix;
    }

    pub(super) fn merge(&mut self, o: &Savings) {
        self.cache += o.cache;
        self.semantic_cache += o.semantic_cache;
        self.routing += o.routing;
        self.batching += o.batching;
        self.prefix_cache += o.prefix_cache;
    }
}

/// Sums of one inference key.
#[derive(Default)]
pub(super) struct UnitAcc {
    requests: u64,
    input_tokens: u64,
    output_tokens: u64,
    pub(super) cost: Money,
    idle: Money,
    waste: Money,
    split_input_cost: Money,
    split_output_cost: Money,
    split_input_tokens: u64,
    split_output_tokens: u64,
    /// Capacity-priced cost and its busy part, for utilization.
    capacity_cost: Money,
    busy_cost: Money,
    saved: Savings,
    verified_hits: u64,
    expected_wrong: Chances,
    wrong_variance: Chances,
}

impl UnitAcc {
    pub(super) fn add_requests(&mut self, s: &Sums) {
        self.requests += s.requests as u64;
        self.input_tokens += s.input_tokens as u64;
        self.output_tokens += s.output_tokens as u64;
        self.cost += s.cost;
        self.split_input_cost += s.split_input_cost;
        self.split_output_cost += s.split_cost - s.split_input_cost;
        self.split_input_tokens += s.split_input_tokens as u64;
        self.split_output_tokens += s.split_output_tokens as u64;
        self.waste += s.waste;
        self.capacity_cost += s.capacity_cost;
        self.busy_cost += s.capacity_cost - s.waste;
        self.saved.add(s);
        self.verified_hits += s.verified_hits.max(0) as u64;
        self.expected_wrong += s.expected_wrong;
        self.wrong_variance += s.wrong_variance;
    }

    pub(super) fn add_idle(&mut self, cost: Money) {
        self.idle += cost;
        self.capacity_cost += cost;
    }

    pub(super) fn merge(&mut self, o: &UnitAcc) {
        self.requests += o.requests;
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.cost += o.cost;
        self.idle += o.idle;
        self.waste += o.waste;
        self.split_input_cost += o.split_input_cost;
        self.split_output_cost += o.split_output_cost;
        self.split_input_tokens += o.split_input_tokens;
        self.split_output_tokens += o.split_output_tokens;
        self.capacity_cost += o.capacity_cost;
        self.busy_cost += o.busy_cost;
        self.saved.merge(&o.saved);
        self.verified_hits += o.verified_hits;
        self.expected_wrong += o.expected_wrong;
        self.wrong_variance += o.wrong_variance;
    }

    pub(super) fn line(&self, workload: Option<String>, model: Option<String>) -> InferenceLine {
        let unsplit_tokens = (self.input_tokens + self.output_tokens)
            .saturating_sub(self.split_input_tokens + self.split_output_tokens);
        let unsplit_cost = self.cost - self.split_input_cost - self.split_output_cost + self.idle;
        InferenceLine {
            workload,
            model,
            requests: self.requests,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cost: self.cost,
            idle_cost: self.idle,
            waste: self.waste,
            per_1k: per(self.cost + self.idle, self.requests, 1000),
            per_m_input: per(self.split_input_cost, self.split_input_tokens, 1_000_000),
            per_m_output: per(self.split_output_cost, self.split_output_tokens, 1_000_000),
            per_m_tokens: per(unsplit_cost, unsplit_tokens, 1_000_000),
            utilization: ratio(self.busy_cost, self.capacity_cost),
            saved: self.saved,
            semantic: WrongHits::of(self.verified_hits, self.expected_wrong, self.wrong_variance),
        }
    }
}

/// `cost` per `unit` of `n` things (1,000 requests, a million tokens); `None` for none.
pub(super) fn per(cost: Money, n: u64, unit: i128) -> Option<Money> {
    (n > 0).then(|| cost.mul_div(unit, i128::from(n))).flatten()
}

pub(super) fn ratio(part: Money, whole: Money) -> Option<f64> {
    (whole.nanos() > 0).then(|| part.as_f64() / whole.as_f64())
}
