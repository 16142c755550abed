//! Batch jobs beside interactive traffic: each job's cost per 1,000 lines and per million
//! tokens, what it would have cost on demand when it ran on spot, and the same model's
//! interactive cost per unit (idle capacity included) to compare with.

use std::collections::HashMap;

use serde::Serialize;

use super::unit::{UnitAcc, ratio};
use crate::event::Capacity;
use crate::ledger::Names;
use crate::money::Money;
use crate::rollup::Sums;

/// One batch job's lines on one model.
#[derive(Debug, Clone, Serialize)]
pub struct BatchJobLine {
    pub job: String,
    pub workload: String,
    pub model: Option<String>,
    /// Lines answered (failed ones are billed but not counted).
    pub lines: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The lines' cost, without the machine's idle time.
    pub cost: Money,
    /// Share of the cost paid at spot prices.
    pub spot_share: f64,
    /// What the same machine time costs on demand, where every line knows it.
    pub on_demand_cost: Option<Money>,
    pub saving: Option<Money>,
    pub per_1k: Option<Money>,
    pub per_m_tokens: Option<Money>,
    /// The same model's other workloads, idle time included: what interactive traffic
    /// paid per 1,000 requests and per million tokens.
    pub interactive_per_1k: Option<Money>,
    pub interactive_per_m_tokens: Option<Money>,
}

/// A job's sums, by (job, model).
#[derive(Default)]
pub(super) struct JobAcc {
    workload: u32,
    sums: Sums,
    spot_cost: Money,
}

impl JobAcc {
    pub(super) fn add(&mut self, workload: u32, capacity: Option<Capacity>, s: &Sums) {
        self.workload = workload;
        self.sums.merge(s);
        if capacity == Some(Capacity::Spot) {
            self.spot_cost += s.cost;
        }
    }
}

/// The jobs, dearest first, each beside its model's interactive unit costs.
pub(super) fn lines(
    jobs: &HashMap<(u32, u32), JobAcc>,
    units: &HashMap<(u32, u32), UnitAcc>,
    names: &Names,
) -> Vec<BatchJobLine> {
    let per = |cost: Money, n: u64, unit: i128| {
        (n > 0).then(|| cost.mul_div(unit, i128::from(n))).flatten()
    };
    let batch_workloads: Vec<u32> = jobs.values().map(|j| j.workload).collect();
    let mut out: Vec<BatchJobLine> = jobs
        .iter()
        .map(|((job, model), acc)| {
            let s = &acc.sums;
            let mut interactive = UnitAcc::default();
            for ((w, m), u) in units {
                if m == model && !batch_workloads.contains(w) {
                    interactive.merge(u);
                }
            }
            let interactive = interactive.line(None, None);
            let tokens = (s.input_tokens + s.output_tokens) as u64;
            let on_demand = (s.unlisted == 0 && s.list_cost > Money::ZERO).then_some(s.list_cost);
            BatchJobLine {
                job: names.get(*job).to_owned(),
                workload: names.get(acc.workload).to_owned(),
                model: (*model != 0).then(|| names.get(*model).to_owned()),
                lines: s.requests as u64,
                input_tokens: s.input_tokens as u64,
                output_tokens: s.output_tokens as u64,
                cost: s.cost,
                spot_share: ratio(acc.spot_cost, s.cost).unwrap_or(0.0),
                on_demand_cost: on_demand,
                saving: on_demand.map(|od| od - s.cost),
                per_1k: per(s.cost, s.requests as u64, 1000),
                per_m_tokens: per(s.cost, tokens, 1_000_000),
                interactive_per_1k: interactive.per_1k,
                interactive_per_m_tokens: interactive
                    .per_m_tokens
                    .filter(|_| interactive.requests > 0),
            }
        })
        .collect();
    out.sort_by(|a, b| b.cost.cmp(&a.cost).then_with(|| a.job.cmp(&b.job)));
    out
}
