//! Hourly rollups: the sums a report needs, kept beside the raw events.
//!
//! Every write folds its events into one row per (hour, kind, workload, model, run,
//! instance, region, capacity, outcome) in the same transaction, so a report reads a few
//! thousand rollup rows instead of millions of events: reading every column of ten million
//! events through SQLite takes longer than the whole report may. An event that spans hours
//! has its money and time spread over them by overlap (remainders to the last hour, so the
//! parts add up to the event exactly); counts (events, requests, tokens, a semantic hit's
//! chance of being wrong) stay in the hour it started.

use std::collections::HashMap;

use crate::event::{Capacity, Event, Kind, Lever, Outcome};
use crate::money::{Millis, Money};
use crate::wrong::{self, Chances};

pub const HOUR_MS: Millis = 3_600_000;

/// A rollup row's key. Names are dims ids; `0` means none (ids start at 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub hour_ms: Millis,
    pub kind: Kind,
    pub workload: u32,
    pub model: u32,
    pub run: u32,
    pub instance: u32,
    pub region: u32,
    pub capacity: Option<Capacity>,
    pub outcome: Option<Outcome>,
}

/// Sums over the events of one key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sums {
    pub events: i64,
    pub requests: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cached_tokens: i64,
    pub cost: Money,
    /// Cost that bought nothing: idle, or the unused share under a utilization.
    pub waste: Money,
    /// Cost paid by the hour (an instance, a utilization, or idle), not per token.
    pub capacity_cost: Money,
    /// Cost of events that report a utilization.
    pub util_cost: Money,
    /// Cost, input part and tokens of events whose price splits input from output.
    pub split_cost: Money,
    pub split_input_cost: Money,
    pub split_input_tokens: i64,
    pub split_output_tokens: i64,
    pub list_cost: Money,
    /// Events without a list (on-demand) cost.
    pub unlisted: i64,
    pub duration_ms: Millis,
    /// Duration times instances: capacity held.
    pub instance_ms: Millis,
    pub lost_ms: Millis,
    /// Cost of the work lost (the lost share of the event's cost).
    pub lost_cost: Money,
    /// What each lever saved: the calls the caches and routing replaced.
    pub saved_cache: Money,
    pub saved_semantic: Money,
    pub saved_routing: Money,
    pub saved_batching: Money,
    pub saved_prefix: Money,
    /// Semantic hits a verifier judged (events with a `wrong_chance`), the sum of their
    /// chances of being wrong, and the variance of their number wrong (Σ p(1 - p)).
    pub verified_hits: i64,
    pub expected_wrong: Chances,
    pub wrong_variance: Chances,
    pub first_ms: Millis,
    pub last_ms: Millis,
}

impl Default for Sums {
    /// Nothing yet: zero sums, and a time span that any merge replaces.
    fn default() -> Sums {
        Sums {
            events: 0,
            requests: 0,
            input_tokens: 0,
            output_tokens: 0,
            cached_tokens: 0,
            cost: Money::ZERO,
            waste: Money::ZERO,
            capacity_cost: Money::ZERO,
            util_cost: Money::ZERO,
            split_cost: Money::ZERO,
            split_input_cost: Money::ZERO,
            split_input_tokens: 0,
            split_output_tokens: 0,
            list_cost: Money::ZERO,
            unlisted: 0,
            duration_ms: 0,
            instance_ms: 0,
            lost_ms: 0,
            lost_cost: Money::ZERO,
            saved_cache: Money::ZERO,
            saved_semantic: Money::ZERO,
            saved_routing: Money::ZERO,
            saved_batching: Money::ZERO,
            saved_prefix: Money::ZERO,
            verified_hits: 0,
            expected_wrong: Chances::ZERO,
            wrong_variance: Chances::ZERO,
            first_ms: Millis::MAX,
            last_ms: Millis::MIN,
        }
    }
}

impl Sums {
    pub fn merge(&mut self, o: &Sums) {
        self.first_ms = self.first_ms.min(o.first_ms);
        self.last_ms = self.last_ms.max(o.last_ms);
        self.events += o.events;
        self.requests += o.requests;
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.cached_tokens += o.cached_tokens;
        self.cost += o.cost;
        self.waste += o.waste;
        self.capacity_cost += o.capacity_cost;
        self.util_cost += o.util_cost;
        self.split_cost += o.split_cost;
        self.split_input_cost += o.split_input_cost;
        self.split_input_tokens += o.split_input_tokens;
        self.split_output_tokens += o.split_output_tokens;
        self.list_cost += o.list_cost;
        self.unlisted += o.unlisted;
        self.duration_ms += o.duration_ms;
        self.instance_ms += o.instance_ms;
        self.lost_ms += o.lost_ms;
        self.lost_cost += o.lost_cost;
        self.saved_cache += o.saved_cache;
        self.saved_semantic += o.saved_semantic;
        self.saved_routing += o.saved_routing;
        self.saved_batching += o.saved_batching;
        self.saved_prefix += o.saved_prefix;
        self.verified_hits += o.verified_hits;
        self.expected_wrong += o.expected_wrong;
        self.wrong_variance += o.wrong_variance;
    }

    /// All the levers saved.
    pub fn saved(&self) -> Money {
        self.saved_cache
            + self.saved_semantic
            + self.saved_routing
            + self.saved_batching
            + self.saved_prefix
    }
}

/// Ids of an event's names, as the ledger stored them.
#[derive(Debug, Clone, Copy)]
pub struct Ids {
    pub workload: u32,
    pub model: u32,
    pub run: u32,
    pub instance: u32,
    pub region: u32,
}

/// The rollup rows of one write, folded in memory until its transaction commits.
#[derive(Default)]
pub struct Pending(HashMap<Key, Sums>);

impl Pending {
    pub fn add(&mut self, e: &Event, ids: Ids) {
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let is_capacity =
            e.instance_type.is_some() || e.utilization.is_some() || e.kind == Kind::Idle;
        let duration = e.duration_ms.max(0);
        let saved = |lever| {
            if e.lever == Some(lever) {
                e.saved
            } else {
                Money::ZERO
            }
        };
        let wrong = wrong::chance(e.wrong_chance);
        let whole = Sums {
            events: 1,
            requests: clamp(e.requests),
            input_tokens: clamp(e.input_tokens),
            output_tokens: clamp(e.output_tokens),
            cached_tokens: clamp(e.cached_input_tokens),
            cost: e.cost,
            waste: e.waste(),
            capacity_cost: if is_capacity { e.cost } else { Money::ZERO },
            util_cost: if e.utilization.is_some() {
                e.cost
            } else {
                Money::ZERO
            },
            split_cost: if e.input_cost.is_some() {
                e.cost
            } else {
                Money::ZERO
            },
            split_input_cost: e.input_cost.unwrap_or(Money::ZERO),
            split_input_tokens: if e.input_cost.is_some() {
                clamp(e.input_tokens)
            } else {
                0
            },
            split_output_tokens: if e.input_cost.is_some() {
                clamp(e.output_tokens)
            } else {
                0
            },
            list_cost: e.list_cost.unwrap_or(Money::ZERO),
            unlisted: i64::from(e.list_cost.is_none()),
            duration_ms: duration,
            instance_ms: duration.saturating_mul(i64::from(e.instances)),
            lost_ms: e.lost_ms,
            lost_cost: if duration > 0 && e.lost_ms > 0 {
                e.cost
                    .mul_div(i128::from(e.lost_ms.min(duration)), i128::from(duration))
                    .unwrap_or(Money::ZERO)
            } else {
                Money::ZERO
            },
            saved_cache: saved(Lever::Cache),
            saved_semantic: saved(Lever::SemanticCache),
            saved_routing: saved(Lever::Routing),
            saved_batching: saved(Lever::Batching),
            saved_prefix: saved(Lever::PrefixCache),
            verified_hits: i64::from(wrong.is_some()),
            expected_wrong: wrong.map_or(Chances::ZERO, Chances::from_f64),
            wrong_variance: wrong.map_or(Chances::ZERO, |q| Chances::from_f64(q * (1.0 - q))),
            first_ms: e.ts_ms,
            last_ms: e.ts_ms + duration,
        };
        let key = |hour_ms| Key {
            hour_ms,
            kind: e.kind,
            workload: ids.workload,
            model: ids.model,
            run: ids.run,
            instance: ids.instance,
            region: ids.region,
            capacity: e.capacity,
            outcome: e.outcome,
        };
        for (hour, part) in spread(e.ts_ms, duration, &whole) {
            self.0.entry(key(hour)).or_default().merge(&part);
        }
    }

    /// The folded rows, each as the rollup table's columns in order (see `decode`).
    pub fn into_values(self) -> Vec<[i64; COLUMNS]> {
        self.0
            .into_iter()
            .map(|(k, s)| {
                [
                    k.hour_ms,
                    k.kind.code(),
                    i64::from(k.workload),
                    i64::from(k.model),
                    i64::from(k.run),
                    i64::from(k.instance),
                    i64::from(k.region),
                    k.capacity.map_or(0, |c| c.code() + 1),
                    k.outcome.map_or(0, |o| o.code() + 1),
                    s.events,
                    s.requests,
                    s.input_tokens,
                    s.output_tokens,
                    s.cached_tokens,
                    s.cost.nanos(),
                    s.waste.nanos(),
                    s.capacity_cost.nanos(),
                    s.util_cost.nanos(),
                    s.split_cost.nanos(),
                    s.split_input_cost.nanos(),
                    s.split_input_tokens,
                    s.split_output_tokens,
                    s.list_cost.nanos(),
                    s.unlisted,
                    s.duration_ms,
                    s.instance_ms,
                    s.lost_ms,
                    s.lost_cost.nanos(),
                    s.first_ms,
                    s.last_ms,
                    s.saved_cache.nanos(),
                    s.saved_semantic.nanos(),
                    s.saved_routing.nanos(),
                    s.saved_batching.nanos(),
                    s.saved_prefix.nanos(),
                    s.verified_hits,
                    s.expected_wrong.billionths(),
                    s.wrong_variance.billionths(),
                ]
            })
            .collect()
    }
}

/// Splits `whole` over the hours `[ts, ts + duration)` touches. Money and time go by overlap,
/// the last hour taking what rounding left; counts go to the first hour.
fn spread(ts: Millis, duration: Millis, whole: &Sums) -> Vec<(Millis, Sums)> {
    let first_hour = ts - ts.rem_euclid(HOUR_MS);
    if duration <= 0 || ts + duration <= first_hour + HOUR_MS {
        return vec![(first_hour, *whole)];
    }
    let mut parts = Vec::new();
    let mut given = Sums::default();
    let end = ts + duration;
    let mut hour = first_hour;
    while hour < end {
        let (from, to) = (ts.max(hour), end.min(hour + HOUR_MS));
        let last = to == end;
        let share = |total: Money, given: Money| {
            if last {
                total - given
            } else {
                total
                    .mul_div(i128::from(to - from), i128::from(duration))
                    .unwrap_or(Money::ZERO)
            }
        };
        let time = |total: Millis, given: Millis| {
            if last {
                total - given
            } else {
                (i128::from(total) * i128::from(to - from) / i128::from(duration)) as Millis
            }
        };
        let mut part = Sums {
            cost: share(whole.cost, given.cost),
            waste: share(whole.waste, given.waste),
            capacity_cost: share(whole.capacity_cost, given.capacity_cost),
            util_cost: share(whole.util_cost, given.util_cost),
            split_cost: share(whole.split_cost, given.split_cost),
            split_input_cost: share(whole.split_input_cost, given.split_input_cost),
            list_cost: share(whole.list_cost, given.list_cost),
            lost_cost: share(whole.lost_cost, given.lost_cost),
            saved_cache: share(whole.saved_cache, given.saved_cache),
            saved_semantic: share(whole.saved_semantic, given.saved_semantic),
            saved_routing: share(whole.saved_routing, given.saved_routing),
            saved_batching: share(whole.saved_batching, given.saved_batching),
            saved_prefix: share(whole.saved_prefix, given.saved_prefix),
            duration_ms: time(whole.duration_ms, given.duration_ms),
            instance_ms: time(whole.instance_ms, given.instance_ms),
            first_ms: from,
            last_ms: to,
            ..Sums::default()
        };
        if hour == first_hour {
            part.events = whole.events;
            part.requests = whole.requests;
            part.input_tokens = whole.input_tokens;
            part.output_tokens = whole.output_tokens;
            part.cached_tokens = whole.cached_tokens;
            part.split_input_tokens = whole.split_input_tokens;
            part.split_output_tokens = whole.split_output_tokens;
            part.unlisted = whole.unlisted;
            part.lost_ms = whole.lost_ms;
            part.verified_hits = whole.verified_hits;
            part.expected_wrong = whole.expected_wrong;
            part.wrong_variance = whole.wrong_variance;
        }
        given.merge(&part);
        parts.push((hour, part));
        hour += HOUR_MS;
    }
    parts
}

pub const SCHEMA: &str = r#"
CREATE TABLE rollup (
    hour_ms             INTEGER NOT NULL,
    kind                INTEGER NOT NULL,
    workload            INTEGER NOT NULL,
    model               INTEGER NOT NULL,
    run                 INTEGER NOT NULL,
    instance            INTEGER NOT NULL,
    region              INTEGER NOT NULL,
    capacity            INTEGER NOT NULL,
    outcome             INTEGER NOT NULL,
    events              INTEGER NOT NULL,
    requests            INTEGER NOT NULL,
    input_tokens        INTEGER NOT NULL,
    output_tokens       INTEGER NOT NULL,
    cached_tokens       INTEGER NOT NULL,
    cost                INTEGER NOT NULL,
    waste               INTEGER NOT NULL,
    capacity_cost       INTEGER NOT NULL,
    util_cost           INTEGER NOT NULL,
    split_cost          INTEGER NOT NULL,
    split_input_cost    INTEGER NOT NULL,
    split_input_tokens  INTEGER NOT NULL,
    split_output_tokens INTEGER NOT NULL,
    list_cost           INTEGER NOT NULL,
    unlisted            INTEGER NOT NULL,
    duration_ms         INTEGER NOT NULL,
    instance_ms         INTEGER NOT NULL,
    lost_ms             INTEGER NOT NULL,
    lost_cost           INTEGER NOT NULL,
    first_ms            INTEGER NOT NULL,
    last_ms             INTEGER NOT NULL,
    PRIMARY KEY (hour_ms, kind, workload, model, run, instance, region, capacity, outcome)
) WITHOUT ROWID;
"#;

/// Columns of the rollup table, at the current schema.
pub const COLUMNS: usize = 38;

/// Adds one folded row to SQLite's rollup table.
pub const SQLITE_UPSERT: &str = "
INSERT INTO rollup VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15,
    ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33, ?34, ?35,
    ?36, ?37, ?38)
ON CONFLICT DO UPDATE SET
    events = events + excluded.events,
    requests = requests + excluded.requests,
    input_tokens = input_tokens + excluded.input_tokens,
    output_tokens = output_tokens + excluded.output_tokens,
    cached_tokens = cached_tokens + excluded.cached_tokens,
    cost = cost + excluded.cost,
    waste = waste + excluded.waste,
    capacity_cost = capacity_cost + excluded.capacity_cost,
    util_cost = util_cost + excluded.util_cost,
    split_cost = split_cost + excluded.split_cost,
    split_input_cost = split_input_cost + excluded.split_input_cost,
    split_input_tokens = split_input_tokens + excluded.split_input_tokens,
    split_output_tokens = split_output_tokens + excluded.split_output_tokens,
    list_cost = list_cost + excluded.list_cost,
    unlisted = unlisted + excluded.unlisted,
    duration_ms = duration_ms + excluded.duration_ms,
    instance_ms = instance_ms + excluded.instance_ms,
    lost_ms = lost_ms + excluded.lost_ms,
    lost_cost = lost_cost + excluded.lost_cost,
    saved_cache = saved_cache + excluded.saved_cache,
    saved_semantic = saved_semantic + excluded.saved_semantic,
    saved_routing = saved_routing + excluded.saved_routing,
    saved_batching = saved_batching + excluded.saved_batching,
    saved_prefix = saved_prefix + excluded.saved_prefix,
    verified_hits = verified_hits + excluded.verified_hits,
    expected_wrong = expected_wrong + excluded.expected_wrong,
    wrong_variance = wrong_variance + excluded.wrong_variance,
    first_ms = min(first_ms, excluded.first_ms),
    last_ms = max(last_ms, excluded.last_ms)";

fn code<T>(value: i64, what: &str, decode: impl Fn(i64) -> Option<T>) -> Result<Option<T>, String> {
    match value {
        0 => Ok(None),
        v => decode(v - 1)
            .map(Some)
            .ok_or_else(|| format!("{what} {}", v - 1)),
    }
}

/// A rollup row from its columns in table order (`SELECT *`); `Err` names a value this
/// build cannot read.
pub fn decode(v: &[i64; COLUMNS]) -> Result<(Key, Sums), String> {
    let id = |i: usize| u32::try_from(v[i]).map_err(|_| format!("dims id {}", v[i]));
    let money = |i: usize| Money::from_nanos(v[i]);
    let key = Key {
        hour_ms: v[0],
        kind: Kind::from_code(v[1]).ok_or_else(|| format!("kind {}", v[1]))?,
        workload: id(2)?,
        model: id(3)?,
        run: id(4)?,
        instance: id(5)?,
        region: id(6)?,
        capacity: code(v[7], "capacity", Capacity::from_code)?,
        outcome: code(v[8], "outcome", Outcome::from_code)?,
    };
    let sums = Sums {
        events: v[9],
        requests: v[10],
        input_tokens: v[11],
        output_tokens: v[12],
        cached_tokens: v[13],
        cost: money(14),
        waste: money(15),
        capacity_cost: money(16),
        util_cost: money(17),
        split_cost: money(18),
        split_input_cost: money(19),
        split_input_tokens: v[20],
        split_output_tokens: v[21],
        list_cost: money(22),
        unlisted: v[23],
        duration_ms: v[24],
        instance_ms: v[25],
        lost_ms: v[26],
        lost_cost: money(27),
        first_ms: v[28],
        last_ms: v[29],
        // Added by the ledger's schema v2, after the first columns.
        saved_cache: money(30),
        saved_semantic: money(31),
        saved_routing: money(32),
        // Added by v3.
        saved_batching: money(33),
        // Added by v9.
        saved_prefix: money(34),
        // Added by v10, in billionths.
        verified_hits: v[35],
        expected_wrong: Chances::from_billionths(v[36]),
        wrong_variance: Chances::from_billionths(v[37]),
    };
    Ok((key, sums))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreading_keeps_every_nano_dollar_and_millisecond() {
        // $10 over 2.5 hours starting at 00:30: 0.5 h, 1 h, 1 h = $2, $4, $4.
        let mut whole = Sums {
            events: 1,
            requests: 3,
            cost: Money::from_cents(1000),
            waste: Money::from_nanos(1),
            duration_ms: 9_000_000,
            instance_ms: 18_000_000,
            ..Sums::default()
        };
        whole.first_ms = HOUR_MS / 2;
        let parts = spread(HOUR_MS / 2, 9_000_000, &whole);
        let hours: Vec<Millis> = parts.iter().map(|(h, _)| *h).collect();
        assert_eq!(hours, vec![0, HOUR_MS, 2 * HOUR_MS]);
        let costs: Vec<Money> = parts.iter().map(|(_, p)| p.cost).collect();
        assert_eq!(
            costs,
            vec![
                Money::from_cents(200),
                Money::from_cents(400),
                Money::from_cents(400)
            ]
        );
        let waste: Money = parts.iter().map(|(_, p)| p.waste).sum();
        assert_eq!(
            waste,
            Money::from_nanos(1),
            "a nano-dollar is never lost to rounding"
        );
        let ms: Millis = parts.iter().map(|(_, p)| p.instance_ms).sum();
        assert_eq!(ms, 18_000_000);
        assert_eq!(parts[0].1.requests, 3);
        assert_eq!(
            parts[1].1.requests + parts[2].1.requests,
            0,
            "counts stay at the start"
        );
        assert_eq!(
            (parts[2].1.first_ms, parts[2].1.last_ms),
            (2 * HOUR_MS, 3 * HOUR_MS)
        );
    }

    #[test]
    fn savings_are_summed_per_lever() {
        let ids = Ids {
            workload: 1,
            model: 0,
            run: 0,
            instance: 0,
            region: 0,
        };
        let mut pending = Pending::default();
        for (lever, cents) in [
            (Lever::Cache, 2),
            (Lever::Cache, 3),
            (Lever::SemanticCache, 4),
            (Lever::Routing, 5),
        ] {
            let mut e = Event::new(1_000, Kind::Inference, "chat", Money::ZERO);
            e.saved = Money::from_cents(cents);
            e.lever = Some(lever);
            pending.add(&e, ids);
        }
        let sums: Vec<&Sums> = pending.0.values().collect();
        assert_eq!(sums.len(), 1);
        let s = sums[0];
        assert_eq!(
            (s.saved_cache, s.saved_semantic, s.saved_routing),
            (
                Money::from_cents(5),
                Money::from_cents(4),
                Money::from_cents(5)
            )
        );
        assert_eq!(s.saved(), Money::from_cents(14));
        assert_eq!(s.cost, Money::ZERO, "a saving is not a cost");
    }

    #[test]
    fn verified_hits_sum_their_chances_of_being_wrong_in_their_first_hour() {
        let ids = Ids {
            workload: 1,
            model: 2,
            run: 0,
            instance: 0,
            region: 0,
        };
        let mut pending = Pending::default();
        let hit = |ts, wrong| {
            let mut e = Event::new(ts, Kind::Inference, "chat", Money::ZERO);
            e.lever = Some(Lever::SemanticCache);
            e.wrong_chance = wrong;
            e
        };
        for i in 0..100 {
            pending.add(&hit(i, Some(0.02)), ids);
        }
        // A hit no verifier judged, and one whose chance is not a number: not counted.
        pending.add(&hit(100, None), ids);
        pending.add(&hit(101, Some(f64::NAN)), ids);
        // One that spans two hours counts once, in the hour it started.
        let mut long = hit(HOUR_MS - 10, Some(0.5));
        long.duration_ms = 20;
        pending.add(&long, ids);
        let rows = pending.into_values();
        assert_eq!(rows.len(), 2);
        let (first, second): (Vec<_>, Vec<_>) = rows
            .iter()
            .map(|r| decode(r).unwrap())
            .partition(|(k, _)| k.hour_ms == 0);
        let s = &first[0].1;
        assert_eq!(s.events, 103);
        assert_eq!(s.verified_hits, 101);
        // 100 · 0.02 + 0.5; 100 · 0.02 · 0.98 + 0.25.
        assert_eq!(s.expected_wrong, Chances::from_f64(2.5));
        assert_eq!(s.wrong_variance, Chances::from_f64(2.21));
        let later = &second[0].1;
        assert_eq!(
            (later.verified_hits, later.expected_wrong),
            (0, Chances::ZERO)
        );
    }

    #[test]
    fn an_event_inside_one_hour_is_one_part() {
        let whole = Sums {
            cost: Money::from_cents(5),
            ..Sums::default()
        };
        assert_eq!(spread(10, HOUR_MS - 10, &whole).len(), 1);
        assert_eq!(spread(10, 0, &whole)[0].0, 0);
    }
}
