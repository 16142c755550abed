//! `frugal watch`: the `[[watch.target]]` servers scraped, and the `[[watch.prometheus]]`
//! fleets queried, every `--interval` (or once); each interval billed into the ledger, and
//! a line per server printed. The reading and billing are `frugal_watch`'s.

use std::collections::{BTreeSet, HashMap};
use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use frugal_cost::event::{Capacity, Event, Kind as EventKind};
use frugal_cost::money::HourlyRate;
use frugal_cost::{Catalog, Money};
use frugal_watch::prom_api::{Group, groups, query};
use frugal_watch::watch::{Outcome, Scraper, State, Target, scrape_of};
use frugal_watch::{Interval, Kind, TargetMeta};

use crate::cli::WatchArgs;
use crate::config::{Config, RawPrometheus};
use crate::serve::machine_rate;
use crate::table;

pub fn run(config: &Config, catalog: &Catalog, args: &WatchArgs) -> Result<()> {
    let fixed = targets(config, catalog)?;
    let sources = sources(config, catalog, &fixed)?;
    let mut ledger = config.open_ledger()?;
    // Beside the ledger: the last snapshot of each target, for the next scrape.
    let state_path = match config.ledger.path() {
        Some(path) => path.with_extension("watch.json"),
        None => config.beside_ledger().join("ledger.watch.json"),
    };
    let mut state = State::load(&state_path)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let scraper = Scraper::default();
    let mut prices = Prices::default();
    let mut idle_so_far: HashMap<String, Money> = HashMap::new();
    let live = !args.once && std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    loop {
        let queries: Vec<(&str, &str)> = sources
            .iter()
            .map(|s| (s.raw.url.as_str(), s.promql.as_str()))
            .collect();
        let (bodies, answers) = runtime.block_on(async {
            tokio::join!(
                scraper.fetch_all(&fixed, args.timeout),
                scraper.query_all(&queries, args.timeout)
            )
        });
        let at_ms = i64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis(),
        )
        .unwrap_or(0);
        let mut targets = fixed.clone();
        let mut scrapes: Vec<_> = bodies.into_iter().map(scrape_of).collect();
        let mut lines = Vec::new();
        for (source, answer) in sources.iter().zip(answers) {
            let found = answer.and_then(|json: String| groups(&json, source.group_by()));
            let present: BTreeSet<String> = match found {
                Ok(groups) => {
                    let mut names = BTreeSet::new();
                    for g in groups {
                        let target = source.target(&g, catalog, &mut prices)?;
                        names.insert(target.meta.name.clone());
                        targets.push(target);
                        scrapes.push(Ok(g.scrape));
                    }
                    names
                }
                Err(why) => {
                    lines.push(Row::note(
                        &source.raw.name,
                        format!("every server a gap, not billed: {why}"),
                    ));
                    BTreeSet::new()
                }
            };
            // Servers gone from the answer: their last reading must not reach across the
            // time they were away.
            let prefix = format!("{}/", source.raw.name);
            let gone: Vec<String> = state
                .last
                .keys()
                .filter(|k| k.starts_with(&prefix) && !present.contains(*k))
                .cloned()
                .collect();
            for name in gone {
                state.last.remove(&name);
                let why = "a gap, not billed: not in Prometheus's answer";
                lines.push(Row::note(&name, why.to_owned()));
            }
        }
        let outcomes = state.observe_all(&targets, scrapes, at_ms);
        let (mut events, mut spans) = (Vec::new(), Vec::new());
        for (target, outcome) in targets.iter().zip(outcomes) {
            let name = &target.meta.name;
            lines.push(match outcome {
                Outcome::Baseline(r) => Row::note(
                    name,
                    format!(
                        "first reading ({}): billing starts with the next",
                        r.kind.as_str()
                    ),
                ),
                Outcome::Gap(why) => Row::note(name, format!("a gap, not billed: {why}")),
                Outcome::Joined(servers) => Row::note(
                    name,
                    format!("GPUs of {}: DCGM, billed with them", servers.join(", ")),
                ),
                Outcome::Billed { interval, bill } => {
                    let idle: Money = bill
                        .events
                        .iter()
                        .filter(|e| e.kind == EventKind::Idle)
                        .map(|e| e.cost)
                        .sum();
                    let so_far = idle_so_far.entry(name.clone()).or_default();
                    *so_far += idle;
                    let row = Row::billed(target, &interval, &bill.events, *so_far);
                    events.extend(bill.events);
                    spans.push(bill.span);
                    row
                }
            });
        }
        // Every target's interval in one transaction: a crash leaves all or none.
        ledger.append_with_spans("frugal watch", &events, &spans)?;
        print_pass(&mut out, &lines, live.then_some(args.interval))?;
        state.save(&state_path)?;
        if args.once {
            return Ok(());
        }
        std::thread::sleep(args.interval.max(Duration::from_secs(1)));
    }
}

/// Hourly rates by instance type, looked up once.
#[derive(Default)]
struct Prices(HashMap<String, (HourlyRate, Option<String>)>);

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

    /// The target one group of the answer stands for: named, priced and placed.
    fn target(&self, g: &Group, catalog: &Catalog, prices: &mut Prices) -> Result<Target> {
        let raw = &self.raw;
        let label = |name: &Option<String>| {
            name.as_deref()
                .and_then(|l| g.labels.get(l))
                .map(String::as_str)
        };
        let (rate, instance_type) = match label(&raw.instance_label) {
            Some(instance) => match prices.0.get(instance) {
                Some(found) => found.clone(),
                None => {
                    let found =
                        machine_rate(catalog, None, Some(instance), None).with_context(|| {
                            format!("[[watch.prometheus]] `{}`: {}", raw.name, g.key)
                        })?;
                    prices.0.insert(instance.to_owned(), found.clone());
                    found
                }
            },
            None => (self.rate, self.instance_type.clone()),
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
            url: format!("{} ({}=\"{}\")", raw.url, self.group_by(), g.key),
            kind: None,
            rate,
            host: label(&raw.host_label).map_or_else(|| Target::url_host(&g.key), str::to_owned),
        })
    }
}

/// The `[[watch.prometheus]]` sources, checked: names unique among every target's.
fn sources(config: &Config, catalog: &Catalog, fixed: &[Target]) -> Result<Vec<Source>> {
    let mut names: BTreeSet<&str> = fixed.iter().map(|t| t.meta.name.as_str()).collect();
    config
        .watch
        .prometheus
        .iter()
        .map(|raw| {
            if !names.insert(raw.name.as_str()) {
                bail!("two watch entries are named `{}`", raw.name);
            }
            if raw.instance.is_some() && raw.instance_label.is_some() {
                bail!(
                    "[[watch.prometheus]] `{}`: give instance or instance_label, not both",
                    raw.name
                );
            }
            let (rate, instance_type) = machine_rate(
                catalog,
                raw.price_per_hour.as_deref(),
                raw.instance.as_deref(),
                None,
            )
            .with_context(|| format!("[[watch.prometheus]] `{}`", raw.name))?;
            Ok(Source {
                promql: query(raw.selector.as_deref()),
                raw: raw.clone(),
                rate,
                instance_type: instance_type.or_else(|| raw.instance.clone()),
            })
        })
        .collect()
}

/// A pass's rows: on a terminal (`live`, with the interval), one table redrawn in place,
/// with why a server is a gap under it; elsewhere a line each, for logs and cron.
fn print_pass(out: &mut impl Write, rows: &[Row], live: Option<Duration>) -> Result<()> {
    let Some(interval) = live else {
        for row in rows {
            writeln!(out, "{}", row.line())?;
        }
        return Ok(());
    };
    let mut t = table::new(&[
        "server",
        "req/s>",
        "tok/s in>",
        "tok/s out>",
        "busy>",
        "$/h>",
        "$/1k req>",
        "$/1M tok>",
        "idle so far>",
        "",
    ]);
    // The table keeps a note's gist; why a server is a gap goes under it, whole.
    let mut details = Vec::new();
    for row in rows {
        let mut cells = vec![row.name.clone()];
        cells.extend(
            row.figures
                .clone()
                .unwrap_or_else(|| vec![String::new(); 8]),
        );
        let (gist, detail) = row.note.split_once(": ").unwrap_or((&row.note, ""));
        cells.push(gist.to_owned());
        t.add_row(cells);
        if !detail.is_empty() {
            details.push(format!("{}: {detail}", row.name));
        }
    }
    write!(out, "\x1b[2J\x1b[H")?;
    let every = humantime::format_duration(interval);
    writeln!(out, "frugal watch, every {every}\n{t}")?;
    for detail in details {
        writeln!(out, "{detail}")?;
    }
    Ok(())
}

/// One server in a pass: its figures where it was billed, and a note.
struct Row {
    name: String,
    /// req/s, tok/s in and out, busy, $/h, $/1k req, $/1M tok, idle so far.
    figures: Option<Vec<String>>,
    note: String,
}

impl Row {
    fn note(name: &str, note: String) -> Row {
        Row {
            name: name.to_owned(),
            figures: None,
            note,
        }
    }

    fn billed(target: &Target, interval: &Interval, events: &[Event], idle_so_far: Money) -> Row {
        let cost: Money = events.iter().map(|e| e.cost).sum();
        let per = |n: u64, unit: f64| {
            if n == 0 {
                "-".to_owned()
            } else {
                format!("${:.4}", cost.as_f64() * unit / n as f64)
            }
        };
        let rate = |n: u64| format!("{:.1}", n as f64 / interval.seconds);
        let counted = |text: String| {
            if interval.counts_requests {
                text
            } else {
                "-".to_owned()
            }
        };
        Row {
            name: target.meta.name.clone(),
            figures: Some(vec![
                counted(rate(interval.requests)),
                rate(interval.input_tokens),
                rate(interval.output_tokens),
                interval
                    .busy_share
                    .map_or_else(|| "-".into(), |b| format!("{:.0}%", b * 100.0)),
                format!("${:.2}", target.rate.0.as_f64()),
                counted(per(interval.requests, 1e3)),
                per(interval.input_tokens + interval.output_tokens, 1e6),
                format!("${:.4}", idle_so_far.as_f64()),
            ]),
            note: if interval.reset { "restarted" } else { "" }.to_owned(),
        }
    }

    /// The row as a line, for logs and cron.
    fn line(&self) -> String {
        let Some(f) = &self.figures else {
            return format!("{}: {}", self.name, self.note);
        };
        let note = if self.note.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.note)
        };
        format!(
            "{}: {} req/s, {} tok/s in, {} out, busy {}, {}/h, {}/1k req, {}/1M tok, idle {} so far{note}",
            self.name, f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]
        )
    }
}

/// The configured targets, priced and checked: names are unique, kinds known.
fn targets(config: &Config, catalog: &Catalog) -> Result<Vec<Target>> {
    if config.watch.target.is_empty() && config.watch.prometheus.is_empty() {
        bail!(
            "no [[watch.target]] or [[watch.prometheus]] in the config: name the servers to watch (README.md)"
        );
    }
    let mut names = BTreeSet::new();
    config
        .watch
        .target
        .iter()
        .map(|t| {
            if !names.insert(t.name.as_str()) {
                bail!("two [[watch.target]]s are named `{}`", t.name);
            }
            let kind = match t.kind.as_deref().unwrap_or("auto") {
                "auto" => None,
                "vllm" => Some(Kind::Vllm),
                "tgi" => Some(Kind::Tgi),
                "llamacpp" => Some(Kind::Llamacpp),
                "frugal" => Some(Kind::Frugal),
                "dcgm" => Some(Kind::Dcgm),
                other => bail!(
                    "[[watch.target]] `{}`: kind `{other}` is none of auto, vllm, tgi, llamacpp, frugal, dcgm",
                    t.name
                ),
            };
            let (rate, instance_type) =
                machine_rate(catalog, t.price_per_hour.as_deref(), t.instance.as_deref(), None)
                    .with_context(|| format!("[[watch.target]] `{}`", t.name))?;
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
