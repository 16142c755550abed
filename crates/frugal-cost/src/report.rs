//! The unit-cost report: what a training run, a thousand inferences and a million tokens
//! cost, which cost dominates, how much of it is waste, and the levers to pull first; and
//! for pools of replicas, what scaling to demand saved and what to right-size (`pools`);
//! for training runs, what their watchdogs measured: MFU, precision, stalls (`advisor`).
//!
//! One pass over the ledger's rows (in time order) feeds every table, so a report over ten
//! million events costs one scan. Money sums are exact; shares, ratios and chart series are
//! floats.

use std::collections::HashMap;

use serde::Serialize;

use crate::catalog::Catalog;
use crate::event::{Capacity, Kind, Outcome, Precision};
use crate::ledger::{Ledger, LedgerError, Names, Window};
use crate::money::{HourlyRate, Millis, Money};
use crate::present::pct;
use crate::rollup::{Key, Sums};

mod advisor;
mod batch;
mod by;
mod lever;
mod pools;
mod quality;
mod reserve;
mod servers;
mod unit;

pub use advisor::{MFU_CEILING, MIN_STALL, RunAdvice, precision_saving};
pub use batch::BatchJobLine;
pub use by::{By, Spend, SpendLine};
pub use lever::Lever;
pub use pools::{PoolLine, RightSizing, Sizing};
pub use quality::{QUALITY_HEAD, QUALITY_NOTE, QualityLine, wilson};
pub use servers::{CONSOLIDATE_TO, ServerLine};
pub use unit::{InferenceLine, Savings, WrongHits};
use unit::{UnitAcc, ratio};

const HOUR_MS: Millis = 3_600_000;
const DAY_MS: Millis = 24 * HOUR_MS;
/// Workloads drawn apart in the cost-over-time chart; the rest are summed as "other".
const SERIES_WORKLOADS: usize = 6;
/// Share of a dear model's traffic a cascade is assumed to move to a cheaper one.
const CASCADE_SHARE: f64 = 0.5;

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
    /// Model FLOPs utilization, over the segments whose watchdog measured it.
    pub mfu: Option<f64>,
    /// The precision it computed in most.
    pub precision: Option<Precision>,
    /// Share of its step time spent waiting on data.
    pub data_stall: Option<f64>,
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

/// Cost over time by workload, in dollars (floats: for charts only).
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub start_ms: Millis,
    pub bucket_ms: Millis,
    pub buckets: usize,
    pub lines: Vec<(String, Vec<f64>)>,
}

/// What a report is asked for beyond its window.
#[derive(Debug, Clone)]
pub struct Options {
    /// A pool whose replicas are busy less than this share of their time is flagged.
    pub pool_busy_below: f64,
    /// Spend grouped by tenant, model, workload or day, besides the rest ([`Report::spend`]).
    pub by: Option<By>,
    /// The bounds the semantic cache's hits were served under, shown beside the estimate
    /// of how many were wrong.
    pub error_budgets: ErrorBudgets,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            pool_busy_below: 0.3,
            by: None,
            error_budgets: ErrorBudgets::default(),
        }
    }
}

/// The semantic cache's error budgets (`semantic_max_error`: the share of served semantic
/// hits that may be wrong) as frugal.toml sets them: `[serve]`'s, and the models that set
/// their own (an upstream, a pool, a route), by the name their requests are recorded under.
#[derive(Debug, Clone, Default)]
pub struct ErrorBudgets {
    pub default: Option<f64>,
    pub by_model: HashMap<String, f64>,
}

impl ErrorBudgets {
    /// The bound `model`'s semantic hits are served under, where known.
    pub fn of(&self, model: Option<&str>) -> Option<f64> {
        model
            .and_then(|m| self.by_model.get(m))
            .copied()
            .or(self.default)
    }
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
    /// Batch jobs, each beside its model's interactive unit costs.
    pub batch: Vec<BatchJobLine>,
    /// Pools of replicas with spans in the window.
    pub pools: Vec<PoolLine>,
    /// The busy share under which a pool is flagged for right-sizing.
    pub pool_busy_below: f64,
    /// Servers `frugal watch` measured, with spans in the window.
    pub servers: Vec<ServerLine>,
    pub levers: Vec<Lever>,
    pub series: Series,
    /// Every semantic hit a verifier judged, and the estimate of how many were wrong; the
    /// bound where every line's is the same.
    pub semantic: Option<WrongHits>,
    /// Quality kept beside each lever's saving, where answers were shadowed (`shadow_rate`).
    pub quality: Vec<QualityLine>,
    /// Spend by tenant, model, workload or day, when asked for ([`Options::by`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spend: Option<Spend>,
}

#[derive(Default)]
struct RunAcc {
    workload: u32,
    sums: Sums,
    preemptions: i64,
    failures: i64,
    spot_cost: Money,
    completed: bool,
}

/// Spot price per (instance type, region) id, looked up once per report.
type SpotRates = HashMap<(u32, u32), Option<HourlyRate>>;

/// Savings the catalog prices: on-demand training that spot would have done.
#[derive(Default)]
struct SpotAcc {
    on_demand: Money,
    at_spot: Money,
    /// Per (workload, instance, region): the saving, and the training's hours of work.
    runs: HashMap<(u32, u32, u32), (Money, Millis)>,
}

struct Builder<'a> {
    catalog: &'a Catalog,
    /// The report's window, which the commands it suggests cover too.
    window: Window,
    names: &'a Names,
    all: Sums,
    kinds: HashMap<Kind, (Money, Money)>,
    lines: HashMap<(u32, u32), UnitAcc>,
    /// Idle cost of a workload that names no model, spread over its lines at the end.
    idle_unassigned: HashMap<u32, Money>,
    runs: HashMap<u32, RunAcc>,
    items: HashMap<(Kind, u32), Money>,
    spot: SpotAcc,
    spot_rates: SpotRates,
    /// The workloads served on demand, which the reserved-capacity lever plans.
    on_demand_serving: reserve::Served,
    /// Cost per (hour, workload), for the series.
    hourly: HashMap<(Millis, u32), Money>,
    workload_cost: HashMap<u32, Money>,
    /// Requests that did not fail per (workload, model): a pool's requests.
    served: HashMap<(u32, u32), u64>,
    /// Batch jobs' lines per (job, model).
    jobs: HashMap<(u32, u32), batch::JobAcc>,
}

impl Report {
    /// Builds the report over the whole hours `window` touches, from the ledger's hourly
    /// rollups: a few thousand rows however many events there are.
    pub fn build(
        ledger: &Ledger,
        catalog: &Catalog,
        window: Window,
    ) -> Result<Report, LedgerError> {
        Report::build_with(ledger, catalog, window, Options::default())
    }

    /// `build`, with the thresholds in `options`.
    pub fn build_with(
        ledger: &Ledger,
        catalog: &Catalog,
        window: Window,
        options: Options,
    ) -> Result<Report, LedgerError> {
        let names = ledger.names()?;
        let mut b = Builder {
            catalog,
            window,
            names: &names,
            all: Sums::default(),
            kinds: HashMap::new(),
            lines: HashMap::new(),
            idle_unassigned: HashMap::new(),
            runs: HashMap::new(),
            items: HashMap::new(),
            spot: SpotAcc::default(),
            spot_rates: SpotRates::new(),
            on_demand_serving: reserve::Served::default(),
            hourly: HashMap::new(),
            workload_cost: HashMap::new(),
            served: HashMap::new(),
            jobs: HashMap::new(),
        };
        ledger.rollups(window, |k, s| b.add(k, s))?;
        let served = b
            .served
            .iter()
            .map(|((w, m), n)| ((names.get(*w), names.get(*m)), *n))
            .collect();
        let busy_below = options.pool_busy_below;
        // One read of the spans: a pool's replicas, or a watched server's intervals.
        let (mut pool_spans, mut server_spans) =
            (pools::PoolSpans::default(), servers::ServerSpans::default());
        let hours = window.whole_hours();
        ledger.spans(hours, |s| match &s.server {
            Some(server) => server_spans.add(server, s),
            None => pool_spans.add(s),
        })?;
        let pools = pools::build(pool_spans, ledger, catalog, hours, &served, busy_below)?;
        let servers = servers::build(server_spans, catalog);
        let mut advice = advisor::advise(ledger, catalog, window)?;
        let reserve = reserve::lever(ledger, catalog, &names, window, &b.on_demand_serving)?;
        advice.levers.extend(reserve);
        let mut report = b.finish(window, pools, servers, advice, busy_below);
        report.bound_semantic_hits(&options.error_budgets);
        report.quality = quality::lines(ledger.quality(window)?, &report.inference);
        // The rollups count the whole hours the window touches: the raw events too.
        report.spend = options
            .by
            .map(|by| by::spend(ledger, hours, by))
            .transpose()?;
        Ok(report)
    }
}

impl Report {
    /// Puts each line's error budget beside its estimate of wrong semantic hits.
    fn bound_semantic_hits(&mut self, budgets: &ErrorBudgets) {
        let mut bounds = Vec::new();
        for line in self.inference.iter_mut().chain(self.models.iter_mut()) {
            if let Some(hits) = &mut line.semantic {
                hits.max_error = budgets.of(line.model.as_deref());
                bounds.push(hits.max_error);
            }
        }
        if let Some(all) = &mut self.semantic {
            all.max_error = match bounds.split_first() {
                Some((first, rest)) if rest.iter().all(|b| b == first) => *first,
                _ => None,
            };
        }
    }
}

impl Builder<'_> {
    fn add(&mut self, k: &Key, s: &Sums) {
        self.all.merge(s);
        let kind = self.kinds.entry(k.kind).or_default();
        kind.0 += s.cost;
        kind.1 += s.waste;
        let item = if k.kind == Kind::Training && k.run != 0 {
            k.run
        } else {
            k.workload
        };
        *self.items.entry((k.kind, item)).or_default() += s.cost;
        *self.workload_cost.entry(k.workload).or_default() += s.cost;
        *self.hourly.entry((k.hour_ms, k.workload)).or_default() += s.cost;
        let on_demand = matches!(k.capacity, None | Some(Capacity::OnDemand));
        match k.kind {
            Kind::Inference | Kind::Idle => {
                if k.kind == Kind::Inference && k.run != 0 {
                    // Only a batch job's lines carry a run among inference events.
                    self.jobs
                        .entry((k.run, k.model))
                        .or_default()
                        .add(k.workload, k.capacity, s);
                }
                if k.kind == Kind::Inference {
                    self.lines
                        .entry((k.workload, k.model))
                        .or_default()
                        .add_requests(s);
                } else if k.model != 0 {
                    self.lines
                        .entry((k.workload, k.model))
                        .or_default()
                        .add_idle(s.cost);
                } else {
                    *self.idle_unassigned.entry(k.workload).or_default() += s.cost;
                }
                if k.kind == Kind::Inference && k.model != 0 && k.outcome != Some(Outcome::Failed) {
                    *self.served.entry((k.workload, k.model)).or_default() += s.requests as u64;
                }
                if k.kind == Kind::Inference && on_demand && k.instance != 0 {
                    self.on_demand_serving
                        .add(k.workload, k.instance, k.region, s.instance_ms);
                }
            }
            Kind::Training => {
                if k.run != 0 {
                    self.add_run(k, s);
                }
                if on_demand && k.instance != 0 {
                    self.add_spot_alternative(k, s);
                }
            }
            Kind::Other => {}
        }
    }

    /// What on-demand training would have cost on spot, at the catalog's median spot price.
    fn add_spot_alternative(&mut self, k: &Key, s: &Sums) {
        let (catalog, names) = (self.catalog, self.names);
        let rate = *self
            .spot_rates
            .entry((k.instance, k.region))
            .or_insert_with(|| {
                let region = (k.region != 0).then(|| names.get(k.region));
                catalog
                    .instance(names.get(k.instance), region)
                    .ok()
                    .and_then(|o| o.spot)
            });
        if let Some(at_spot) = rate.and_then(|r| r.cost(s.instance_ms, 1)) {
            self.spot.on_demand += s.cost;
            self.spot.at_spot += at_spot.min(s.cost);
            let run = self
                .spot
                .runs
                .entry((k.workload, k.instance, k.region))
                .or_default();
            run.0 += s.cost - at_spot.min(s.cost);
            run.1 += s.duration_ms;
        }
    }

    fn add_run(&mut self, k: &Key, s: &Sums) {
        let acc = self.runs.entry(k.run).or_default();
        acc.workload = k.workload;
        acc.sums.merge(s);
        if k.capacity == Some(Capacity::Spot) {
            acc.spot_cost += s.cost;
        }
        match k.outcome {
            Some(Outcome::Preempted) => acc.preemptions += s.events,
            Some(Outcome::Failed) => acc.failures += s.events,
            Some(Outcome::Completed) => acc.completed |= s.events > 0,
            _ => {}
        }
    }

    fn finish(
        mut self,
        window: Window,
        pools: Vec<PoolLine>,
        servers: Vec<ServerLine>,
        advice: advisor::Advice,
        pool_busy_below: f64,
    ) -> Report {
        let names = self.names;
        let name = |id: u32| names.get(id).to_owned();
        let opt_name = |id: u32| (id != 0).then(|| name(id));
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
                self.lines.entry((workload, 0)).or_default().add_idle(idle);
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
        let total = self.all.cost;
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
            .map(|((w, m), acc)| acc.line(Some(name(*w)), opt_name(*m)))
            .collect();
        inference.sort_by(|a, b| {
            (b.cost + b.idle_cost)
                .cmp(&(a.cost + a.idle_cost))
                .then_with(|| a.workload.cmp(&b.workload))
                .then_with(|| a.model.cmp(&b.model))
        });
        let mut by_model: HashMap<u32, UnitAcc> = HashMap::new();
        for ((_, model), acc) in &self.lines {
            by_model.entry(*model).or_default().merge(acc);
        }
        let mut models: Vec<InferenceLine> = by_model
            .iter()
            .map(|(m, acc)| acc.line(None, opt_name(*m)))
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
                let s = &acc.sums;
                let on_demand = (s.unlisted == 0).then_some(s.list_cost);
                let advised = advice
                    .runs
                    .get(names.get(*run))
                    .cloned()
                    .unwrap_or_default();
                RunLine {
                    run: name(*run),
                    workload: name(acc.workload),
                    segments: s.events as u32,
                    preemptions: acc.preemptions as u32,
                    failures: acc.failures as u32,
                    duration_ms: s.duration_ms,
                    lost_ms: s.lost_ms,
                    cost: s.cost,
                    on_demand_cost: on_demand,
                    saving: on_demand.map(|od| od - s.cost),
                    lost_cost: s.lost_cost,
                    waste: s.waste,
                    utilization: ratio(s.util_cost - s.waste, s.util_cost),
                    spot_share: ratio(acc.spot_cost, s.cost).unwrap_or(0.0),
                    completed: acc.completed,
                    mfu: advised.mfu,
                    precision: advised.precision,
                    data_stall: advised.data_stall,
                }
            })
            .collect();
        training.sort_by(|a, b| b.cost.cmp(&a.cost).then_with(|| a.run.cmp(&b.run)));

        let batch = batch::lines(&self.jobs, &self.lines, names);
        let levers = self.levers(&inference, &training, &pools, &servers, advice.levers);
        let areas = self.areas(total);
        let dominant = dominant(&areas, &top_items, total);
        let series = self.series();
        Report {
            window,
            first_ms: (self.all.events > 0).then_some(self.all.first_ms),
            last_ms: (self.all.events > 0).then_some(self.all.last_ms),
            events: self.all.events as u64,
            total,
            waste,
            utilization: ratio(
                self.all.capacity_cost - self.all.waste,
                self.all.capacity_cost,
            ),
            by_kind,
            areas,
            dominant,
            top_items,
            inference,
            models,
            training,
            batch,
            pools,
            pool_busy_below,
            servers,
            levers,
            series,
            semantic: WrongHits::of(
                self.all.verified_hits.max(0) as u64,
                self.all.expected_wrong,
                self.all.wrong_variance,
            ),
            quality: Vec::new(),
            spend: None,
        }
    }

    fn areas(&self, total: Money) -> Vec<Area> {
        let kind = |k: Kind| self.kinds.get(&k).map_or(Money::ZERO, |c| c.0);
        let serving: std::collections::HashSet<u32> = self.lines.keys().map(|(w, _)| *w).collect();
        let training: std::collections::HashSet<u32> =
            self.runs.values().map(|r| r.workload).collect();
        let (mut serving_idle, mut training_idle, mut other_idle) =
            (Money::ZERO, Money::ZERO, Money::ZERO);
        for ((k, id), cost) in &self.items {
            match k {
                Kind::Idle if serving.contains(id) => serving_idle += *cost,
                Kind::Idle if training.contains(id) => training_idle += *cost,
                Kind::Idle => other_idle += *cost,
                _ => {}
            }
        }
        let mut areas: Vec<Area> = [
            (
                "inference",
                kind(Kind::Inference) + serving_idle,
                serving_idle,
            ),
            (
                "training",
                kind(Kind::Training) + training_idle,
                training_idle,
            ),
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
        areas.sort_by_key(|a| std::cmp::Reverse(a.cost));
        areas
    }

    fn levers(
        &self,
        inference: &[InferenceLine],
        training: &[RunLine],
        pools: &[PoolLine],
        servers: &[ServerLine],
        advised: Vec<Lever>,
    ) -> Vec<Lever> {
        let mut levers = advised;
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
                action: "autoscale replicas to demand and to zero when traffic stops; right-size the instance to the model".into(),
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
                action: "find why GPUs idle (data loading, small batches, sync stalls) and fix the pipeline before adding GPUs".into(),
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
                action: format!(
                    "run training on spot capacity with frequent checkpoints and automatic resume (`frugal train --spot -- CMD`){}",
                    self.spot_plan_command()
                )
                .into(),
            });
        }
        if let Some(lever) = cascade_lever(inference) {
            levers.push(lever);
        }
        levers.extend(pools::levers(pools));
        levers.extend(servers::levers(servers));
        levers.sort_by_key(|l| std::cmp::Reverse(l.dollars));
        levers
    }

    /// `; `frugal plan ...` replays ...` for the on-demand training with the most to save
    /// on spot: its workload, instance type and hours of work, the deadline half as long
    /// again.
    fn spot_plan_command(&self) -> String {
        let Some((&(workload, instance, region), &(_, ms))) = self
            .spot
            .runs
            .iter()
            .max_by_key(|((w, i, r), (saving, _))| (*saving, *w, *i, *r))
        else {
            return String::new();
        };
        let work = (ms.max(0) as u64).div_ceil(HOUR_MS as u64).max(1);
        let names = self.names;
        let region = (region != 0).then(|| names.get(region));
        format!(
            "; `{} --work {work}h --deadline {}h` replays a run as long on a real preemption trace",
            reserve::plan_command(
                names.get(workload),
                names.get(instance),
                region,
                self.window
            ),
            work + work.div_ceil(2)
        )
    }

    fn series(&self) -> Series {
        let (first, last) = (self.all.first_ms, self.all.last_ms.max(self.all.first_ms));
        if self.all.events == 0 && self.hourly.is_empty() {
            return Series {
                start_ms: 0,
                bucket_ms: HOUR_MS,
                buckets: 0,
                lines: Vec::new(),
            };
        }
        let bucket_ms = bucket_size(last - first);
        let first_hour = self.hourly.keys().map(|(h, _)| *h).min().unwrap_or(first);
        let origin = first_hour - first_hour.rem_euclid(bucket_ms);
        let last_hour = self.hourly.keys().map(|(h, _)| *h).max().unwrap_or(first);
        let buckets = ((last_hour - origin) / bucket_ms + 1) as usize;
        let mut ranked: Vec<(u32, Money)> =
            self.workload_cost.iter().map(|(w, c)| (*w, *c)).collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let slot: HashMap<u32, usize> = ranked
            .iter()
            .enumerate()
            .map(|(i, (w, _))| (*w, i.min(SERIES_WORKLOADS)))
            .collect();
        let mut lines: Vec<(String, Vec<f64>)> = ranked
            .iter()
            .take(SERIES_WORKLOADS)
            .map(|(w, _)| (self.names.get(*w).to_owned(), vec![0.0; buckets]))
            .collect();
        if ranked.len() > SERIES_WORKLOADS {
            lines.push(("other".to_owned(), vec![0.0; buckets]));
        }
        for ((hour, workload), cost) in &self.hourly {
            let i = ((hour - origin) / bucket_ms) as usize;
            if let Some(line) = slot.get(workload).and_then(|&s| lines.get_mut(s)) {
                line.1[i.min(buckets - 1)] += cost.as_f64();
            }
        }
        Series {
            start_ms: origin,
            bucket_ms,
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
        action:
            "send requests to the cheapest model first and escalate only low-confidence answers"
                .into(),
    })
}

fn dominant(areas: &[Area], top: &[Item], total: Money) -> Option<String> {
    let first = areas.first().filter(|a| a.cost > Money::ZERO)?;
    let mut s = format!(
        "{} is {} of the {} spent",
        first.area,
        pct(first.share),
        total
    );
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
