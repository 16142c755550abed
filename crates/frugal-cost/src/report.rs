//! The unit-cost report: what a training run, a thousand inferences and a million tokens
//! cost, which cost dominates, how much of it is waste, and the levers to pull first.
//!
//! One pass over the ledger's rows (in time order) feeds every table, so a report over ten
//! million events costs one scan. Money sums are exact; shares, ratios and chart series are
//! floats.

use std::collections::HashMap;

use serde::Serialize;

use crate::catalog::Catalog;
use crate::event::{Capacity, Kind, Outcome};
use crate::ledger::{Ledger, LedgerError, Names, Row, Window};
use crate::money::{HourlyRate, Millis, Money};

const HOUR_MS: Millis = 3_600_000;
const DAY_MS: Millis = 24 * HOUR_MS;
/// Workloads drawn apart in the cost-over-time chart; the rest are summed as "other".
const SERIES_WORKLOADS: usize = 6;
/// Share of a dear model's traffic a cascade is assumed to move to a cheaper one.
const CASCADE_SHARE: f64 = 0.5;

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
}

/// One training run: its segments summed.
#[derive(Debug, Clone, Serialize)]
pub struct RunLine {
    pub run: String,
    pub workload: String,
    pub segments: u32,
    pub preemptions: u32,
    pub failures: u32,
    pub duration_ms: Millis,
    pub lost_ms: Millis,
    pub cost: Money,
    /// The same capacity on demand; `None` where a segment's list price is unknown.
    pub on_demand_cost: Option<Money>,
    pub saving: Option<Money>,
    /// Cost of the work redone after preemptions and failures.
    pub lost_cost: Money,
    pub waste: Money,
    pub utilization: Option<f64>,
    pub spot_share: f64,
    pub completed: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct KindTotal {
    pub kind: Kind,
    pub cost: Money,
    pub share: f64,
    pub waste: Money,
}

/// Training against inference: idle capacity counted with the work it stood by for.
#[derive(Debug, Clone, Serialize)]
pub struct Area {
    /// "inference", "training", "idle" (idle of workloads that did neither) or "other".
    pub area: &'static str,
    pub cost: Money,
    pub share: f64,
    /// The idle part of `cost`.
    pub idle: Money,
}

#[derive(Debug, Clone, Serialize)]
pub struct Item {
    pub kind: Kind,
    pub name: String,
    pub cost: Money,
    pub share: f64,
}

/// A lever worth pulling, with the dollars it puts at stake over the report's window.
#[derive(Debug, Clone, Serialize)]
pub struct Lever {
    pub lever: &'static str,
    pub dollars: Money,
    /// How the dollars were worked out, and what they assume.
    pub basis: String,
    pub action: &'static str,
}

/// Cost over time by workload, in dollars (floats: for charts only).
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub start_ms: Millis,
    pub bucket_ms: Millis,
    pub buckets: usize,
    pub lines: Vec<(String, Vec<f64>)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub window: Window,
    pub first_ms: Option<Millis>,
    pub last_ms: Option<Millis>,
    pub events: u64,
    pub total: Money,
    pub waste: Money,
    /// Busy share of all capacity with a known utilization (idle capacity counts as 0).
    pub utilization: Option<f64>,
    pub by_kind: Vec<KindTotal>,
    /// Which cost dominates the bill, largest first.
    pub areas: Vec<Area>,
    pub dominant: Option<String>,
    pub top_items: Vec<Item>,
    pub inference: Vec<InferenceLine>,
    pub models: Vec<InferenceLine>,
    pub training: Vec<RunLine>,
    pub levers: Vec<Lever>,
    pub series: Series,
}

/// Sums of one inference key.
#[derive(Default)]
struct UnitAcc {
    requests: u64,
    input_tokens: u64,
    output_tokens: u64,
    cost: Money,
    idle: Money,
    waste: Money,
    split_input_cost: Money,
    split_output_cost: Money,
    split_input_tokens: u64,
    split_output_tokens: u64,
    /// Capacity-priced cost and its busy part, for utilization.
    capacity_cost: Money,
    busy_cost: Money,
}

impl UnitAcc {
    fn add_request(&mut self, r: &Row) {
        self.requests += r.requests;
        self.input_tokens += r.input_tokens;
        self.output_tokens += r.output_tokens;
        self.cost += r.cost;
        if let Some(input) = r.input_cost {
            self.split_input_cost += input;
            self.split_output_cost += r.cost - input;
            self.split_input_tokens += r.input_tokens;
            self.split_output_tokens += r.output_tokens;
        }
        if is_capacity(r) {
            let waste = r.waste();
            self.waste += waste;
            self.capacity_cost += r.cost;
            self.busy_cost += r.cost - waste;
        }
    }

    fn add_idle(&mut self, cost: Money) {
        self.idle += cost;
        self.capacity_cost += cost;
    }

    fn merge(&mut self, o: &UnitAcc) {
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
    }

    fn line(&self, workload: Option<String>, model: Option<String>) -> InferenceLine {
        let per = |cost: Money, n: u64, unit: i128| {
            (n > 0).then(|| cost.mul_div(unit, i128::from(n))).flatten()
        };
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
        }
    }
}

/// Paid by the hour (an instance, a measured utilization, or idle) rather than per token;
/// busy in full unless a utilization says otherwise.
fn is_capacity(r: &Row) -> bool {
    r.instance.is_some() || r.utilization.is_some() || r.kind == Kind::Idle
}

fn ratio(part: Money, whole: Money) -> Option<f64> {
    (whole.nanos() > 0).then(|| part.as_f64() / whole.as_f64())
}

#[derive(Default)]
struct RunAcc {
    workload: u32,
    segments: u32,
    preemptions: u32,
    failures: u32,
    duration_ms: Millis,
    lost_ms: Millis,
    cost: Money,
    list_cost: Money,
    list_known: bool,
    lost_cost: Money,
    waste: Money,
    util_cost: Money,
    busy_cost: Money,
    spot_cost: Money,
    completed: bool,
}

/// Spot price per (instance type, region) id, looked up once per report.
type SpotRates = HashMap<(u32, Option<u32>), Option<HourlyRate>>;

/// Savings the catalog prices: on-demand training that spot would have done.
#[derive(Default)]
struct SpotAcc {
    on_demand: Money,
    at_spot: Money,
}

/// Per on-demand serving instance type: instance-milliseconds in each hour, for the
/// steady baseline that reserved capacity would cover.
#[derive(Default)]
struct BaselineAcc {
    hours: HashMap<Millis, i64>,
}

struct Builder<'a> {
    catalog: &'a Catalog,
    names: &'a Names,
    events: u64,
    first_ms: Option<Millis>,
    last_ms: Millis,
    total: Money,
    kinds: HashMap<Kind, (Money, Money)>,
    lines: HashMap<(u32, Option<u32>), UnitAcc>,
    /// Idle cost of a workload that names no model, spread over its lines at the end.
    idle_unassigned: HashMap<u32, Money>,
    runs: HashMap<u32, RunAcc>,
    items: HashMap<(Kind, u32), Money>,
    spot: SpotAcc,
    baseline: HashMap<(u32, Option<u32>), BaselineAcc>,
    origin_ms: Millis,
    bucket_ms: Millis,
    /// Dollars per bucket since `origin_ms`, per workload.
    series: HashMap<u32, Vec<f64>>,
    workload_cost: HashMap<u32, Money>,
    capacity_cost: Money,
    busy_cost: Money,
}

impl Report {
    /// Builds the report over `window` in one scan of the ledger.
    pub fn build(
        ledger: &Ledger,
        catalog: &Catalog,
        window: Window,
    ) -> Result<Report, LedgerError> {
        let names = ledger.names()?;
        let (origin_ms, bucket_ms) = match ledger.span(window)? {
            Some((first, last)) => {
                let bucket = bucket_size(last - first);
                (first - first.rem_euclid(bucket), bucket)
            }
            None => (0, HOUR_MS),
        };
        let mut b = Builder {
            catalog,
            names: &names,
            events: 0,
            first_ms: None,
            last_ms: 0,
            total: Money::ZERO,
            kinds: HashMap::new(),
            lines: HashMap::new(),
            idle_unassigned: HashMap::new(),
            runs: HashMap::new(),
            items: HashMap::new(),
            spot: SpotAcc::default(),
            baseline: HashMap::new(),
            origin_ms,
            bucket_ms,
            series: HashMap::new(),
            workload_cost: HashMap::new(),
            capacity_cost: Money::ZERO,
            busy_cost: Money::ZERO,
        };
        // A spot price lookup per (instance, region) would otherwise repeat per row.
        let mut spot_rates = SpotRates::new();
        ledger.scan(window, |r| b.add(r, &mut spot_rates))?;
        Ok(b.finish(window))
    }
}

impl Builder<'_> {
    fn add(&mut self, r: &Row, spot_rates: &mut SpotRates) {
        self.events += 1;
        self.first_ms.get_or_insert(r.ts_ms);
        self.last_ms = self.last_ms.max(r.ts_ms + r.duration_ms);
        self.total += r.cost;
        let waste = r.waste();
        let kind = self.kinds.entry(r.kind).or_default();
        kind.0 += r.cost;
        kind.1 += waste;
        *self
            .items
            .entry((
                r.kind,
                r.run
                    .filter(|_| r.kind == Kind::Training)
                    .unwrap_or(r.workload),
            ))
            .or_default() += r.cost;
        *self.workload_cost.entry(r.workload).or_default() += r.cost;
        self.add_series(r);
        if is_capacity(r) {
            self.capacity_cost += r.cost;
            self.busy_cost += r.cost - waste;
        }
        match r.kind {
            Kind::Inference => {
                self.lines
                    .entry((r.workload, r.model))
                    .or_default()
                    .add_request(r);
                self.add_baseline(r);
            }
            Kind::Idle => {
                match r.model {
                    Some(_) => self
                        .lines
                        .entry((r.workload, r.model))
                        .or_default()
                        .add_idle(r.cost),
                    None => *self.idle_unassigned.entry(r.workload).or_default() += r.cost,
                }
                self.add_baseline(r);
            }
            Kind::Training => {
                if let Some(run) = r.run {
                    self.add_run(run, r, waste);
                }
                if let (None | Some(Capacity::OnDemand), Some(instance)) = (r.capacity, r.instance)
                {
                    self.add_spot_alternative(r, instance, spot_rates);
                }
            }
            Kind::Other => {}
        }
    }

    /// What on-demand training would have cost on spot, at the catalog's median spot price.
    fn add_spot_alternative(&mut self, r: &Row, instance: u32, spot_rates: &mut SpotRates) {
        let rate = *spot_rates.entry((instance, r.region)).or_insert_with(|| {
            let region = r.region.map(|id| self.names.get(id));
            self.catalog
                .instance(self.names.get(instance), region)
                .ok()
                .and_then(|o| o.spot)
        });
        if let Some(at_spot) = rate.and_then(|s| s.cost(r.duration_ms, r.instances)) {
            self.spot.on_demand += r.cost;
            self.spot.at_spot += at_spot.min(r.cost);
        }
    }

    fn add_run(&mut self, run: u32, r: &Row, waste: Money) {
        let acc = self.runs.entry(run).or_default();
        acc.workload = r.workload;
        acc.segments += 1;
        acc.duration_ms += r.duration_ms;
        acc.lost_ms += r.lost_ms;
        acc.cost += r.cost;
        acc.waste += waste;
        match r.list_cost {
            Some(list) => acc.list_cost += list,
            None => acc.list_known = false,
        }
        if acc.segments == 1 {
            acc.list_known = r.list_cost.is_some();
        }
        if r.duration_ms > 0 && r.lost_ms > 0 {
            acc.lost_cost += r
                .cost
                .mul_div(
                    i128::from(r.lost_ms.min(r.duration_ms)),
                    i128::from(r.duration_ms),
                )
                .unwrap_or(Money::ZERO);
        }
        if r.utilization.is_some() {
            acc.util_cost += r.cost;
            acc.busy_cost += r.cost - waste;
        }
        if r.capacity == Some(Capacity::Spot) {
            acc.spot_cost += r.cost;
        }
        match r.outcome {
            Some(Outcome::Preempted) => acc.preemptions += 1,
            Some(Outcome::Failed) => acc.failures += 1,
            Some(Outcome::Completed) => acc.completed = true,
            _ => {}
        }
    }

    /// Serving on on-demand instances, hour by hour, for the reserved-baseline lever.
    fn add_baseline(&mut self, r: &Row) {
        let (Some(instance), Some(Capacity::OnDemand) | None) = (r.instance, r.capacity) else {
            return;
        };
        if r.duration_ms <= 0 {
            return;
        }
        let acc = self.baseline.entry((instance, r.region)).or_default();
        for_each_overlap(r.ts_ms, r.duration_ms, HOUR_MS, |hour, ms| {
            *acc.hours.entry(hour).or_default() += ms * i64::from(r.instances);
        });
    }

    fn finish(mut self, window: Window) -> Report {
        let names = self.names;
        let name = |id: u32| names.get(id).to_owned();
        // Idle capacity that names no model is shared by the workload's models by their cost.
        for (workload, idle) in std::mem::take(&mut self.idle_unassigned) {
            let keys: Vec<_> = self
                .lines
                .keys()
                .filter(|(w, _)| *w == workload)
                .copied()
                .collect();
            let total: Money = keys.iter().map(|k| self.lines[k].cost).sum();
            if keys.is_empty() || total.nanos() <= 0 {
                self.lines
                    .entry((workload, None))
                    .or_default()
                    .add_idle(idle);
                continue;
            }
            let mut left = idle;
            for (i, key) in keys.iter().enumerate() {
                let share = if i + 1 == keys.len() {
                    left
                } else {
                    idle.mul_div(
                        i128::from(self.lines[key].cost.nanos()),
                        i128::from(total.nanos()),
                    )
                    .unwrap_or(Money::ZERO)
                };
                left -= share;
                if let Some(line) = self.lines.get_mut(key) {
                    line.add_idle(share);
                }
            }
        }
        let total = self.total;
        let share = |m: Money| ratio(m, total).unwrap_or(0.0);
        let mut by_kind: Vec<KindTotal> = self
            .kinds
            .iter()
            .map(|(kind, (cost, waste))| KindTotal {
                kind: *kind,
                cost: *cost,
                share: share(*cost),
                waste: *waste,
            })
            .collect();
        by_kind.sort_by(|a, b| b.cost.cmp(&a.cost).then(a.kind.cmp(&b.kind)));
        let waste: Money = by_kind.iter().map(|k| k.waste).sum();

        let mut top_items: Vec<Item> = self
            .items
            .iter()
            .map(|((kind, id), cost)| Item {
                kind: *kind,
                name: name(*id),
                cost: *cost,
                share: share(*cost),
            })
            .collect();
        top_items.sort_by(|a, b| b.cost.cmp(&a.cost).then_with(|| a.name.cmp(&b.name)));
        top_items.truncate(5);

        let mut inference: Vec<InferenceLine> = self
            .lines
            .iter()
            .map(|((w, m), acc)| acc.line(Some(name(*w)), m.map(name)))
            .collect();
        inference.sort_by(|a, b| {
            (b.cost + b.idle_cost)
                .cmp(&(a.cost + a.idle_cost))
                .then_with(|| a.workload.cmp(&b.workload))
        });
        let mut by_model: HashMap<Option<u32>, UnitAcc> = HashMap::new();
        for ((_, model), acc) in &self.lines {
            by_model.entry(*model).or_default().merge(acc);
        }
        let mut models: Vec<InferenceLine> = by_model
            .iter()
            .map(|(m, acc)| acc.line(None, m.map(name)))
            .collect();
        models.sort_by(|a, b| {
            (b.cost + b.idle_cost)
                .cmp(&(a.cost + a.idle_cost))
                .then_with(|| a.model.cmp(&b.model))
        });

        let mut training: Vec<RunLine> = self
            .runs
            .iter()
            .map(|(run, acc)| {
                let on_demand = acc.list_known.then_some(acc.list_cost);
                RunLine {
                    run: name(*run),
                    workload: name(acc.workload),
                    segments: acc.segments,
                    preemptions: acc.preemptions,
                    failures: acc.failures,
                    duration_ms: acc.duration_ms,
                    lost_ms: acc.lost_ms,
                    cost: acc.cost,
                    on_demand_cost: on_demand,
                    saving: on_demand.map(|od| od - acc.cost),
                    lost_cost: acc.lost_cost,
                    waste: acc.waste,
                    utilization: ratio(acc.busy_cost, acc.util_cost),
                    spot_share: ratio(acc.spot_cost, acc.cost).unwrap_or(0.0),
                    completed: acc.completed,
                }
            })
            .collect();
        training.sort_by(|a, b| b.cost.cmp(&a.cost).then_with(|| a.run.cmp(&b.run)));

        let levers = self.levers(&inference, &training);
        let areas = self.areas(total);
        let dominant = dominant(&areas, &top_items, total);
        let series = self.series();
        Report {
            window,
            first_ms: self.first_ms,
            last_ms: self.first_ms.map(|_| self.last_ms),
            events: self.events,
            total,
            waste,
            utilization: ratio(self.busy_cost, self.capacity_cost),
            by_kind,
            areas,
            dominant,
            top_items,
            inference,
            models,
            training,
            levers,
            series,
        }
    }

    fn areas(&self, total: Money) -> Vec<Area> {
        let kind = |k: Kind| self.kinds.get(&k).map_or(Money::ZERO, |c| c.0);
        let serving: std::collections::HashSet<u32> = self.lines.keys().map(|(w, _)| *w).collect();
        let training: std::collections::HashSet<u32> = self.runs.values().map(|r| r.workload).collect();
        let (mut serving_idle, mut training_idle, mut other_idle) = (Money::ZERO, Money::ZERO, Money::ZERO);
        for ((k, id), cost) in &self.items {
            match k {
                Kind::Idle if serving.contains(id) => serving_idle += *cost,
                Kind::Idle if training.contains(id) => training_idle += *cost,
                Kind::Idle => other_idle += *cost,
                _ => {}
            }
        }
        let mut areas: Vec<Area> = [
            ("inference", kind(Kind::Inference) + serving_idle, serving_idle),
            ("training", kind(Kind::Training) + training_idle, training_idle),
            ("idle", other_idle, other_idle),
            ("other", kind(Kind::Other), Money::ZERO),
        ]
        .into_iter()
        .filter(|(_, cost, _)| *cost != Money::ZERO)
        .map(|(area, cost, idle)| Area {
            area,
            cost,
            share: ratio(cost, total).unwrap_or(0.0),
            idle,
        })
        .collect();
        areas.sort_by(|a, b| b.cost.cmp(&a.cost));
        areas
    }

    fn levers(&self, inference: &[InferenceLine], training: &[RunLine]) -> Vec<Lever> {
        let mut levers = Vec::new();
        let kind = |k: Kind| self.kinds.get(&k).copied().unwrap_or_default();
        let serving_waste = kind(Kind::Idle).1 + kind(Kind::Inference).1;
        if serving_waste > Money::ZERO {
            levers.push(Lever {
                lever: "cut idle serving capacity",
                dollars: serving_waste,
                basis: format!(
                    "{} of idle capacity and {} of unused share inside busy replicas",
                    kind(Kind::Idle).1,
                    kind(Kind::Inference).1
                ),
                action: "autoscale replicas to demand and to zero when traffic stops; right-size the instance to the model",
            });
        }
        let training_waste = kind(Kind::Training).1;
        if training_waste > Money::ZERO {
            let util = ratio(
                training.iter().map(|r| r.cost - r.waste).sum(),
                training.iter().map(|r| r.cost).sum(),
            );
            levers.push(Lever {
                lever: "keep training GPUs busy",
                dollars: training_waste,
                basis: format!(
                    "training GPUs were busy {} of the paid time",
                    util.map_or("?".to_owned(), pct)
                ),
                action: "find why GPUs idle (data loading, small batches, sync stalls) and fix the pipeline before adding GPUs",
            });
        }
        let spot_saving = self.spot.on_demand - self.spot.at_spot;
        if spot_saving > Money::ZERO {
            let lost: Money = training.iter().map(|r| r.lost_cost).sum();
            levers.push(Lever {
                lever: "train on spot with checkpoints",
                dollars: spot_saving,
                basis: format!(
                    "{} of on-demand training at the catalog's median spot price is {}; preemptions in this window re-did {} of work",
                    self.spot.on_demand, self.spot.at_spot, lost
                ),
                action: "run training on spot capacity with frequent checkpoints and automatic resume",
            });
        }
        if let Some(lever) = self.reserved_lever() {
            levers.push(lever);
        }
        if let Some(lever) = cascade_lever(inference) {
            levers.push(lever);
        }
        levers.sort_by_key(|l| std::cmp::Reverse(l.dollars));
        levers
    }

    /// Reserved capacity for the floor of on-demand serving that ran every hour.
    fn reserved_lever(&self) -> Option<Lever> {
        let mut dollars = Money::ZERO;
        let mut parts = Vec::new();
        let mut unpriced = Vec::new();
        for ((instance, region), acc) in &self.baseline {
            let (Some(&first), Some(&last)) = (acc.hours.keys().min(), acc.hours.keys().max())
            else {
                continue;
            };
            // Whole hours only: the first and last may be partly outside the window.
            let span = (last - first) / HOUR_MS - 1;
            if span < 24 {
                continue;
            }
            let floor = (1..=span)
                .map(|h| acc.hours.get(&(first + h * HOUR_MS)).copied().unwrap_or(0))
                .min()
                .unwrap_or(0);
            let instances = floor / HOUR_MS;
            if instances == 0 {
                continue;
            }
            let name = self.names.get(*instance);
            let region = region.map(|r| self.names.get(r));
            let Ok(offer) = self.catalog.instance(name, region) else {
                continue;
            };
            let Some(reserved) = offer.reserved_1y else {
                unpriced.push(name.to_owned());
                continue;
            };
            let hours_ms = span * HOUR_MS;
            let od = offer
                .on_demand
                .cost(hours_ms, instances as u32)
                .unwrap_or(Money::ZERO);
            let rs = reserved
                .cost(hours_ms, instances as u32)
                .unwrap_or(Money::ZERO);
            dollars += od - rs;
            parts.push(format!("{instances} x {name} ran all {span} h"));
        }
        if dollars > Money::ZERO {
            Some(Lever {
                lever: "reserve the steady baseline",
                dollars,
                basis: format!(
                    "{} on demand; priced at the catalog's 1-year reserved rate",
                    parts.join(", ")
                ),
                action: "commit (reserved or savings plan) for the baseline that never goes away; keep on-demand plus autoscaling above it",
            })
        } else if !unpriced.is_empty() {
            unpriced.sort();
            unpriced.dedup();
            Some(Lever {
                lever: "reserve the steady baseline",
                dollars: Money::ZERO,
                basis: format!(
                    "{} served a steady on-demand baseline, but the catalog has no reserved price for it: add `reserved_1y` to a price file",
                    unpriced.join(", ")
                ),
                action: "commit (reserved or savings plan) for the baseline that never goes away",
            })
        } else {
            None
        }
    }

    /// Spreads the event's cost over the buckets its span touches.
    fn add_series(&mut self, r: &Row) {
        let (origin, size) = (self.origin_ms, self.bucket_ms);
        let values = self.series.entry(r.workload).or_default();
        let mut add = |bucket_start: Millis, dollars: f64| {
            let i = ((bucket_start - origin).max(0) / size) as usize;
            if values.len() <= i {
                values.resize(i + 1, 0.0);
            }
            values[i] += dollars;
        };
        let dollars = r.cost.as_f64();
        if r.duration_ms <= 0 {
            add(r.ts_ms, dollars);
        } else {
            let d = r.duration_ms as f64;
            for_each_overlap(r.ts_ms, r.duration_ms, size, |b, ms| {
                add(b, dollars * ms as f64 / d)
            });
        }
    }

    fn series(&self) -> Series {
        let buckets = self.series.values().map(Vec::len).max().unwrap_or(0);
        let mut ranked: Vec<(u32, Money)> =
            self.workload_cost.iter().map(|(w, c)| (*w, *c)).collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut lines: Vec<(String, Vec<f64>)> = Vec::new();
        let mut other = vec![0.0; buckets];
        for (i, (workload, _)) in ranked.iter().enumerate() {
            let mut values = self.series.get(workload).cloned().unwrap_or_default();
            values.resize(buckets, 0.0);
            if i < SERIES_WORKLOADS {
                lines.push((self.names.get(*workload).to_owned(), values));
            } else {
                other.iter_mut().zip(values).for_each(|(o, v)| *o += v);
            }
        }
        if ranked.len() > SERIES_WORKLOADS {
            lines.push(("other".to_owned(), other));
        }
        Series {
            start_ms: self.origin_ms,
            bucket_ms: self.bucket_ms,
            buckets,
            lines,
        }
    }
}

/// Hours for a window up to two days, days up to a quarter, weeks beyond.
fn bucket_size(span_ms: Millis) -> Millis {
    if span_ms <= 2 * DAY_MS {
        HOUR_MS
    } else if span_ms <= 90 * DAY_MS {
        DAY_MS
    } else {
        7 * DAY_MS
    }
}

/// Calls `f(bucket_start, overlap_ms)` for each bucket of `size` that `[ts, ts + duration)` touches.
fn for_each_overlap(ts: Millis, duration: Millis, size: Millis, mut f: impl FnMut(Millis, Millis)) {
    let end = ts + duration;
    let mut b = ts - ts.rem_euclid(size);
    while b < end {
        let overlap = end.min(b + size) - ts.max(b);
        if overlap > 0 {
            f(b, overlap);
        }
        b += size;
    }
}

/// Routing the dearest model's traffic of a workload to its cheapest, where both serve it.
fn cascade_lever(inference: &[InferenceLine]) -> Option<Lever> {
    let mut best: Option<(Money, String)> = None;
    let mut total = Money::ZERO;
    let mut by_workload: HashMap<&str, Vec<&InferenceLine>> = HashMap::new();
    for line in inference
        .iter()
        .filter(|l| l.model.is_some() && l.requests > 0)
    {
        by_workload
            .entry(line.workload.as_deref().unwrap_or(""))
            .or_default()
            .push(line);
    }
    for (workload, lines) in by_workload {
        let per = |l: &InferenceLine| (l.cost + l.idle_cost).as_f64() / l.requests as f64;
        let (Some(dear), Some(cheap)) = (
            lines
                .iter()
                .copied()
                .max_by(|a, b| per(a).total_cmp(&per(b))),
            lines
                .iter()
                .copied()
                .min_by(|a, b| per(a).total_cmp(&per(b))),
        ) else {
            continue;
        };
        if per(cheap) <= 0.0 || per(dear) < 3.0 * per(cheap) {
            continue;
        }
        let moved = (dear.cost + dear.idle_cost).scale(CASCADE_SHARE);
        let saving = moved.scale(1.0 - per(cheap) / per(dear));
        total += saving;
        let text = format!(
            "{workload}: {} costs {:.1}x {} per request",
            dear.model.as_deref().unwrap_or("?"),
            per(dear) / per(cheap),
            cheap.model.as_deref().unwrap_or("?"),
        );
        if best.as_ref().is_none_or(|(s, _)| saving > *s) {
            best = Some((saving, text));
        }
    }
    let (_, text) = best?;
    Some(Lever {
        lever: "route easy requests to the small model",
        dollars: total,
        basis: format!(
            "{text}; assumes a cascade moves {} of the dear model's requests, to be checked on a held-out eval set",
            pct(CASCADE_SHARE)
        ),
        action: "send requests to the cheapest model first and escalate only low-confidence answers",
    })
}

fn dominant(areas: &[Area], top: &[Item], total: Money) -> Option<String> {
    let first = areas.first().filter(|a| a.cost > Money::ZERO)?;
    let mut s = format!("{} is {} of the {} spent", first.area, pct(first.share), total);
    if first.idle > Money::ZERO {
        s.push_str(&format!(" ({} of it idle capacity)", first.idle));
    }
    if let Some(next) = areas.get(1) {
        s.push_str(&format!(", {} {}", next.area, pct(next.share)));
    }
    if let Some(item) = top.first() {
        s.push_str(&format!(
            "; the largest item is {} `{}` at {} ({})",
            item.kind,
            item.name,
            item.cost,
            pct(item.share)
        ));
    }
    Some(s)
}

/// `0.354` -> `35%`.
pub fn pct(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

/// "at 35% utilization you pay 2.9x per unit of work".
pub fn utilization_note(utilization: f64) -> Option<String> {
    (utilization > 0.0 && utilization < 0.995).then(|| {
        format!(
            "at {} utilization you pay {:.1}x per unit of work",
            pct(utilization),
            1.0 / utilization
        )
    })
}

#[cfg(test)]
mod tests;
