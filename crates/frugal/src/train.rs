//! `frugal train -- CMD`: the supervisor, priced into the ledger.

use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use frugal_cost::event::{Capacity, Event, Kind, Outcome};
use frugal_cost::money::HourlyRate;
use frugal_cost::{Catalog, Money};
use frugal_train::notice::{AnySource, Aws, Azure, Bases, Gcp, NoticeSource, detect};
use frugal_train::store::CheckpointStore;
use frugal_train::supervisor::{Ending, Plan, Segment, supervise};
use sha2::{Digest, Sha256};

use crate::cli::{NoticeArg, TrainArgs};
use crate::config::Config;
use crate::table;

/// The exit code of a run stopped with its progress saved: run the same command to resume.
pub const EXIT_RESUMABLE: u8 = 75;

/// A run stopped by a signal, progress saved; `main` exits with [`EXIT_RESUMABLE`].
#[derive(Debug, thiserror::Error)]
#[error(
    "run {run} stopped with its progress saved (checkpoint {checkpoint}): run the same command to resume"
)]
pub struct Stopped {
    run: String,
    checkpoint: String,
}

/// What the run's capacity costs an hour, and what it would cost on demand.
struct Pricing {
    capacity: Capacity,
    rate: HourlyRate,
    on_demand: Option<HourlyRate>,
    instance_type: Option<String>,
    region: Option<String>,
}

pub fn run(config: &Config, catalog: &Catalog, args: &TrainArgs) -> Result<()> {
    let pricing = pricing(catalog, args)?;
    let run_id = args.run.clone().unwrap_or_else(|| default_run_id(args));
    let work = std::path::Path::new(".frugal").join(&run_id);
    let checkpoint_dir = args
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| work.join("checkpoints"));
    let store_url = match &args.store {
        Some(url) => url.clone(),
        None => config
            .ledger
            .parent()
            .map(|d| d.join("checkpoints"))
            .context("no place for the default checkpoint store: give --store")?
            .display()
            .to_string(),
    };
    let store = CheckpointStore::open(&store_url, &run_id)?;
    let plan = Plan {
        command: args.command.clone(),
        run_id: run_id.clone(),
        checkpoint_dir: std::path::absolute(&checkpoint_dir)?,
        metrics: std::path::absolute(work.join("metrics.jsonl"))?,
        checkpoint_signal: parse_signal(&args.checkpoint_signal)?,
        stop_grace: seconds("--stop-grace", args.stop_grace)?,
        term_deadline: seconds("--signal-deadline", args.signal_deadline)?,
        poll: seconds("--poll", args.poll)?,
        max_restarts: args.max_restarts,
        backoff: seconds("--backoff", args.backoff)?,
        max_backoff: Duration::from_secs(300),
        keep: args.keep.max(1),
        store_wait: seconds("--store-wait", args.store_wait)?,
        gpu: !args.no_gpu,
    };
    if let Some(dir) = config.ledger.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the ledger's folder {}", dir.display()))?;
    }
    let mut ledger = frugal_cost::Ledger::open(&config.ledger)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let summary = runtime.block_on(async {
        let source = notice_source(args).await?;
        let record = |s: &Segment| {
            ledger
                .append("frugal train", &[event(&run_id, &pricing, s)])
                .map(|_| ())
                .map_err(|e| format!("{e:#}"))
        };
        anyhow::Ok(supervise(&plan, store, source, record).await?)
    })?;

    let mut out = std::io::stdout().lock();
    print_summary(&mut out, &run_id, &pricing, &summary.segments)?;
    match summary.ending {
        Ending::Completed => Ok(()),
        Ending::Stopped => Err(Stopped {
            run: run_id,
            checkpoint: summary
                .stored
                .map_or_else(|| "none".into(), |s| format!("step {s} in the store")),
        }
        .into()),
    }
}

/// The same command gives the same run id, on any machine.
fn default_run_id(args: &TrainArgs) -> String {
    let mut h = Sha256::new();
    for a in &args.command {
        h.update(a.as_encoded_bytes());
        h.update([0]);
    }
    let digest = h.finalize();
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("run-{hex}")
}

fn seconds(flag: &str, s: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| anyhow::anyhow!("{flag}: `{s}` is not a duration in seconds"))
}

fn parse_signal(name: &str) -> Result<nix::sys::signal::Signal> {
    let upper = name.trim().to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    full.parse().map_err(|_| {
        anyhow::anyhow!("--checkpoint-signal: `{name}` is not a signal name (e.g. SIGUSR1)")
    })
}

fn pricing(catalog: &Catalog, args: &TrainArgs) -> Result<Pricing> {
    let capacity = if args.spot {
        Capacity::Spot
    } else {
        Capacity::OnDemand
    };
    if let Some(text) = &args.price_per_hour {
        let price: Money = text
            .parse()
            .map_err(|e| anyhow::anyhow!("--price-per-hour: {e}"))?;
        if price.is_negative() {
            bail!("--price-per-hour: a price cannot be negative");
        }
        let on_demand = match (&args.instance, capacity) {
            (_, Capacity::OnDemand) => Some(HourlyRate(price)),
            (Some(i), _) => Some(catalog.instance(i, args.region.as_deref())?.on_demand),
            (None, _) => None,
        };
        return Ok(Pricing {
            capacity,
            rate: HourlyRate(price),
            on_demand,
            instance_type: args.instance.clone(),
            region: args.region.clone(),
        });
    }
    let Some(instance) = &args.instance else {
        tracing::warn!(
            "no --instance or --price-per-hour: the run's segments cost $0 in the ledger"
        );
        return Ok(Pricing {
            capacity,
            rate: HourlyRate(Money::ZERO),
            on_demand: None,
            instance_type: None,
            region: args.region.clone(),
        });
    };
    let offer = catalog.instance(instance, args.region.as_deref())?;
    let rate = offer.price(capacity).with_context(|| {
        format!(
            "the catalog has no {capacity} price for {} in {}: give --price-per-hour",
            offer.instance_type, offer.region
        )
    })?;
    Ok(Pricing {
        capacity,
        rate,
        on_demand: Some(offer.on_demand),
        instance_type: Some(offer.instance_type.clone()),
        region: Some(offer.region.clone()),
    })
}

async fn notice_source(args: &TrainArgs) -> Result<Option<AnySource>> {
    let base = |default: &str| {
        args.metadata_url
            .clone()
            .unwrap_or_else(|| default.to_owned())
    };
    let bases = Bases::default();
    let poll = seconds("--poll", args.poll)?;
    let source = match args.notice {
        NoticeArg::None => None,
        NoticeArg::Auto if !args.spot => None,
        NoticeArg::Auto => {
            let bases = Bases {
                aws: base(&bases.aws),
                gcp: base(&bases.gcp),
                azure: base(&bases.azure),
            };
            let found = detect(&bases, Duration::from_secs(1)).await;
            if found.is_none() {
                tracing::warn!(
                    "no cloud metadata endpoint answers: only SIGTERM will announce a preemption"
                );
            }
            found
        }
        NoticeArg::Aws => Some(AnySource::Aws(Aws::new(&base(&bases.aws))?)),
        NoticeArg::Gcp => Some(AnySource::Gcp(Gcp::new(&base(&bases.gcp), poll)?)),
        NoticeArg::Azure => Some(AnySource::Azure(Azure::new(&base(&bases.azure))?)),
    };
    if let Some(s) = &source {
        tracing::info!("watching {} preemption notices", s.cloud());
    }
    Ok(source)
}

fn event(run_id: &str, p: &Pricing, s: &Segment) -> Event {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let duration_ms = ms(s.duration());
    let ts_ms = ms(s.started.duration_since(UNIX_EPOCH).unwrap_or_default());
    let cost = p.rate.cost(duration_ms, 1).unwrap_or(Money::ZERO);
    let mut e = Event::new(ts_ms, Kind::Training, run_id, cost);
    e.duration_ms = duration_ms;
    e.run_id = Some(run_id.to_owned());
    e.instance_type = p.instance_type.clone();
    e.region = p.region.clone();
    e.capacity = Some(p.capacity);
    e.list_cost = p.on_demand.and_then(|r| r.cost(duration_ms, 1));
    e.outcome = Some(s.outcome);
    e.lost_ms = ms(s.lost);
    e.utilization = s.utilization;
    e
}

fn print_summary(
    out: &mut impl Write,
    run_id: &str,
    p: &Pricing,
    segments: &[Segment],
) -> Result<()> {
    let mut t = table::new(&[
        "segment>",
        "ended",
        "steps",
        "resumed from>",
        "checkpoint>",
        "minutes>",
        "lost min>",
        "busy>",
        "cost>",
    ]);
    let mut total = Money::ZERO;
    let mut on_demand = Some(Money::ZERO);
    let mut lost = Duration::ZERO;
    for s in segments {
        let e = event(run_id, p, s);
        total += e.cost;
        on_demand = on_demand.zip(e.list_cost).map(|(a, b)| a + b);
        lost += s.lost;
        let opt = |v: Option<u64>| v.map_or_else(|| "-".into(), |v| v.to_string());
        t.add_row(vec![
            s.attempt.to_string(),
            s.cause.clone(),
            format!("{}..{}", opt(s.first_step), opt(s.last_step)),
            opt(s.resumed_from),
            opt(s.last_checkpoint),
            format!("{:.1}", s.duration().as_secs_f64() / 60.0),
            format!("{:.1}", s.lost.as_secs_f64() / 60.0),
            s.utilization
                .map_or_else(|| "-".into(), |u| format!("{:.0}%", u * 100.0)),
            e.cost.to_string(),
        ]);
    }
    writeln!(out, "Run {run_id}\n{t}")?;
    let preemptions = segments
        .iter()
        .filter(|s| s.outcome == Outcome::Preempted)
        .count();
    write!(
        out,
        "{} segment(s), {preemptions} preemption(s), {:.1} minutes lost; cost {total} ({})",
        segments.len(),
        lost.as_secs_f64() / 60.0,
        p.capacity
    )?;
    match on_demand {
        Some(od) if p.capacity != Capacity::OnDemand => {
            writeln!(out, ", {od} on demand (saved {})", od - total)?;
        }
        _ => writeln!(out)?,
    }
    for d in segments.iter().flat_map(|s| &s.diagnoses) {
        writeln!(out, "watchdog: {d}")?;
    }
    Ok(())
}
