//! The fleet `frugal watch` reads, as `frugal.toml` names it: `[[watch.target]]` servers
//! scraped and `[[watch.prometheus]]` fleets queried, each priced once and checked; and one
//! pass over them all, from answers to ledger rows and a line per server.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use frugal_cost::Money;
use frugal_cost::event::{Capacity, Event, Kind as EventKind, ReplicaSpan};
use frugal_cost::money::{HourlyRate, Millis};
use serde::Deserialize;

use crate::interval::{Interval, TargetMeta};
use crate::prom_api::{Group, groups, query};
use crate::reading::Kind;
use crate::watch::{Outcome, Scraper, State, Target, scrape_of};

/// `[watch]`: the servers `frugal watch` reads.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWatch {
    /// `[[watch.target]]`: servers whose `/metrics` are scraped.
    #[serde(default)]
    pub target: Vec<RawTarget>,
    /// `[[watch.prometheus]]`: fleets read through a Prometheus server's API.
    #[serde(default)]
    pub prometheus: Vec<RawPrometheus>,
}

/// A Prometheus server whose series stand for many servers, one per `group_by` value.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrometheus {
    /// Its servers are named `<name>/<group_by value>`.
    pub name: String,
    /// The server's base URL (`http://prometheus:9090`).
    pub url: String,
    /// Matchers narrowing the series (`{job=~"vllm.*"}`).
    pub selector: Option<String>,
    /// The label that tells servers apart [default: instance].
    pub group_by: Option<String>,
    /// A label naming each server's machine, to join DCGM series to it [default: the
    /// host of the `group_by` value].
    pub host_label: Option<String>,
    /// A label holding each server's instance type, priced by the catalog.
    pub instance_label: Option<String>,
    pub instance: Option<String>,
    pub region: Option<String>,
    pub price_per_hour: Option<String>,
    /// [default: the servers' `job` label, else the name]
    pub workload: Option<String>,
    pub model: Option<String>,
}

/// A server scraped at its `/metrics` URL.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTarget {
    pub name: String,
    /// Its Prometheus `/metrics` URL.
    pub url: String,
    /// `auto` (the default), `vllm`, `tgi`, `llamacpp`, `frugal` or `dcgm`.
    pub kind: Option<String>,
    pub instance: Option<String>,
    pub region: Option<String>,
    pub price_per_hour: Option<String>,
    /// [default: the name]
    pub workload: Option<String>,
    /// When the server does not say.
    pub model: Option<String>,
    /// The machine's name where the URL does not give it (a proxy, a service name): a DCGM
    /// exporter on this host, or labelling its GPUs `Hostname` = this, is joined to it.
    pub host: Option<String>,
}

/// Why the fleet cannot be read as configured.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("{0}")]
    Invalid(String),
    /// A price that cannot be resolved: `what` names the entry.
    #[error("{what}")]
    Price {
        what: String,
        #[source]
        source: PriceError,
    },
}

/// Why a price could not be resolved, from the caller's resolution.
pub type PriceError = Box<dyn std::error::Error + Send + Sync>;

/// What a server's machine costs an hour, and its instance type, from a price per hour or an
/// instance type (`price_per_hour`, `instance`): the caller's resolution through its catalog.
pub type Price<'a> =
    dyn Fn(Option<&str>, Option<&str>) -> Result<(HourlyRate, Option<String>), PriceError> + 'a;

/// A `[[watch.prometheus]]` source, checked, with its query.
struct Source {
    raw: RawPrometheus,
    promql: String,
    /// The rate of a server whose instance type no label gives.
    rate: HourlyRate,
    instance_type: Option<String>,
}

impl Source {
    fn group_by(&self) -> &str {
        self.raw.group_by.as_deref().unwrap_or("instance")
    }
}

/// One server in a pass.
#[derive(Debug, Clone)]
pub enum Line {
    /// Not billed this pass, and why (a first reading, a gap, GPUs joined to servers);
    /// `gap` when it could not be read or trusted (a target down, slow or garbled, a
    /// restart across engines, a Prometheus that failed): `frugal watch --once` exits
    /// non-zero on those. A server gone from a fleet's answer (scaled in) is not one.
    Note {
        name: String,
        note: String,
        gap: bool,
    },
    /// Billed: the interval, its cost, the machine's rate and the idle cost since the watch
    /// started.
    Billed {
        name: String,
        interval: Interval,
        cost: Money,
        rate: HourlyRate,
        idle_so_far: Money,
    },
}

impl Line {
    fn note(name: &str, note: String) -> Line {
        Line::Note {
            name: name.to_owned(),
            note,
            gap: false,
        }
    }

    fn gap(name: &str, note: String) -> Line {
        Line::Note {
            name: name.to_owned(),
            note,
            gap: true,
        }
    }
}

/// What one pass read: a line per server, and the ledger rows of every billed interval
/// (written in one transaction, so a crash leaves all or none).
#[derive(Debug, Default)]
pub struct Pass {
    pub lines: Vec<Line>,
    pub events: Vec<Event>,
    pub spans: Vec<ReplicaSpan>,
}

impl Pass {
    /// The servers (or fleets) that were a gap this pass.
    pub fn gaps(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter_map(|l| match l {
                Line::Note {
                    name, gap: true, ..
                } => Some(name.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// The configured servers, priced and checked, and what they have idled so far.
pub struct Fleet<'a> {
    fixed: Vec<Target>,
    sources: Vec<Source>,
    price: &'a Price<'a>,
    /// Rates by instance type, resolved once.
    prices: HashMap<String, (HourlyRate, Option<String>)>,
    idle_so_far: HashMap<String, Money>,
}

impl<'a> Fleet<'a> {
    /// The fleet `raw` names, each price resolved by `price`: names unique, kinds known.
    pub fn new(raw: &RawWatch, price: &'a Price<'a>) -> Result<Fleet<'a>, FleetError> {
        if raw.target.is_empty() && raw.prometheus.is_empty() {
            return Err(FleetError::Invalid(
                "no [[watch.target]] or [[watch.prometheus]] in the config: name the servers to watch (README.md)".into(),
            ));
        }
        let fixed = targets(&raw.target, price)?;
        let sources = sources(&raw.prometheus, &fixed, price)?;
        Ok(Fleet {
            fixed,
            sources,
            price,
            prices: HashMap::new(),
            idle_so_far: HashMap::new(),
        })
    }

    /// Scrapes every target and queries every Prometheus source at once, then reads the
    /// answers against `state` at `at_ms` into a pass.
    pub async fn read(
        &mut self,
        scraper: &Scraper,
        timeout: Duration,
        state: &mut State,
        at_ms: impl FnOnce() -> Millis,
    ) -> Result<Pass, FleetError> {
        let queries: Vec<(&str, &str)> = self
            .sources
            .iter()
            .map(|s| (s.raw.url.as_str(), s.promql.as_str()))
            .collect();
        let (bodies, answers) = futures_util::join!(
            scraper.fetch_all(&self.fixed, timeout),
            scraper.query_all(&queries, timeout)
        );
        self.pass(bodies, answers, state, at_ms())
    }

    fn pass(
        &mut self,
        bodies: Vec<Result<String, String>>,
        answers: Vec<Result<String, String>>,
        state: &mut State,
        at_ms: Millis,
    ) -> Result<Pass, FleetError> {
        let mut targets = self.fixed.clone();
        let mut scrapes: Vec<_> = bodies.into_iter().map(scrape_of).collect();
        let mut pass = Pass::default();
        for (i, answer) in answers.into_iter().enumerate() {
            let source = &self.sources[i];
            let found = answer.and_then(|json| groups(&json, source.group_by()));
            let name = source.raw.name.clone();
            let present: BTreeSet<String> = match found {
                Ok(groups) => {
                    let mut names = BTreeSet::new();
                    for g in groups {
                        let target = self.group_target(i, &g)?;
                        names.insert(target.meta.name.clone());
                        targets.push(target);
                        scrapes.push(Ok(g.scrape));
                    }
                    names
                }
                Err(why) => {
                    let note = format!("every server a gap, not billed: {why}");
                    pass.lines.push(Line::gap(&name, note));
                    BTreeSet::new()
                }
            };
            // Servers gone from the answer: their last reading must not reach across the
            // time they were away.
            let prefix = format!("{name}/");
            let gone: Vec<String> = state
                .last
                .keys()
                .filter(|k| k.starts_with(&prefix) && !present.contains(*k))
                .cloned()
                .collect();
            for name in gone {
                state.last.remove(&name);
                let why = "a gap, not billed: not in Prometheus's answer";
                pass.lines.push(Line::note(&name, why.to_owned()));
            }
        }
        let outcomes = state.observe_all(&targets, scrapes, at_ms);
        for (target, outcome) in targets.iter().zip(outcomes) {
            let name = &target.meta.name;
            pass.lines.push(match outcome {
                Outcome::Baseline(r) => Line::note(
                    name,
                    format!(
                        "first reading ({}): billing starts with the next",
                        r.kind.as_str()
                    ),
                ),
                Outcome::Gap(why) => Line::gap(name, format!("a gap, not billed: {why}")),
                Outcome::Joined(servers) => Line::note(
                    name,
                    format!("GPUs of {}: DCGM, billed with them", servers.join(", ")),
                ),
                Outcome::Billed { interval, bill } => {
                    let cost: Money = bill.events.iter().map(|e| e.cost).sum();
                    let idle: Money = bill
                        .events
                        .iter()
                        .filter(|e| e.kind == EventKind::Idle)
                        .map(|e| e.cost)
                        .sum();
                    let so_far = self.idle_so_far.entry(name.clone()).or_default();
                    *so_far += idle;
                    pass.events.extend(bill.events);
                    pass.spans.push(bill.span);
                    Line::Billed {
                        name: name.clone(),
                        interval,
                        cost,
                        rate: target.rate,
                        idle_so_far: *so_far,
                    }
                }
            });
        }
        Ok(pass)
    }

    /// The target one group of source `i`'s answer stands for: named, priced and placed.
    fn group_target(&mut self, i: usize, g: &Group) -> Result<Target, FleetError> {
        let source = &self.sources[i];
        let raw = &source.raw;
        let label = |name: &Option<String>| {
            name.as_deref()
                .and_then(|l| g.labels.get(l))
                .map(String::as_str)
        };
        let (rate, instance_type) = match label(&raw.instance_label) {
            Some(instance) => match self.prices.get(instance) {
                Some(found) => found.clone(),
                None => {
                    let found =
                        (self.price)(None, Some(instance)).map_err(|source| FleetError::Price {
                            what: format!("[[watch.prometheus]] `{}`: {}", raw.name, g.key),
                            source,
                        })?;
                    self.prices.insert(instance.to_owned(), found.clone());
                    found
                }
            },
            None => (source.rate, source.instance_type.clone()),
        };
        let workload = raw
            .workload
            .clone()
            .or_else(|| g.labels.get("job").cloned())
            .unwrap_or_else(|| raw.name.clone());
        Ok(Target {
            meta: TargetMeta {
                name: format!("{}/{}", raw.name, g.key),
                workload,
                model: raw.model.clone(),
                instance_type,
                region: raw.region.clone(),
                capacity: Some(Capacity::OnDemand),
            },
            url: format!("{} ({}=\"{}\")", raw.url, source.group_by(), g.key),
            kind: None,
            rate,
            host: label(&raw.host_label).map_or_else(|| Target::url_host(&g.key), str::to_owned),
        })
    }
}

/// `price` for the entry `what` names, its failure said with that name.
fn priced(
    price: &Price,
    what: impl FnOnce() -> String,
    price_per_hour: Option<&str>,
    instance: Option<&str>,
) -> Result<(HourlyRate, Option<String>), FleetError> {
    price(price_per_hour, instance).map_err(|source| FleetError::Price {
        what: what(),
        source,
    })
}

/// The `[[watch.target]]`s, priced and checked: names are unique, kinds known.
fn targets(raw: &[RawTarget], price: &Price) -> Result<Vec<Target>, FleetError> {
    let mut names = BTreeSet::new();
    raw.iter()
        .map(|t| {
            let invalid = |why: String| FleetError::Invalid(why);
            if !names.insert(t.name.as_str()) {
                return Err(invalid(format!("two [[watch.target]]s are named `{}`", t.name)));
            }
            let kind = match t.kind.as_deref().unwrap_or("auto") {
                "auto" => None,
                "vllm" => Some(Kind::Vllm),
                "tgi" => Some(Kind::Tgi),
                "llamacpp" => Some(Kind::Llamacpp),
                "frugal" => Some(Kind::Frugal),
                "dcgm" => Some(Kind::Dcgm),
                other => {
                    return Err(invalid(format!(
                        "[[watch.target]] `{}`: kind `{other}` is none of auto, vllm, tgi, llamacpp, frugal, dcgm",
                        t.name
                    )));
                }
            };
            let (rate, instance_type) = priced(
                price,
                || format!("[[watch.target]] `{}`", t.name),
                t.price_per_hour.as_deref(),
                t.instance.as_deref(),
            )?;
            if t.price_per_hour.is_none() && t.instance.is_none() {
                tracing::warn!(
                    "[[watch.target]] `{}` has no instance or price_per_hour: its time costs $0",
                    t.name
                );
            }
            Ok(Target {
                meta: TargetMeta {
                    name: t.name.clone(),
                    workload: t.workload.clone().unwrap_or_else(|| t.name.clone()),
                    model: t.model.clone(),
                    instance_type: instance_type.or_else(|| t.instance.clone()),
                    region: t.region.clone(),
                    capacity: Some(Capacity::OnDemand),
                },
                host: t.host.clone().unwrap_or_else(|| Target::url_host(&t.url)),
                url: t.url.clone(),
                kind,
                rate,
            })
        })
        .collect()
}

/// The `[[watch.prometheus]]` sources, checked: names unique among every target's.
fn sources(
    raw: &[RawPrometheus],
    fixed: &[Target],
    price: &Price,
) -> Result<Vec<Source>, FleetError> {
    let mut names: BTreeSet<&str> = fixed.iter().map(|t| t.meta.name.as_str()).collect();
    raw.iter()
        .map(|raw| {
            if !names.insert(raw.name.as_str()) {
                return Err(FleetError::Invalid(format!(
                    "two watch entries are named `{}`",
                    raw.name
                )));
            }
            if raw.instance.is_some() && raw.instance_label.is_some() {
                return Err(FleetError::Invalid(format!(
                    "[[watch.prometheus]] `{}`: give instance or instance_label, not both",
                    raw.name
                )));
            }
            let (rate, instance_type) = priced(
                price,
                || format!("[[watch.prometheus]] `{}`", raw.name),
                raw.price_per_hour.as_deref(),
                raw.instance.as_deref(),
            )?;
            Ok(Source {
                promql: query(raw.selector.as_deref()),
                raw: raw.clone(),
                rate,
                instance_type: instance_type.or_else(|| raw.instance.clone()),
            })
        })
        .collect()
}
