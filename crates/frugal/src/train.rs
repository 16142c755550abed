//! `frugal train -- CMD`: the flags into a plan and a pricing, the supervisor run, and its
//! summary printed. The machine's price and its notices are `frugal_cloud`'s.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use frugal_cloud::notice::Bases;
use frugal_cloud::notice::{AnySource, Choice, choose};
use frugal_cloud::price::{self, Pricing, Request, ThisMachine};
use frugal_cloud::store::CheckpointStore;
use frugal_cost::present::usd;
use frugal_cost::{Capacity, Catalog, Money};
use frugal_train::cost::RunCost;
use frugal_train::orphan;
use frugal_train::supervisor::{Ending, Plan, Segment, supervise};
use frugal_train::watchdog::Peak;

use crate::cli::{MachineArgs, NoticeArg, SupervisorArgs, TrainArgs};
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

pub fn run(config: &Config, catalog: &Catalog, args: &TrainArgs) -> Result<()> {
    let pricing = machine_pricing("train", catalog, &args.machine)?;
    let run_id = args
        .run
        .clone()
        .unwrap_or_else(|| frugal_train::names::run_id(&args.command));
    let work = std::path::Path::new(".frugal").join(&run_id);
    let checkpoint_dir = args
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| work.join("checkpoints"));
    let store = CheckpointStore::open(&store_url(config, &args.supervisor)?, &run_id)?;
    let plan = Plan {
        command: args.command.clone(),
        run_id: run_id.clone(),
        checkpoint_dir: std::path::absolute(&checkpoint_dir)?,
        metrics: std::path::absolute(work.join("metrics.jsonl"))?,
        peak: machine_peak(catalog, &pricing, &args.supervisor)?,
        max_restarts: args.max_restarts,
        backoff: seconds("--backoff", args.backoff)?,
        ..base_plan(&args.supervisor, &args.machine)?
    };
    let mut ledger = config.open_ledger()?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // A segment a killed `frugal train` left is billed before this one starts.
    let marker = std::path::absolute(work.join("segment"))?;
    let left = orphan::Run {
        id: &run_id,
        metrics: &plan.metrics,
        checkpoint_dir: &plan.checkpoint_dir,
        log: None,
    };
    if let Some(segment) = orphan::settle(&marker, &left) {
        ledger.append("frugal train", &[segment.event(&run_id, &pricing)])?;
        orphan::clear(&marker);
    }
    let summary = runtime.block_on(async {
        let source = notice_source(&args.machine).await?;
        let record = |s: &Segment| {
            ledger
                .append("frugal train", &[s.event(&run_id, &pricing)])
                .map_err(|e| format!("{e:#}"))?;
            orphan::clear(&marker);
            Ok(())
        };
        let mut marking = orphan::Marking(marker.clone());
        anyhow::Ok(supervise(&plan, store, source, record, &mut marking).await?)
    })?;

    let completed = matches!(summary.ending, Ending::Completed);
    if args.json {
        table::print_json(&RunJson::of(
            &run_id,
            &pricing,
            &summary.segments,
            completed,
        ))?;
    } else {
        print_summary(
            &mut std::io::stdout().lock(),
            &run_id,
            &pricing,
            &summary.segments,
        )?;
    }
    match summary.ending {
        Ending::Completed => Ok(()),
        Ending::Stopped | Ending::Paused => Err(Stopped {
            run: run_id,
            checkpoint: summary
                .stored
                .map_or_else(|| "none".into(), |s| format!("step {s} in the store")),
        }
        .into()),
    }
}

/// The machine's peak FLOPS for the watchdog's MFU: `--peak-tflops`, or the catalog's for
/// the instance's accelerators.
pub fn machine_peak(catalog: &Catalog, pricing: &Pricing, args: &SupervisorArgs) -> Result<Peak> {
    Peak::checked(catalog, pricing, args.peak_tflops).map_err(anyhow::Error::msg)
}

/// The checkpoint store: `--store`, or checkpoints/ beside the ledger.
pub fn store_url(config: &Config, args: &SupervisorArgs) -> Result<String> {
    Ok(match &args.store {
        Some(url) => url.clone(),
        None => config
            .beside_ledger()
            .join("checkpoints")
            .display()
            .to_string(),
    })
}

/// The supervisor's settings from the flags; the command, run id and paths are the caller's.
pub fn base_plan(args: &SupervisorArgs, machine: &MachineArgs) -> Result<Plan> {
    Ok(Plan {
        command: Vec::new(),
        run_id: String::new(),
        checkpoint_dir: PathBuf::new(),
        metrics: PathBuf::new(),
        peak: Peak::default(),
        checkpoint_signal: frugal_train::names::signal(&args.checkpoint_signal)
            .map_err(|e| anyhow::anyhow!("--checkpoint-signal: {e}"))?,
        stop_grace: seconds("--stop-grace", args.stop_grace)?,
        term_deadline: seconds("--signal-deadline", args.signal_deadline)?,
        poll: seconds("--poll", machine.poll)?,
        max_restarts: 0,
        backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(300),
        keep: args.keep.max(1),
        store_wait: seconds("--store-wait", args.store_wait)?,
        gpu: !args.no_gpu,
        env: Vec::new(),
        log: None,
    })
}

pub fn seconds(flag: &str, s: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| anyhow::anyhow!("{flag}: `{s}` is not a duration in seconds"))
}

/// A machine's pricing from the flags (spot or on demand, a given price or a catalog
/// instance), else this machine's (asking the cloud's metadata unless `--notice none` says
/// it is on none, then by its size): frugal-cloud resolves it, and `frugal COMMAND` says it
/// on stderr.
pub fn machine_pricing(command: &str, catalog: &Catalog, m: &MachineArgs) -> Result<Pricing> {
    let request = Request {
        capacity: if m.spot {
            Capacity::Spot
        } else {
            Capacity::OnDemand
        },
        price_per_hour: m.price_per_hour.as_deref(),
        price_field: "--price-per-hour",
        instance: m.instance.as_deref(),
        region: m.region.as_deref(),
    };
    let bases = Bases::at(m.metadata_url.as_deref());
    let this_machine = if matches!(m.notice, NoticeArg::None) && m.metadata_url.is_none() {
        ThisMachine::BySize
    } else {
        ThisMachine::Ask(&bases)
    };
    let resolved = price::resolve(catalog, &request, this_machine)?;
    writeln!(std::io::stderr(), "frugal {command}: {}", resolved.said)?;
    Ok(resolved.pricing)
}

/// The notices `--notice` asks to watch.
fn notice_choice(m: &MachineArgs) -> Choice {
    match m.notice {
        NoticeArg::None => Choice::None,
        NoticeArg::Auto => Choice::Auto,
        NoticeArg::Aws => Choice::Aws,
        NoticeArg::Gcp => Choice::Gcp,
        NoticeArg::Azure => Choice::Azure,
    }
}

/// The notices to watch: `--notice`, at `--metadata-url` or the cloud's own
/// ([`choose`]).
pub async fn notice_source(m: &MachineArgs) -> Result<Option<AnySource>> {
    let poll = seconds("--poll", m.poll)?;
    Ok(choose(notice_choice(m), m.spot, m.metadata_url.as_deref(), poll).await?)
}

/// "3.1% fp32": the segment's MFU, and the precision it was measured at.
fn mfu(s: &Segment) -> String {
    let precision = s.precision.map_or(String::new(), |p| format!(" {p}"));
    match s.mfu {
        Some(m) => format!("{:.1}%{precision}", m * 100.0),
        None => "-".into(),
    }
}

/// `frugal train --json`: the run's segments and totals, as the table shows them.
#[derive(serde::Serialize)]
struct RunJson {
    run: String,
    capacity: String,
    completed: bool,
    segments: Vec<SegmentJson>,
    cost: Money,
    /// The same hours on demand, where the run was not on demand and the price is known.
    on_demand: Option<Money>,
    preemptions: usize,
    lost_s: f64,
}

#[derive(serde::Serialize)]
struct SegmentJson {
    attempt: u32,
    ended: String,
    first_step: Option<u64>,
    last_step: Option<u64>,
    resumed_from: Option<u64>,
    checkpoint: Option<u64>,
    duration_s: f64,
    lost_s: f64,
    utilization: Option<f64>,
    mfu: Option<f64>,
    cost: Money,
}

impl RunJson {
    fn of(run_id: &str, p: &Pricing, segments: &[Segment], completed: bool) -> RunJson {
        let total = RunCost::of(p, run_id, segments);
        RunJson {
            run: run_id.to_owned(),
            capacity: p.capacity.to_string(),
            completed,
            segments: segments
                .iter()
                .map(|s| SegmentJson {
                    attempt: s.attempt,
                    ended: s.cause.clone(),
                    first_step: s.first_step,
                    last_step: s.last_step,
                    resumed_from: s.resumed_from,
                    checkpoint: s.last_checkpoint,
                    duration_s: s.duration().as_secs_f64(),
                    lost_s: s.lost.as_secs_f64(),
                    utilization: s.utilization,
                    mfu: s.mfu,
                    cost: s.event(run_id, p).cost,
                })
                .collect(),
            cost: total.cost,
            on_demand: total.on_demand.filter(|_| p.capacity != Capacity::OnDemand),
            preemptions: total.preemptions,
            lost_s: total.lost.as_secs_f64(),
        }
    }
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
        "mfu>",
        "cost>",
    ]);
    for s in segments {
        let e = s.event(run_id, p);
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
            mfu(s),
            usd(e.cost),
        ]);
    }
    writeln!(out, "Run {run_id}\n{t}")?;
    let total = RunCost::of(p, run_id, segments);
    write!(
        out,
        "{} segment(s), {} preemption(s), {:.1} minutes lost; cost {} ({})",
        segments.len(),
        total.preemptions,
        total.lost.as_secs_f64() / 60.0,
        usd(total.cost),
        p.capacity
    )?;
    match total.on_demand {
        Some(od) if p.capacity != Capacity::OnDemand => {
            writeln!(
                out,
                ", {} on demand (saved {})",
                usd(od),
                usd(od - total.cost)
            )?;
        }
        _ => writeln!(out)?,
    }
    for d in segments.iter().flat_map(|s| &s.diagnoses) {
        writeln!(out, "watchdog: {d}")?;
    }
    Ok(())
}
