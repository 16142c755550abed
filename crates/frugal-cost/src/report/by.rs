//! Spend by who and what (`frugal report --by`): the window's events grouped by tenant,
//! model, workload or UTC day, each line's money summed exactly so the lines add up to
//! their total. An event counts whole in the group of the day it starts in.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::ledger::{Ledger, LedgerError, Window};
use crate::money::{Millis, Money};
use crate::present::utc;

/// What spend is grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum By {
    /// The API key's tenant that made the request (none without keys).
    Tenant,
    Model,
    Workload,
    /// The UTC day the event starts in.
    Day,
}

impl By {
    /// The word for a group: a table's first heading.
    pub fn noun(self) -> &'static str {
        match self {
            By::Tenant => "tenant",
            By::Model => "model",
            By::Workload => "workload",
            By::Day => "day (UTC)",
        }
    }
}

/// The window's spend grouped one way.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spend {
    pub by: By,
    /// Dearest first; days in order.
    pub lines: Vec<SpendLine>,
    /// The sum of the lines' cost.
    pub total: Money,
}

/// One tenant's, model's, workload's or day's spend.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpendLine {
    /// The tenant, model, workload or day (`2026-12-06`); `None` for events without one
    /// (a request made without a key, an event of no model).
    pub name: Option<String>,
    pub events: u64,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost: Money,
    /// The part of `cost` that bought nothing (idle, or unused capacity).
    pub waste: Money,
    /// Of the total cost, in [0, 1].
    pub share: f64,
}

#[derive(Default)]
struct Acc {
    events: u64,
    requests: u64,
    input_tokens: u64,
    output_tokens: u64,
    cost: Money,
    waste: Money,
}

/// Day keys sort by the day; others by their dims id (replaced by names after the scan).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Group {
    Id(Option<u32>),
    Day(Millis),
}

const DAY_MS: Millis = 86_400_000;

/// The spend of the events that start in `window`, grouped `by`.
pub fn spend(ledger: &Ledger, window: Window, by: By) -> Result<Spend, LedgerError> {
    let mut groups: HashMap<Group, Acc> = HashMap::new();
    ledger.scan(window, |row| {
        let group = match by {
            By::Tenant => Group::Id(row.tenant),
            By::Model => Group::Id(row.model),
            By::Workload => Group::Id(Some(row.workload)),
            By::Day => Group::Day(row.ts_ms.div_euclid(DAY_MS)),
        };
        let acc = groups.entry(group).or_default();
        acc.events += 1;
        acc.requests += row.requests;
        acc.input_tokens += row.input_tokens;
        acc.output_tokens += row.output_tokens;
        acc.cost += row.cost;
        acc.waste += row.waste();
    })?;
    let names = ledger.names()?;
    let total: Money = groups.values().map(|a| a.cost).sum();
    let mut keyed: Vec<(Group, SpendLine)> = groups
        .into_iter()
        .map(|(group, a)| {
            let name = match group {
                Group::Id(id) => id.map(|id| names.get(id).to_owned()),
                Group::Day(day) => Some(utc(day * DAY_MS, "%Y-%m-%d")),
            };
            let share = if total.nanos() > 0 {
                a.cost.as_f64() / total.as_f64()
            } else {
                0.0
            };
            let line = SpendLine {
                name,
                events: a.events,
                requests: a.requests,
                input_tokens: a.input_tokens,
                output_tokens: a.output_tokens,
                cost: a.cost,
                waste: a.waste,
                share,
            };
            (group, line)
        })
        .collect();
    keyed.sort_by(|(ga, a), (gb, b)| match (ga, gb) {
        (Group::Day(x), Group::Day(y)) => x.cmp(y),
        _ => b.cost.cmp(&a.cost).then_with(|| a.name.cmp(&b.name)),
    });
    Ok(Spend {
        by,
        lines: keyed.into_iter().map(|(_, l)| l).collect(),
        total,
    })
}
