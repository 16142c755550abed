//! Pools of replicas: what a pool's replica-hours bought, what scaling to demand saved
//! against a fixed pool of its largest size, and which pools to right-size.
//!
//! Spans are read raw (a replica writes a few an hour); requests come from the rollups the
//! rest of the report reads, and waits from the ledger's index of requests that waited.
//! None of this money is added to the report's totals: the pool's request and idle events
//! already hold it.

use std::collections::HashMap;

use serde::Serialize;

use super::lever::Lever;
use super::unit::per;
use crate::catalog::Catalog;
use crate::event::{ReplicaSpan, ReplicaState};
use crate::ledger::{Ledger, LedgerError, Window};
use crate::money::{HourlyRate, Millis, Money};
use crate::present::pct;

/// Room left above a replica's memory need on the instance suggested instead: KV cache
/// grows with traffic, and allocators fragment.
const HEADROOM: f64 = 1.2;
pub(super) const GIB: f64 = (1u64 << 30) as f64;
pub(super) const HOUR_MS: f64 = 3_600_000.0;

/// One pool over the report's window.
#[derive(Debug, Clone, Serialize)]
pub struct PoolLine {
    pub workload: String,
    pub pool: String,
    /// The latest span's instance type and bounds.
    pub instance_type: Option<String>,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Replica time in every state, starting and draining included.
    pub replica_hours: f64,
    /// What the replicas cost: the pool's requests and its idle time together.
    pub cost: Money,
    /// The share of replica time billed to requests.
    pub busy_share: Option<f64>,
    /// The pool's requests, failed ones left out.
    pub requests: u64,
    /// `cost` per 1,000 requests: what a thousand cost with the idle time they kept.
    pub per_1k: Option<Money>,
    pub cold_starts: u32,
    pub failed_starts: u32,
    /// How long a successful cold start took.
    pub cold_start_p50_s: Option<f64>,
    pub cold_start_p99_s: Option<f64>,
    /// How long requests waited for a replica (cold starts, every replica busy).
    pub wait_p50_ms: Option<Millis>,
    pub wait_p99_ms: Option<Millis>,
    /// `max_replicas` replicas from the first span's start to the last one's end, at the
    /// replicas' average hourly rate.
    pub fixed_cost: Option<Money>,
    pub saving_vs_fixed: Option<Money>,
    pub right_sizing: Vec<RightSizing>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sizing {
    /// Replicas mostly idle: the pool holds more than its traffic needs.
    LowBusyShare,
    /// A cheaper instance holds the model and its KV cache.
    OversizedInstance,
    /// A watched server whose load the other servers of its model can carry.
    Consolidate,
    /// A watched server with long stretches without a request.
    ScaleToZero,
}

/// A pool to right-size, with the dollars at stake over the window.
#[derive(Debug, Clone, Serialize)]
pub struct RightSizing {
    pub flag: Sizing,
    pub dollars: Money,
    pub basis: String,
    pub action: String,
    /// The instance to move to (oversized instances only).
    pub instead: Option<String>,
}

/// Sums of one pool's (or watched server's) spans.
#[derive(Default)]
pub(super) struct Acc {
    pub(super) duration_ms: Millis,
    pub(super) busy_ms: Millis,
    pub(super) cost: Money,
    /// From the first span's start to the last one's end.
    first_ms: Option<Millis>,
    end_ms: Millis,
    /// Durations of the starting spans that ended ready.
    starts: Vec<Millis>,
    cold_starts: u32,
    failed_starts: u32,
    pub(super) latest: Option<ReplicaSpan>,
    pub(super) need_bytes: Option<u64>,
    /// Replica time per instance type, to price a move off one.
    pub(super) instance_ms: HashMap<String, Millis>,
}

impl Acc {
    /// What the busy part of the time cost, at the spans' average rate.
    pub(super) fn busy_cost(&self) -> Option<Money> {
        self.cost.mul_div(
            i128::from(self.busy_ms),
            i128::from(self.duration_ms.max(1)),
        )
    }

    pub(super) fn add(&mut self, s: &ReplicaSpan) {
        let duration = s.duration_ms.max(0);
        self.duration_ms += duration;
        self.busy_ms += s.busy_ms.clamp(0, duration);
        self.cost += s.cost;
        self.first_ms = Some(self.first_ms.map_or(s.ts_ms, |f| f.min(s.ts_ms)));
        self.end_ms = self.end_ms.max(s.ts_ms + duration);
        if s.state == ReplicaState::Starting {
            self.cold_starts += 1;
            if s.failed {
                self.failed_starts += 1;
            } else {
                self.starts.push(duration);
            }
        }
        self.need_bytes = self.need_bytes.max(s.need_bytes);
        if let Some(instance) = &s.instance_type {
            *self.instance_ms.entry(instance.clone()).or_default() += duration;
        }
        self.latest = Some(s.clone());
    }
}

/// Pools' spans, by (workload, pool).
#[derive(Default)]
pub(super) struct PoolSpans(HashMap<(String, String), Acc>);

impl PoolSpans {
    pub(super) fn add(&mut self, s: &ReplicaSpan) {
        self.0
            .entry((s.workload.clone(), s.pool.clone()))
            .or_default()
            .add(s)
    }
}

/// The pools of `spans` (read over `window`, whole hours as the rollups read it);
/// `requests` is each (workload, pool)'s requests that did not fail.
pub(super) fn build(
    spans: PoolSpans,
    ledger: &Ledger,
    catalog: &Catalog,
    window: Window,
    requests: &HashMap<(&str, &str), u64>,
    busy_below: f64,
) -> Result<Vec<PoolLine>, LedgerError> {
    let pools = spans.0;
    let mut lines = Vec::with_capacity(pools.len());
    for ((workload, pool), mut acc) in pools {
        let waits = ledger.wait_percentiles(window, &workload, &pool, &[50, 99])?;
        let wait = |i: usize| waits.get(i).copied().flatten();
        let requests = requests
            .get(&(workload.as_str(), pool.as_str()))
            .copied()
            .unwrap_or(0);
        acc.starts.sort_unstable();
        let seconds = |p| nearest_rank(&acc.starts, p).map(|ms| ms as f64 / 1000.0);
        let latest = acc.latest.take();
        let max_replicas = latest.as_ref().map_or(0, |s| s.max_replicas);
        let wall_ms = acc.end_ms - acc.first_ms.unwrap_or(acc.end_ms);
        let fixed_cost = (acc.duration_ms > 0)
            .then(|| {
                acc.cost.mul_div(
                    i128::from(max_replicas) * i128::from(wall_ms),
                    i128::from(acc.duration_ms),
                )
            })
            .flatten();
        let mut line = PoolLine {
            workload,
            pool,
            instance_type: latest.as_ref().and_then(|s| s.instance_type.clone()),
            min_replicas: latest.as_ref().map_or(0, |s| s.min_replicas),
            max_replicas,
            replica_hours: acc.duration_ms as f64 / HOUR_MS,
            cost: acc.cost,
            busy_share: (acc.duration_ms > 0).then(|| acc.busy_ms as f64 / acc.duration_ms as f64),
            requests,
            per_1k: per(acc.cost, requests, 1000),
            cold_starts: acc.cold_starts,
            failed_starts: acc.failed_starts,
            cold_start_p50_s: seconds(50),
            cold_start_p99_s: seconds(99),
            wait_p50_ms: wait(0),
            wait_p99_ms: wait(1),
            fixed_cost,
            saving_vs_fixed: fixed_cost.map(|f| f - acc.cost),
            right_sizing: Vec::new(),
        };
        line.right_sizing
            .extend(low_busy_share(&line, &acc, busy_below));
        line.right_sizing.extend(oversized(
            line.instance_type.as_deref(),
            &acc,
            catalog,
            (
                "a replica needs {} (weights and KV cache)",
                "the pool's replicas",
            ),
        ));
        lines.push(line);
    }
    lines.sort_by(|a, b| {
        b.cost
            .cmp(&a.cost)
            .then_with(|| (&a.pool, &a.workload).cmp(&(&b.pool, &b.workload)))
    });
    Ok(lines)
}

/// The nearest-rank percentile of sorted values.
fn nearest_rank(sorted: &[Millis], percent: usize) -> Option<Millis> {
    let rank = (percent.clamp(1, 100) * sorted.len()).div_ceil(100);
    sorted.get(rank.checked_sub(1)?).copied()
}

fn low_busy_share(line: &PoolLine, acc: &Acc, busy_below: f64) -> Option<RightSizing> {
    let busy = line.busy_share.filter(|b| *b < busy_below)?;
    let idle = acc.cost - acc.busy_cost()?;
    if idle <= Money::ZERO {
        return None;
    }
    let min = match line.min_replicas {
        0 => String::new(),
        n => format!("lower min_replicas (now {n}); "),
    };
    Some(RightSizing {
        flag: Sizing::LowBusyShare,
        dollars: idle,
        basis: format!(
            "replicas were busy {} of {:.1} replica-hours (flagged below {}); the idle part cost {idle}",
            pct(busy),
            line.replica_hours,
            pct(busy_below),
        ),
        action: format!(
            "{min}raise target_in_flight so fewer replicas carry the traffic; shorten scale_to_zero_after so an idle pool stops sooner"
        ),
        instead: None,
    })
}

/// A cheaper instance of the same provider whose accelerator memory holds the replica's
/// need with headroom, priced on demand over the replica-hours spent on the current one.
/// `needs` says what the need is, `{}` standing for the GiB; `what`, what moves.
pub(super) fn oversized(
    instance: Option<&str>,
    acc: &Acc,
    catalog: &Catalog,
    (needs, what): (&str, &str),
) -> Option<RightSizing> {
    let instance = instance?;
    let need = acc.need_bytes? as f64 / GIB;
    let current = catalog.instance(instance, None).ok()?;
    let fit = catalog.cheapest_holding(current, need * HEADROOM)?;
    if fit.on_demand >= current.on_demand {
        return None;
    }
    let replica_ms = acc.instance_ms.get(instance).copied().unwrap_or(0);
    let dollars = HourlyRate(current.on_demand.0 - fit.on_demand.0).cost(replica_ms, 1)?;
    let memory = |gib: Option<f64>| gib.map_or("unknown".to_owned(), |g| format!("{g:.0} GiB"));
    Some(RightSizing {
        flag: Sizing::OversizedInstance,
        dollars,
        basis: format!(
            "{} and {instance} has {} of accelerator memory; {} ({}) holds it with {} headroom at {}/h against {}/h, over {:.1} replica-hours",
            needs.replace("{}", &format!("{need:.1} GiB")),
            memory(current.accelerator_memory_gib),
            fit.instance_type,
            memory(fit.accelerator_memory_gib),
            pct(HEADROOM - 1.0),
            fit.on_demand.0,
            current.on_demand.0,
            replica_ms as f64 / HOUR_MS,
        ),
        action: format!("run {what} on {}", fit.instance_type),
        instead: Some(fit.instance_type.clone()),
    })
}

/// The right-sizing flags of every pool as two levers, by dollars at stake.
pub(super) fn levers(pools: &[PoolLine]) -> Vec<Lever> {
    let kinds = [
        (
            Sizing::LowBusyShare,
            "scale idle pools in",
            "lower min_replicas, raise target_in_flight and shorten scale_to_zero_after, so replicas stop when traffic does",
        ),
        (
            Sizing::OversizedInstance,
            "right-size pool instances",
            "run each pool on the cheapest instance whose accelerator memory holds its model and KV cache",
        ),
    ];
    flag_levers(
        &kinds,
        pools.iter().flat_map(|p| {
            p.right_sizing.iter().map(move |r| {
                let what = match &r.instead {
                    Some(to) => format!(
                        "pool `{}` on {} fits {to}",
                        p.pool,
                        p.instance_type.as_deref().unwrap_or("?")
                    ),
                    None => format!(
                        "pool `{}` busy {}",
                        p.pool,
                        p.busy_share.map_or("?".to_owned(), pct)
                    ),
                };
                (r, what)
            })
        }),
    )
}

/// One lever per kind of flag (`(flag, lever, action)`) that puts dollars at stake: the
/// flags' dollars summed, their subjects (what each flag is about) as its basis.
pub(super) fn flag_levers<'a>(
    kinds: &[(Sizing, &'static str, &'static str)],
    flags: impl Iterator<Item = (&'a RightSizing, String)>,
) -> Vec<Lever> {
    let flags: Vec<(&RightSizing, String)> = flags.collect();
    kinds
        .iter()
        .filter_map(|&(flag, lever, action)| {
            let of_kind = || flags.iter().filter(|(r, _)| r.flag == flag);
            let dollars: Money = of_kind().map(|(r, _)| r.dollars).sum();
            let basis: Vec<&str> = of_kind().map(|(_, what)| what.as_str()).collect();
            (dollars > Money::ZERO).then(|| Lever {
                lever,
                dollars,
                basis: basis.join("; "),
                action: action.into(),
            })
        })
        .collect()
}
