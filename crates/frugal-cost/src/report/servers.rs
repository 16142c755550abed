//! Servers `frugal watch` measured: per server, what its hours cost, how busy it was, its
//! unit costs and idle dollars; and the levers with the dollars at stake: consolidate
//! servers of one model whose load fits on fewer, scale to zero the long stretches with no
//! request, and a cheaper instance where the GPUs held a fraction of their memory.
//!
//! Spans carry each scrape interval's shape (busy time, requests, tokens, GPU memory); the
//! interval's money is in its events too, so none of this is added to the report's totals.

use std::collections::HashMap;

use serde::Serialize;

use super::lever::Lever;
use super::pools::{Acc, GIB, HOUR_MS, RightSizing, Sizing, oversized};
use super::unit::per;
use crate::catalog::Catalog;
use crate::event::ReplicaSpan;
use crate::money::{Millis, Money};
use crate::present::pct;

/// The busy share a server may reach after taking a consolidated server's load: headroom
/// for bursts, as an autoscaler's target utilization leaves.
pub const CONSOLIDATE_TO: f64 = 0.7;
/// A stretch with no request shorter than this is not worth a cold start.
const QUIET_MIN_MS: Millis = 15 * 60_000;
/// Of a quiet stretch, what a pool waits before it scales to zero (`scale_to_zero_after`).
const ZERO_AFTER_MS: Millis = 5 * 60_000;
/// Spans further apart than this are not one stretch (a scrape gap lies between).
const ADJACENT_MS: Millis = 1_000;

/// One watched server over the report's window.
#[derive(Debug, Clone, Serialize)]
pub struct ServerLine {
    /// The `[[watch.target]]` name.
    pub server: String,
    pub workload: String,
    pub model: String,
    pub instance_type: Option<String>,
    /// Time measured (scrape gaps are not).
    pub hours: f64,
    pub cost: Money,
    pub busy_share: Option<f64>,
    /// The part of `cost` no work used.
    pub idle_cost: Money,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// `cost` per 1,000 requests, idle time included.
    pub per_1k: Option<Money>,
    /// `cost` per million tokens, in and out together.
    pub per_m_tokens: Option<Money>,
    /// Per 1,000 requests had the server been busy throughout: the busy part's cost.
    pub busy_per_1k: Option<Money>,
    /// The most GPU memory its GPUs held, where DCGM said.
    pub gpu_memory_gib: Option<f64>,
    pub right_sizing: Vec<RightSizing>,
}

#[derive(Default)]
struct ServerAcc {
    spans: Acc,
    workload: String,
    model: String,
    requests: u64,
    input_tokens: u64,
    output_tokens: u64,
    /// The quiet stretch going on: its start, end and cost.
    quiet: Option<(Millis, Millis, Money)>,
    /// What the quiet stretches long enough to scale to zero cost after a pool's wait.
    zero_cost: Money,
    zero_ms: Millis,
}

impl ServerAcc {
    fn add(&mut self, s: &ReplicaSpan) {
        self.spans.add(s);
        self.workload.clone_from(&s.workload);
        self.model.clone_from(&s.pool);
        self.requests += s.requests;
        self.input_tokens += s.input_tokens;
        self.output_tokens += s.output_tokens;
        let end = s.ts_ms + s.duration_ms.max(0);
        let quiet = s.requests == 0 && s.busy_ms <= 0;
        match (&mut self.quiet, quiet) {
            (Some((_, last, cost)), true) if s.ts_ms - *last <= ADJACENT_MS => {
                *last = end;
                *cost += s.cost;
            }
            (_, true) => {
                self.close_quiet();
                self.quiet = Some((s.ts_ms, end, s.cost));
            }
            (_, false) => self.close_quiet(),
        }
    }

    /// Ends the quiet stretch: what a pool would not have paid of it, past its wait.
    fn close_quiet(&mut self) {
        let Some((start, end, cost)) = self.quiet.take() else {
            return;
        };
        let length = end - start;
        if length >= QUIET_MIN_MS {
            let saved = cost.mul_div(i128::from(length - ZERO_AFTER_MS), i128::from(length));
            self.zero_cost += saved.unwrap_or(Money::ZERO);
            self.zero_ms += length - ZERO_AFTER_MS;
        }
    }
}

/// Watched servers' spans, by server name.
#[derive(Default)]
pub(super) struct ServerSpans(HashMap<String, ServerAcc>);

impl ServerSpans {
    /// Adds a span of a watched server (spans come in time order).
    pub(super) fn add(&mut self, server: &str, s: &ReplicaSpan) {
        self.0.entry(server.to_owned()).or_default().add(s)
    }
}

/// The servers of `spans`, dearest first, with their right-sizing flags.
pub(super) fn build(spans: ServerSpans, catalog: &Catalog) -> Vec<ServerLine> {
    let mut lines: Vec<ServerLine> = spans
        .0
        .into_iter()
        .map(|(server, mut acc)| {
            acc.close_quiet();
            line(server, &acc, catalog)
        })
        .collect();
    consolidate(&mut lines);
    lines.sort_by(|a, b| b.cost.cmp(&a.cost).then_with(|| a.server.cmp(&b.server)));
    lines
}

fn line(server: String, acc: &ServerAcc, catalog: &Catalog) -> ServerLine {
    let a = &acc.spans;
    let busy_cost = a.busy_cost().unwrap_or(a.cost);
    let tokens = acc.input_tokens + acc.output_tokens;
    let hours = a.duration_ms as f64 / HOUR_MS;
    let mut right_sizing = Vec::new();
    if acc.zero_cost > Money::ZERO {
        right_sizing.push(RightSizing {
            flag: Sizing::ScaleToZero,
            dollars: acc.zero_cost,
            basis: format!(
                "{:.1} of its {hours:.1} hours were stretches of {} min or more without a request; a pool that scales to zero after {} min pays none of the rest",
                acc.zero_ms as f64 / HOUR_MS,
                QUIET_MIN_MS / 60_000,
                ZERO_AFTER_MS / 60_000,
            ),
            action: "serve its model from a frugal pool with min_replicas = 0 (docs/pools.md)"
                .to_owned(),
            instead: None,
        });
    }
    let instance = a.latest.as_ref().and_then(|s| s.instance_type.clone());
    right_sizing.extend(oversized(
        instance.as_deref(),
        a,
        catalog,
        ("its GPUs held {} at most", "it"),
    ));
    ServerLine {
        server,
        workload: acc.workload.clone(),
        model: acc.model.clone(),
        instance_type: instance,
        hours,
        cost: a.cost,
        busy_share: (a.duration_ms > 0).then(|| a.busy_ms as f64 / a.duration_ms as f64),
        idle_cost: a.cost - busy_cost,
        requests: acc.requests,
        input_tokens: acc.input_tokens,
        output_tokens: acc.output_tokens,
        per_1k: per(a.cost, acc.requests, 1000),
        per_m_tokens: per(a.cost, tokens, 1_000_000),
        busy_per_1k: per(busy_cost, acc.requests, 1000),
        gpu_memory_gib: a.need_bytes.map(|b| b as f64 / GIB),
        right_sizing,
    }
}

/// Servers of one workload and model whose summed busy share fits on fewer of them at
/// [`CONSOLIDATE_TO`]: the least busy are flagged, each at its own cost, and keep no other
/// flag (their hours go away whole).
fn consolidate(lines: &mut [ServerLine]) {
    let mut groups: HashMap<(String, String), Vec<usize>> = HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        if l.busy_share.is_some() {
            groups
                .entry((l.workload.clone(), l.model.clone()))
                .or_default()
                .push(i);
        }
    }
    for members in groups.into_values().filter(|m| m.len() > 1) {
        let busy = |i: usize| lines[i].busy_share.unwrap_or(1.0);
        // Busy time in server-hours, spread over servers at the target share.
        let load: f64 = members.iter().map(|&i| busy(i) * lines[i].hours).sum();
        let mean_hours =
            members.iter().map(|&i| lines[i].hours).sum::<f64>() / members.len() as f64;
        let needed = ((load / (mean_hours * CONSOLIDATE_TO)).ceil() as usize).max(1);
        let mut by_busy = members.clone();
        by_busy.sort_by(|&a, &b| busy(a).total_cmp(&busy(b)));
        let keep: Vec<String> = by_busy[members.len().saturating_sub(needed)..]
            .iter()
            .map(|&i| lines[i].server.clone())
            .collect();
        for &i in by_busy.iter().take(members.len().saturating_sub(needed)) {
            let l = &mut lines[i];
            l.right_sizing = vec![RightSizing {
                flag: Sizing::Consolidate,
                dollars: l.cost,
                basis: format!(
                    "{} servers of `{}` were busy {:.1} server-hours in all: {needed} carry it at {}; this one was busy {}",
                    members.len(),
                    l.model,
                    load,
                    pct(CONSOLIDATE_TO),
                    pct(l.busy_share.unwrap_or(0.0)),
                ),
                action: format!("send its traffic to {} and stop it", keep.join(", ")),
                instead: None,
            }];
        }
    }
}

/// The watched servers' flags as levers, by dollars at stake.
pub(super) fn levers(servers: &[ServerLine]) -> Vec<Lever> {
    let kinds = [
        (
            Sizing::Consolidate,
            "consolidate watched servers",
            "move the traffic of the least busy servers of a model onto the others, and stop them",
        ),
        (
            Sizing::ScaleToZero,
            "scale watched servers to zero",
            "serve models with long quiet stretches from a frugal pool that scales to zero",
        ),
        (
            Sizing::OversizedInstance,
            "right-size watched servers",
            "run each server on the cheapest instance whose accelerator memory holds what its GPUs held",
        ),
    ];
    super::pools::flag_levers(
        &kinds,
        servers.iter().flat_map(|s| {
            s.right_sizing.iter().map(move |r| {
                let what = match &r.instead {
                    Some(to) => format!("`{}` fits {to}", s.server),
                    None => format!(
                        "`{}` busy {}",
                        s.server,
                        s.busy_share.map_or("?".to_owned(), pct)
                    ),
                };
                (r, what)
            })
        }),
    )
}
