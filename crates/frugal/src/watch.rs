//! `frugal watch`: the `[[watch.target]]` servers scraped every `--interval` (or once),
//! each interval billed into the ledger, and a line per target printed. The reading and
//! billing are `frugal_watch`'s.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use frugal_cost::Catalog;
use frugal_cost::event::Capacity;
use frugal_watch::watch::{Outcome, Scraper, State, Target};
use frugal_watch::{Kind, TargetMeta};

use crate::cli::WatchArgs;
use crate::config::Config;
use crate::serve::machine_rate;

pub fn run(config: &Config, catalog: &Catalog, args: &WatchArgs) -> Result<()> {
    let targets = targets(config, catalog)?;
    let mut ledger = crate::commands::open_for_write(config)?;
    // Beside the ledger: the last snapshot of each target, for the next scrape.
    let state_path = config.ledger.with_extension("watch.json");
    let mut state = State::load(&state_path)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let scraper = Scraper::default();
    let mut out = std::io::stdout().lock();
    loop {
        let bodies = runtime.block_on(scraper.fetch_all(&targets, args.timeout));
        let at_ms = i64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis(),
        )
        .unwrap_or(0);
        for (target, body) in targets.iter().zip(bodies) {
            let line = match state.observe(target, body, at_ms) {
                Outcome::Baseline(r) => format!(
                    "{}: first reading ({}); billing starts with the next",
                    target.meta.name,
                    r.kind.as_str()
                ),
                Outcome::Gap(why) => format!("{}: a gap, not billed: {why}", target.meta.name),
                Outcome::Billed { interval, events } => {
                    ledger.append("frugal watch", &events)?;
                    let cost: frugal_cost::Money = events.iter().map(|e| e.cost).sum();
                    let idle: frugal_cost::Money = events
                        .iter()
                        .filter(|e| e.kind == frugal_cost::event::Kind::Idle)
                        .map(|e| e.cost)
                        .sum();
                    let per = |n: u64, unit: f64| {
                        if n == 0 {
                            "-".to_owned()
                        } else {
                            format!("${:.4}", cost.as_f64() * unit / n as f64)
                        }
                    };
                    format!(
                        "{}: {:.1} req/s, {:.0} tok/s in, {:.0} out, busy {}, ${:.2}/h, {}/1k req, \
                         {}/1M tok, idle ${:.4}{}",
                        target.meta.name,
                        interval.requests as f64 / interval.seconds,
                        interval.input_tokens as f64 / interval.seconds,
                        interval.output_tokens as f64 / interval.seconds,
                        interval
                            .busy_share
                            .map_or_else(|| "-".into(), |b| format!("{:.0}%", b * 100.0)),
                        target.rate.0.as_f64(),
                        per(interval.requests, 1e3),
                        per(interval.input_tokens + interval.output_tokens, 1e6),
                        idle.as_f64(),
                        if interval.reset { " (restarted)" } else { "" }
                    )
                }
            };
            writeln!(out, "{line}")?;
        }
        state.save(&state_path)?;
        if args.once {
            return Ok(());
        }
        std::thread::sleep(args.interval.max(Duration::from_secs(1)));
    }
}

/// The configured targets, priced and checked: names are unique, kinds known.
fn targets(config: &Config, catalog: &Catalog) -> Result<Vec<Target>> {
    if config.watch.target.is_empty() {
        bail!("no [[watch.target]] in the config: name the servers to watch (README.md)");
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
                url: t.url.clone(),
                kind,
                rate,
            })
        })
        .collect()
}
